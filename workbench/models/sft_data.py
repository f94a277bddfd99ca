"""Chat demonstrations -> token ids + loss masks for supervised fine-tuning.

A demonstration is a whole conversation (system/user/assistant/tool turns). Loss is taken
only on assistant tokens — each assistant turn's text *and* the `<|im_end|>` that closes it,
so the model learns both what to say and when to stop. The `<|im_start|>assistant\\n` header
and everything the user/environment wrote are context only.

Spans are found by rendering the chat template incrementally (prefix with generation prompt,
then prefix + the assistant turn): no string searching. The rendered text is then tokenized
in one piece and each token labelled by where it starts, so a BPE merge across a span
boundary cannot shift ids against what the model sees at inference.

Some templates rewrite history: Qwen3's drops the thinking of assistant turns before the
latest user query, so the context of turn k is not a prefix of turn k's own rendering as
the last turn. `encode_conversation` then starts a new sequence, so that every turn is
trained in exactly the context it is generated in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.types import Messages

IGNORE_INDEX = -100  # the label value torch's cross-entropy skips
Tools = list[dict[str, Any]] | None


@dataclass
class EncodedDemo:
    """One conversation as model inputs: ids, and labels with non-trained tokens = -100."""

    input_ids: list[int]
    labels: list[int]

    @property
    def num_trained(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


def encode_conversation(
    tokenizer: Any, messages: Messages, max_len: int, tools: Tools = None
) -> list[EncodedDemo]:
    """Tokenize a conversation into one sequence, or several when the template rewrites earlier
    turns; each assistant turn is trained (up to and including `<|im_end|>`) in exactly one."""
    segments: list[tuple[str, list[tuple[int, int]]]] = []
    text = ""
    spans: list[tuple[int, int]] = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prefix = _render(tokenizer, messages[:index], tools, add_generation_prompt=True)
        full = _render(tokenizer, messages[: index + 1], tools, add_generation_prompt=False)
        if not full.startswith(prefix):
            raise ValueError(
                "the chat template does not render an assistant turn after its generation prompt"
            )
        if not prefix.startswith(text):  # earlier turns rendered differently now: a new sequence
            segments.append((text, spans))
            spans = []
        turn = full[len(prefix) :]
        # The template closes a turn with "<|im_end|>\n": train through <|im_end|>, not the newline.
        end = turn.rfind(tokenizer.eos_token)
        spans.append((len(prefix), len(prefix) + (end + len(tokenizer.eos_token) if end >= 0 else len(turn))))
        text = full
    segments.append((text, spans))
    encoded = [_encode_spans(tokenizer, text, spans, max_len) for text, spans in segments if spans]
    if not encoded:
        raise ValueError("a demonstration needs at least one assistant message")
    return encoded


def encode_demonstration(
    tokenizer: Any, messages: Messages, max_len: int, tools: Tools = None
) -> EncodedDemo:
    """One sequence for a conversation. For a template that rewrites earlier turns this is the
    last of `encode_conversation`'s sequences (the final turns, in their full context)."""
    return encode_conversation(tokenizer, messages, max_len, tools)[-1]


def collate(batch: Sequence[EncodedDemo], pad_id: int) -> dict[str, Any]:
    """Right-pad a batch to its longest row (short rows => little wasted compute)."""
    import torch

    width = max(len(demo.input_ids) for demo in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, demo in enumerate(batch):
        length = len(demo.input_ids)
        input_ids[row, :length] = torch.tensor(demo.input_ids)
        labels[row, :length] = torch.tensor(demo.labels)
        attention_mask[row, :length] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def _encode_spans(tokenizer: Any, text: str, spans: list[tuple[int, int]], max_len: int) -> EncodedDemo:
    """Ids of `text`; a token is trained when it starts inside one of the character `spans`."""
    if getattr(tokenizer, "is_fast", False):
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(encoding["input_ids"])
        inside = [any(a <= start < b for a, b in spans) for start, _ in encoding["offset_mapping"]]
        labels = [token if trained else IGNORE_INDEX for token, trained in zip(ids, inside)]
    else:  # no offsets from a slow tokenizer: tokenize piece by piece (exact when pieces meet at specials)
        ids, labels, at = [], [], 0
        for a, b in spans:
            context, turn = _encode(tokenizer, text[at:a]), _encode(tokenizer, text[a:b])
            ids += context + turn
            labels += [IGNORE_INDEX] * len(context) + turn
            at = b
        tail = _encode(tokenizer, text[at:])
        ids += tail
        labels += [IGNORE_INDEX] * len(tail)
    return EncodedDemo(input_ids=ids[:max_len], labels=labels[:max_len])


def _render(tokenizer: Any, messages: Messages, tools: Tools, *, add_generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) if text else []
