"""Parsers turn a model's completion into the answer a rubric scores, and offer a format reward.

- `Parser`: the last assistant message's text, as is.
- `XMLParser(fields)`: `<field>...</field>` sections; the answer is `answer_field`.
- `ThinkParser`: drops a leading `<think>...</think>` block, then applies `extract_fn`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from workbench.types import Messages


def last_assistant_text(completion: Messages | str) -> str:
    """The text of the final assistant message ('' if there is none)."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion):
        if message.get("role") == "assistant":
            return message.get("content") or ""
    return ""


def assistant_texts(completion: Messages | str) -> list[str]:
    if isinstance(completion, str):
        return [completion]
    return [m.get("content") or "" for m in completion if m.get("role") == "assistant"]


class Parser:
    """The plain parser: the answer is the final assistant text, stripped."""

    def parse(self, text: str) -> Any:
        return text.strip()

    def parse_answer(self, completion: Messages | str) -> str | None:
        text = last_assistant_text(completion)
        return text.strip() if text.strip() else None

    def format_score(self, completion: Messages | str) -> float:
        """1.0 when every assistant message is well-formed for this parser."""
        return 1.0 if last_assistant_text(completion).strip() else 0.0

    def get_format_reward_func(self) -> Callable[..., float]:
        def format_reward(completion: Messages) -> float:
            return self.format_score(completion)

        return format_reward


class XMLParser(Parser):
    """Parses `<tag>content</tag>` fields. A field may list alternatives: ("answer", "result")."""

    def __init__(self, fields: list[str | tuple[str, ...]], answer_field: str | None = None) -> None:
        if not fields:
            raise ValueError("XMLParser needs at least one field")
        self.fields: list[tuple[str, ...]] = [(f,) if isinstance(f, str) else tuple(f) for f in fields]
        self.answer_field = answer_field or self.fields[-1][0]

    def parse(self, text: str, last: bool = True) -> SimpleNamespace:
        """A namespace with one attribute per field (canonical name); None when absent."""
        parsed: dict[str, str | None] = {}
        for names in self.fields:
            value = None
            for name in names:
                matches = re.findall(rf"<{re.escape(name)}>\s*(.*?)\s*</{re.escape(name)}>", text, re.DOTALL)
                if matches:
                    value = matches[-1] if last else matches[0]
                    break
            parsed[names[0]] = value
        return SimpleNamespace(**parsed)

    def parse_answer(self, completion: Messages | str) -> str | None:
        for text in reversed(assistant_texts(completion)):
            value = getattr(self.parse(text), self.answer_field, None)
            if value is not None:
                return value
        return None

    def format(self, **values: str) -> str:
        """Render fields as the model is expected to write them."""
        parts = []
        for names in self.fields:
            if names[0] in values:
                parts.append(f"<{names[0]}>\n{values[names[0]]}\n</{names[0]}>")
        return "\n".join(parts)

    def format_score(self, completion: Messages | str) -> float:
        """Share of assistant messages that contain every field exactly once, tags balanced."""
        texts = assistant_texts(completion)
        if not texts:
            return 0.0
        good = 0
        for text in texts:
            ok = True
            for names in self.fields:
                opened = sum(text.count(f"<{n}>") for n in names)
                closed = sum(text.count(f"</{n}>") for n in names)
                if opened != 1 or closed != 1:
                    ok = False
            good += ok
        return good / len(texts)


class ThinkParser(Parser):
    """For reasoning models: the answer comes after `</think>`; `extract_fn` post-processes it."""

    def __init__(self, extract_fn: Callable[[str], str] | None = None) -> None:
        self.extract_fn = extract_fn or (lambda text: text)

    def parse(self, text: str) -> str:
        if "</think>" in text:
            text = text.split("</think>")[-1]
        return self.extract_fn(text.strip())

    def parse_answer(self, completion: Messages | str) -> str | None:
        text = last_assistant_text(completion)
        if "<think>" in text and "</think>" not in text:
            return None  # still thinking when the budget ran out
        answer = self.parse(text)
        return answer or None

    def format_score(self, completion: Messages | str) -> float:
        texts = assistant_texts(completion)
        if not texts:
            return 0.0
        ok = [t.strip().startswith("<think>") and t.count("</think>") == 1 and bool(t.split("</think>")[-1].strip()) for t in texts]
        return sum(ok) / len(texts)
