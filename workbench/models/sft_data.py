"""Chat demonstrations -> token ids + loss masks for supervised fine-tuning.

A demonstration is a whole conversation (system/user/assistant/tool turns). Loss is taken
only on assistant tokens — each assistant turn's text *and* the `<|im_end|>` that closes it,
so the model learns both what to say and when to stop. The `<|im_start|>assistant\\n` header
and everything the user/environment wrote are context only.

Spans are found by rendering the chat template incrementally (prefix with generation prompt,
then prefix + the assistant turn): no string searching, and it works for any template whose
tokenization is prefix-stable (true for the byte tokenizer: one token per byte).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.types import Messages

IGNORE_INDEX = -100  # the label value torch's cross-entropy skips


@dataclass
class EncodedDemo:
    """One conversation as model inputs: ids, and labels with non-trained tokens = -100."""

    input_ids: list[int]
    labels: list[int]

    @property
    def num_trained(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


def encode_demonstration(tokenizer: Any, messages: Messages, max_len: int) -> EncodedDemo:
    """Tokenize a conversation; labels cover assistant turns up to and including `<|im_end|>`."""
    ids: list[int] = []
    labels: list[int] = []
    rendered_upto = ""
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prefix = _render(tokenizer, messages[:index], add_generation_prompt=True)
        full = _render(tokenizer, messages[: index + 1], add_generation_prompt=False)
        if not prefix.startswith(rendered_upto) or not full.startswith(prefix):
            raise ValueError("chat template is not prefix-stable; cannot mask assistant turns")
        context_ids = _encode(tokenizer, prefix[len(rendered_upto) :])
        turn_text = full[len(prefix) :]
        # The template closes a turn with "<|im_end|>\n": train through <|im_end|>, not the newline.
        end = turn_text.rfind(tokenizer.eos_token) + len(tokenizer.eos_token)
        turn_ids = _encode(tokenizer, turn_text[:end])
        trailer_ids = _encode(tokenizer, turn_text[end:])
        ids += context_ids + turn_ids + trailer_ids
        labels += [IGNORE_INDEX] * len(context_ids) + turn_ids + [IGNORE_INDEX] * len(trailer_ids)
        rendered_upto = full
    if not ids:
        raise ValueError("a demonstration needs at least one assistant message")
    return EncodedDemo(input_ids=ids[:max_len], labels=labels[:max_len])


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


def _render(tokenizer: Any, messages: Messages, *, add_generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) if text else []
