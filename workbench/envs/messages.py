"""Chat messages that are plain dicts *and* answer attribute access (`m.content`, `m.role`).

Workbench's engine, clients and JSON writers work on OpenAI-style dict messages. Environments
written for `verifiers` read messages as objects (`m.content`, `m.tool_calls[0].name`), and one
that does so against a plain dict fails (an AttributeError inside a reward function scores 0
without a word). These classes are `dict` subclasses, so they are usable wherever a dict message
is, and also answer attribute access, so code in either style works.

Environment code receives these (`env_response` messages, `state["prompt"]`, `state["completion"]`,
rewards' `prompt`/`completion`); clients and on-disk records get plain dicts (`plain_messages`), so
a chat template never sees an attribute that the message does not really have.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar


class ToolCall(dict[str, Any]):
    """One tool call, stored in OpenAI form (`{"id", "type", "function": {"name", "arguments"}}`).

    `verifiers` spells a tool call flat (`call.id`, `call.name`, `call.arguments`); both spellings
    are accepted when building one and both answer when reading it, so
    `ToolCall(id="c1", name="add", arguments='{"a": 1}')` and
    `call["function"]["name"] == call.name` hold.
    """

    __slots__ = ()

    def __init__(self, data: Mapping[str, Any] | None = None, /, **fields: Any) -> None:
        raw = {**(data or {}), **fields}
        function = dict(raw.pop("function", None) or {})
        for key in ("name", "arguments"):
            if key in raw:
                function[key] = raw.pop(key)
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):  # a dict given by hand: keep the wire form a JSON string
            arguments = json.dumps(arguments)
        super().__init__(
            id=raw.pop("id", ""),
            type=raw.pop("type", "function"),
            function={"name": function.get("name", ""), "arguments": arguments},
            **raw,
        )

    @property
    def name(self) -> str:
        return self["function"]["name"]

    @property
    def arguments(self) -> str:
        return self["function"]["arguments"]

    def __missing__(self, key: str) -> Any:
        if key in ("name", "arguments"):  # `call["name"]`, as verifiers' tool calls allow
            return self["function"][key]
        raise KeyError(key)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"ToolCall has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


class ChatMessage(dict[str, Any]):
    """A chat message: a dict whose keys also read and write as attributes.

    A field the message does not have raises AttributeError, except the optional fields of its
    role (`OPTIONAL`), which read as None, as they do on verifiers' message models (an assistant
    message without tool calls has `m.tool_calls is None`).
    """

    __slots__ = ()
    ROLE: ClassVar[str | None] = None
    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    def __init__(self, data: Mapping[str, Any] | None = None, /, **fields: Any) -> None:
        raw = {**(data or {}), **fields}
        role = raw.pop("role", self.ROLE)
        if self.ROLE is not None and role != self.ROLE:
            raise ValueError(f"{type(self).__name__} has role {self.ROLE!r}, not {role!r}")
        if role is None:
            raise ValueError("a chat message needs a role")
        if raw.get("tool_calls") is not None:
            raw["tool_calls"] = [c if isinstance(c, ToolCall) else ToolCall(c) for c in raw["tool_calls"]]
        super().__init__(role=role, **raw)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy/pickle probe for hooks: never invent them
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            if name in self.OPTIONAL:
                return None
            raise AttributeError(f"{type(self).__name__} has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))


class SystemMessage(ChatMessage):
    __slots__ = ()
    ROLE = "system"


class UserMessage(ChatMessage):
    __slots__ = ()
    ROLE = "user"


class AssistantMessage(ChatMessage):
    __slots__ = ()
    ROLE = "assistant"
    OPTIONAL = ("content", "reasoning_content", "tool_calls")


class ToolMessage(ChatMessage):
    __slots__ = ()
    ROLE = "tool"
    OPTIONAL = ("tool_call_id",)


_BY_ROLE: dict[str, type[ChatMessage]] = {
    "system": SystemMessage,
    "user": UserMessage,
    "assistant": AssistantMessage,
    "tool": ToolMessage,
}


def as_message(message: Mapping[str, Any] | Any) -> ChatMessage:
    """`message` as the ChatMessage of its role (itself when it already is one).

    Accepts a dict or any object with `role`/`content` attributes (a pydantic message model);
    its fields are copied, never shared, except the values themselves.
    """
    if isinstance(message, ChatMessage):
        return message
    if not isinstance(message, Mapping):
        dump = getattr(message, "model_dump", None)
        if callable(dump):
            message = {k: v for k, v in dump().items() if v is not None or k == "content"}
        elif hasattr(message, "role"):
            message = {k: v for k, v in vars(message).items() if not k.startswith("_")}
        else:
            raise TypeError(f"not a chat message: {type(message).__name__}")
    cls = _BY_ROLE.get(str(message.get("role")), ChatMessage)
    return cls(message)


_SIMPLE_ROLES: dict[str, type[ChatMessage]] = {
    "system": SystemMessage,
    "user": UserMessage,
    "assistant": AssistantMessage,
    "tool": ToolMessage,
}


def as_messages(messages: Iterable[Mapping[str, Any] | Any]) -> list[ChatMessage]:
    """A new list of `messages`, each as a ChatMessage (`as_message`). The usual message (a plain
    dict, `role` first, no tool calls) is copied directly, at a fraction of `as_message`'s cost:
    the engine converts each rollout's prompt and completion this way several times."""
    out: list[ChatMessage] = []
    for message in messages:
        role = message.get("role") if type(message) is dict else None  # exactly a dict: no subclass, no model
        cls = _SIMPLE_ROLES.get(role) if isinstance(role, str) else None
        if cls is None or "tool_calls" in message or next(iter(message)) != "role":
            out.append(as_message(message))
            continue
        # What ChatMessage.__init__ builds for such a message (the same keys, in the same order,
        # copied), without its generic argument handling.
        fresh = dict.__new__(cls)
        dict.update(fresh, message)
        out.append(fresh)
    return out


def plain(value: Any) -> Any:
    """`value` with every ChatMessage/ToolCall inside turned back into a plain dict."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def plain_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Plain-dict copies of `messages`, for clients, chat templates and records."""
    return [plain(m) for m in messages]
