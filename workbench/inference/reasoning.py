"""Reasoning parsers: split a thinking model's `<think>…</think>` out of its reply.

With a parser set, an assistant message carries the thinking in `reasoning_content` and only
the answer in `content`, so parsers, rubrics and tool-call parsing see the answer, never the
thinking. Token ids and logprobs are not touched: RL trains on everything that was sampled.

`split_reasoning` follows vLLM's `--reasoning-parser` of the same name (vllm/reasoning/):

- both: text up to and including the first `<think>` is dropped (the opening tag, which a
  model may or may not generate); with `</think>` present, what precedes it is the reasoning
  and what follows is the content.
- `deepseek_r1`: no `</think>` → the whole text is reasoning (R1's template opens the block
  in the prompt, so a reply without `</think>` was cut mid-thought).
- `qwen3`: no `</think>` → reasoning only when the block was open: `<think>` in the text, or
  in the prompt (`prompt_open`: Qwen3-Thinking-2507/Qwen3.5 templates end the prompt with
  `<think>\\n`); otherwise the model did not think and it is all content. vLLM moved here in
  steps: ≤0.10 needed both tags; then "no `</think>` → content"; current main reads the
  prompt's state (`set_prompt_token_ids`) where older releases guessed from
  `enable_thinking`. Reading the prompt is what keeps a non-thinking reply (thinking switched
  off, an instruct model that shares Qwen3's vocabulary) scored as the answer it is.

One deliberate difference: newlines around the block are dropped (reasoning `.strip("\\n")`,
content `.lstrip("\\n")`), as Qwen3's own chat template does when it re-renders a turn; vLLM
returns `"\\n\\nanswer"`. `OpenAIClient` normalises server-split replies the same way, so every
inference path yields the same message. vLLM's newest qwen3 parser also ends reasoning at a
`<tool_call><function=…` (Qwen3.5's XML tool format); Hermes JSON tool calls never match that,
so it is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

REASONING_PARSERS: tuple[str, ...] = ("qwen3", "deepseek_r1")
ReasoningParserName = Literal["qwen3", "deepseek_r1"]
THINK_START = "<think>"
THINK_END = "</think>"


def check_reasoning_parser(name: str | None) -> str | None:
    """`name` when it is a known parser (or None); ValueError naming the choices otherwise."""
    if name is not None and name not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser '{name}' (choose {' or '.join(REASONING_PARSERS)})")
    return name


def split_reasoning(text: str, parser: str, *, prompt_open: bool = False) -> tuple[str | None, str]:
    """(reasoning, content) of a generated `text` under `parser` (see the module doc).
    Reasoning is None when there is none (or it is empty); content is '' when there is none.
    `prompt_open`: the prompt ended inside an unclosed `<think>` block (qwen3 only)."""
    check_reasoning_parser(parser)
    _, opened, rest = text.partition(THINK_START)
    body = rest if opened else text
    if THINK_END in body:
        reasoning, _, content = body.partition(THINK_END)
        return reasoning.strip("\n") or None, content.lstrip("\n")
    if parser == "deepseek_r1" or opened or prompt_open:
        return body.strip("\n") or None, ""  # cut mid-thought: nothing of it is an answer
    return None, text


def think_token_ids(tokenizer: Any) -> tuple[int, int] | None:
    """Ids of `<think>` and `</think>` when the vocabulary has each as one token, else None."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, NotImplementedError, TypeError):
        return None
    start, end = vocab.get(THINK_START), vocab.get(THINK_END)
    return (start, end) if isinstance(start, int) and isinstance(end, int) else None


def resolve_reasoning_parser(setting: str | None, tokenizer: Any) -> str | None:
    """The parser for `setting`: "auto" is qwen3 when the tokenizer has `<think>` and `</think>`
    as single tokens (Qwen3, QwQ, DeepSeek-R1 distills, ...), else none; a name is itself."""
    if setting == "auto":
        return "qwen3" if think_token_ids(tokenizer) is not None else None
    return check_reasoning_parser(setting)


def prompt_ends_in_thinking(prompt_ids: Sequence[int], think_ids: tuple[int, int] | None) -> bool:
    """Whether the prompt leaves a `<think>` block open (the last think tag in it is `<think>`),
    as vLLM's `is_reasoning_end` reads a prompt."""
    if think_ids is None:
        return False
    start, end = think_ids
    for token in reversed(prompt_ids):
        if token == start:
            return True
        if token == end:
            return False
    return False


def reasoning_message(text: str, parser: str | None, *, prompt_open: bool = False) -> dict[str, Any]:
    """An assistant message for generated `text`: `content`, plus `reasoning_content` when
    `parser` finds thinking."""
    if parser is None:
        return {"role": "assistant", "content": text}
    reasoning, content = split_reasoning(text, parser, prompt_open=prompt_open)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message
