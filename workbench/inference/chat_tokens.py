"""Tokens in, tokens out: continue a multi-turn conversation from the exact ids already sampled.

Re-rendering a whole conversation through the chat template each turn and tokenizing it again
does not give back the ids the model sampled: a BPE tokenizer may merge the sampled tokens
differently ("he" + "llo" comes back as "hello"), and thinking models' templates (Qwen3) strip
earlier turns' `<think>` blocks. A trainer that trains on the re-rendered ids trains on tokens
no sampler produced. Instead, turn k+1's prompt is turn k's prompt ids + its sampled ids + the
ids of what the template writes for the environment's new messages and the next generation
prompt (`continuation_ids`). The sequence a trainer sees is then exactly the one the sampler saw.

`continuation_ids` renders the new messages after a stand-in conversation whose assistant turn
holds a sentinel, and keeps the text after that turn's end-of-turn marker. The end-of-turn
marker is a special token, so tokenizing the continuation on its own gives the same ids as
tokenizing it in place. (Simplification: a template whose rendering of the new messages depends
on the earlier messages' text - none of the common ones - would see the stand-in's.)
"""

from __future__ import annotations

from typing import Any

from workbench.types import Messages

# Unlikely to be produced by a template or a user: invisible separators around a name.
_SENTINEL = "\u2063workbench-continuation\u2063"


class ContinuationError(ValueError):
    """The chat template cannot be continued by tokens (no end-of-turn marker after a turn)."""


def prompt_ids(
    tokenizer: Any,
    messages: Messages,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of `messages` under the chat template, ready for the assistant's turn. Call with
    the tokenizer guarded against concurrent use."""
    text = tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
    )
    # The template already wrote any BOS it wants; don't let the tokenizer add another.
    return list(tokenizer.encode(text, add_special_tokens=False))


def end_of_turn(tokenizer: Any) -> tuple[str, int]:
    """The marker that closes an assistant turn (`<|im_end|>` for ChatML): the tokenizer's eos."""
    text = tokenizer.eos_token
    token_id = tokenizer.convert_tokens_to_ids(text) if text else None
    if not isinstance(text, str) or not isinstance(token_id, int):
        raise ContinuationError("the tokenizer names no eos token to end an assistant turn")
    return text, token_id


def continuation_text(
    tokenizer: Any, new_messages: Messages, tools: list[dict[str, Any]] | None = None
) -> str:
    """What the chat template writes after an assistant turn's end-of-turn marker for
    `new_messages`, followed by the generation prompt for the next assistant turn."""
    eos_text, _ = end_of_turn(tokenizer)
    stand_in = [{"role": "user", "content": "."}, {"role": "assistant", "content": _SENTINEL}]
    text = tokenizer.apply_chat_template(
        stand_in + list(new_messages), tools=tools or None, tokenize=False, add_generation_prompt=True
    )
    at = text.find(_SENTINEL)
    end = text.find(eos_text, at) if at >= 0 else -1
    if end < 0:
        raise ContinuationError(f"the chat template does not close an assistant turn with {eos_text}")
    return text[end + len(eos_text) :]


def continuation_ids(
    tokenizer: Any,
    previous_completion: list[int],
    new_messages: Messages,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Ids to append to a turn's prompt + sampled ids before the next turn is generated: the
    end-of-turn token when the sampler stopped without it (a stop string), then the template's
    continuation. Call with the tokenizer guarded against concurrent use."""
    _, eos_id = end_of_turn(tokenizer)
    closing = [] if previous_completion and previous_completion[-1] == eos_id else [eos_id]
    return closing + tokenizer.encode(
        continuation_text(tokenizer, new_messages, tools), add_special_tokens=False
    )
