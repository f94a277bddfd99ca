"""Parsers turn a model's completion into the answer a rubric scores, and offer a format reward.

- `Parser(extract_fn=None)`: the final assistant text; `extract_fn(text)` when given.
- `XMLParser(fields, answer_field=...)`: `<field>...</field>` sections; the answer is one field.
- `ThinkParser(extract_fn=None)`: the text after `</think>`, then `extract_fn`.
- `MaybeThinkParser(extract_fn=None)`: the same, for models that may or may not think aloud.

Names, constructors and helpers (`get_assistant_messages`, `get_format_reward_func`, ...) follow
verifiers' classic parsers, so an environment written for it ports by changing its import.
Messages may be plain dicts, dict subclasses, or objects with attributes (`m.role`), and content
may be a string or a list of OpenAI content parts: every helper here reads all of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from workbench.types import Messages

ExtractFn = Callable[[str], str]


def message_field(message: object, name: str, default: object = None) -> Any:
    """`message[name]` for dict messages, `message.name` for message objects (e.g. pydantic)."""
    if isinstance(message, dict):
        return message.get(name, default)
    return getattr(message, name, default)


def content_text(content: object) -> str:
    """Message content as text: a string as is; the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        chunks = [
            message_field(part, "text") for part in content if message_field(part, "type", "text") == "text"
        ]
        return " ".join(c for c in chunks if isinstance(c, str)).strip()
    return ""


def messages_with_role(messages: Messages | str, role: str) -> Messages:
    """The messages of one role, in order ([] for a plain-text completion)."""
    if isinstance(messages, str):
        return []
    return [m for m in messages if message_field(m, "role") == role]


def assistant_texts(completion: Messages | str) -> list[str]:
    """The text of every assistant message (a plain-text completion is one)."""
    if isinstance(completion, str):
        return [completion]
    return [content_text(message_field(m, "content")) for m in messages_with_role(completion, "assistant")]


def last_assistant_text(completion: Messages | str) -> str:
    """The text of the final assistant message ('' if there is none)."""
    texts = assistant_texts(completion)
    return texts[-1] if texts else ""


class Parser:
    """The plain parser: the answer is the final assistant text, stripped, or `extract_fn(text)`."""

    # A class attribute too, so subclasses that skip `super().__init__` still parse.
    extract_fn: ExtractFn | None = None

    def __init__(self, extract_fn: ExtractFn | None = None) -> None:
        self.extract_fn = extract_fn

    def parse(self, text: str) -> Any:
        return self.extract_fn(text) if self.extract_fn is not None else text.strip()

    def parse_answer(self, completion: Messages | str) -> str | None:
        """The parsed final assistant message; None when there is none or it parses to ''."""
        if not isinstance(completion, str) and not self.get_assistant_messages(completion):
            return None
        answer = self.parse(last_assistant_text(completion))
        return None if answer is None or answer == "" else answer

    def get_assistant_messages(self, messages: Messages | str) -> Messages:
        return messages_with_role(messages, "assistant")

    def get_user_messages(self, messages: Messages | str) -> Messages:
        return messages_with_role(messages, "user")

    def get_system_messages(self, messages: Messages | str) -> Messages:
        return messages_with_role(messages, "system")

    def get_tool_messages(self, messages: Messages | str) -> Messages:
        return messages_with_role(messages, "tool")

    def format_score(self, completion: Messages | str) -> float:
        """1.0 when the completion is well-formed for this parser (here: a non-empty answer)."""
        return 1.0 if last_assistant_text(completion).strip() else 0.0

    def get_format_reward_func(self) -> Callable[..., float]:
        """A reward function scoring `format_score`; add it with weight 0 to log it as a metric."""

        def format_reward(completion: Messages | str) -> float:
            return self.format_score(completion)

        return format_reward


