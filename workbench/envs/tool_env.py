"""`ToolEnv`: the model calls plain Python functions as tools until it answers without a call.

A tool's OpenAI schema comes from its type hints and docstring (first paragraph = description,
`name: text` lines under `Args:` = parameter descriptions). A tool that raises returns the error
to the model as the tool message and is counted in `state["tool_errors"]`; the run goes on.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

from workbench.envs.multiturn import MultiTurnEnv
from workbench.types import Messages, State

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean",
                               list: "array", dict: "object"}


def _json_type(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_type(options[0]) if len(options) == 1 else {}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(annotation))}
    if origin in (list, Sequence):
        args = typing.get_args(annotation)
        return {"type": "array", "items": _json_type(args[0]) if args else {}}
    if origin is dict:
        return {"type": "object"}
    return {"type": _JSON_TYPES[annotation]} if annotation in _JSON_TYPES else {}


def _docstring_parts(func: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    doc = inspect.getdoc(func) or ""
    description = doc.split("\n\n")[0].replace("\n", " ").strip()
    arg_docs: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        if re.match(r"^\s*(Args|Arguments|Parameters):\s*$", line):
            in_args = True
            continue
        if in_args:
            match = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.+)$", line)
            if match:
                arg_docs[match.group(1)] = match.group(2).strip()
            elif line.strip() and not line.startswith((" ", "\t")):
                in_args = False
    return description, arg_docs


def tool_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI function-tool schema of a plain Python function."""
    hints = typing.get_type_hints(func)
    description, arg_docs = _docstring_parts(func)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(func).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        prop = _json_type(hints.get(name, str))
        if name in arg_docs:
            prop["description"] = arg_docs[name]
        properties[name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(name)
    return {
        "type": "function",
        "function": {
            "name": func.__name__,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


class ToolEnv(MultiTurnEnv):
    """Multi-turn environment whose environment turns are tool results."""

    def __init__(self, tools: Sequence[Callable[..., Any]] = (), *, max_turns: int = 10,
                 max_tool_output_chars: int = 4000, **kwargs) -> None:  # kwargs: Environment's named arguments
        super().__init__(max_turns=max_turns, **kwargs)
        self.tools = {t.__name__: t for t in tools}
        self._schemas = [tool_schema(t) for t in tools]
        # Long tool outputs blow up the context of small models; the model sees a truncated copy.
        self.max_tool_output_chars = max_tool_output_chars

    @property
    def oai_tools(self) -> list[dict[str, Any]] | None:
        return self._schemas or None

    def setup_state(self, state: State) -> None:
        state["tool_calls"] = 0
        state["tool_errors"] = 0

    async def is_completed(self, messages: Messages, state: State) -> bool:
        return not messages[-1].get("tool_calls")

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if name not in self.tools:
            raise KeyError(f"unknown tool '{name}' (available: {', '.join(self.tools)})")
        func = self.tools[name]
        if inspect.iscoroutinefunction(func):
            result = await func(**arguments)
        else:  # sync tools may block (files, subprocesses): keep them off the event loop
            result = await asyncio.to_thread(func, **arguments)
        return str(result)

    async def env_response(self, messages: Messages, state: State) -> Messages:
        replies: Messages = []
        for call in messages[-1].get("tool_calls") or []:
            function = call.get("function", {})
            state["tool_calls"] += 1
            try:
                raw_args = function.get("arguments") or "{}"
                arguments = json.loads(raw_args) if isinstance(raw_args, str) else dict(raw_args)
                if not isinstance(arguments, dict):
                    raise TypeError("tool arguments must be a JSON object")
                content = await self.call_tool(function.get("name", ""), arguments)
            except Exception as exc:  # the model made a bad call: tell it, keep going
                state["tool_errors"] += 1
                content = f"Error: {type(exc).__name__}: {exc}"
            if len(content) > self.max_tool_output_chars:
                content = content[: self.max_tool_output_chars] + "\n[output truncated]"
            replies.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": content})
        return replies