def _field_alternatives(fields: Sequence[str | tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Validated fields: each a tuple whose first name is the canonical one."""
    if not fields:
        raise ValueError("XMLParser needs at least one field")
    result: list[tuple[str, ...]] = []
    for field in fields:
        names = (field,) if isinstance(field, str) else tuple(field)
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"XMLParser field {field!r}: expected a tag name or a tuple of tag names")
        if names[0] in {r[0] for r in result}:
            raise ValueError(f"XMLParser: duplicate field '{names[0]}'")
        result.append(names)
    return result


class XMLParser(Parser):
    """Parses `<tag>content</tag>` fields. A field may list alternatives: ("answer", "result").

    The answer is `answer_field`: by default "answer" when a field offers it (as in verifiers),
    else the last field.
    """

    def __init__(
        self,
        fields: Sequence[str | tuple[str, ...]],
        answer_field: str | None = None,
        extract_fn: ExtractFn | None = None,
    ) -> None:
        super().__init__(extract_fn)  # kept for verifiers' signature; fields are returned as written
        self.fields = _field_alternatives(fields)
        offered = {name for names in self.fields for name in names}
        self.answer_field = answer_field or ("answer" if "answer" in offered else self.fields[-1][0])

    def get_fields(self) -> list[str]:
        """The canonical field names, in order."""
        return [names[0] for names in self.fields]

    def parse(self, text: str, strip: bool = True, last: bool = True) -> SimpleNamespace:
        """A namespace with an attribute per tag name (None when absent): each alternative gets its
        own match, the canonical name the first alternative found. `last`: the last occurrence."""
        found: dict[str, str | None] = {}
        for names in self.fields:
            for name in names:
                matches = re.findall(rf"<{re.escape(name)}>\s*(.*?)\s*</{re.escape(name)}>", text, re.DOTALL)
                value = (matches[-1] if last else matches[0]) if matches else None
                found[name] = value.strip() if value is not None and strip else value
            found[names[0]] = next((found[n] for n in names if found[n] is not None), None)
        return SimpleNamespace(**found)

    def parse_answer(self, completion: Messages | str) -> str | None:
        """`answer_field` from the last assistant message that has it."""
        for text in reversed(assistant_texts(completion)):
            value = getattr(self.parse(text), self.answer_field, None)
            if value is not None:
                return value
        return None

    def format(self, **values: str) -> str:
        """Render fields as the model is expected to write them (a value may use any alternative)."""
        parts = []
        for names in self.fields:
            value = next((values[n] for n in names if n in values), None)
            if value is not None:
                parts.append(f"<{names[0]}>\n{value}\n</{names[0]}>")
        return "\n".join(parts)

    def get_format_str(self) -> str:
        """The expected layout, for a system prompt: `<a>\\n...\\n</a>` per field."""
        tags = [names[0] if len(names) == 1 else "[ " + " | ".join(names) + " ]" for names in self.fields]
        return "\n".join(f"<{tag}>\n...\n</{tag}>" for tag in tags)

    def format_score(self, completion: Messages | str) -> float:
        """Share of assistant messages that contain every field exactly once, tags balanced."""
        texts = assistant_texts(completion)
        if not texts:
            return 0.0
        good = 0
        for text in texts:
            good += all(
                sum(text.count(f"<{n}>") for n in names) == 1
                and sum(text.count(f"</{n}>") for n in names) == 1
                for names in self.fields
            )
        return good / len(texts)


def after_think(text: str) -> str:
    """The text after the last `</think>` (all of it when there is none), stripped."""
    return text.split("</think>")[-1].strip()


class ThinkParser(Parser):
    """For reasoning models: the answer comes after `</think>`; `extract_fn` post-processes it.
    A reply whose `<think>` never closed has no answer (the budget ran out mid-thought)."""

    def parse(self, text: str) -> str:
        rest = after_think(text)
        return self.extract_fn(rest) if self.extract_fn is not None else rest

    def parse_answer(self, completion: Messages | str) -> str | None:
        text = last_assistant_text(completion)
        if "<think>" in text and "</think>" not in text:
            return None
        return super().parse_answer(completion)

    def format_score(self, completion: Messages | str) -> float:
        """Share of assistant messages shaped `<think>...</think> answer` (one block, an answer).
        A message whose thinking a reasoning parser already moved to `reasoning_content` has
        that shape when its content is an answer with no think tags left in it."""
        messages = (
            [completion] if isinstance(completion, str) else messages_with_role(completion, "assistant")
        )
        if not messages:
            return 0.0
        return sum(_think_shaped(m) for m in messages) / len(messages)


def _think_shaped(message: object) -> bool:
    if isinstance(message, str):
        text, thinking = message, None
    else:
        text, thinking = (
            content_text(message_field(message, "content")),
            message_field(message, "reasoning_content"),
        )
    if thinking:
        return "<think>" not in text and "</think>" not in text and bool(text.strip())
    return (
        text.strip().startswith("<think>")
        and text.count("<think>") == 1
        and text.count("</think>") == 1
        and bool(after_think(text))
    )


class MaybeThinkParser(Parser):
    """For models that may or may not think aloud: drops a `<think>` block when there is one."""

    def parse(self, text: str) -> str:
        rest = after_think(text)
        return self.extract_fn(rest) if self.extract_fn is not None else rest
