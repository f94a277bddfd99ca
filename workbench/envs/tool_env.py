"""`ToolEnv`: the model calls plain Python functions as tools until it answers without a call.

A tool's OpenAI schema comes from its type hints and Google-style docstring (the text before
`Args:` = description, `name: text` lines under `Args:` = parameter descriptions), by transformers'
`get_json_schema`, the converter chat templates are written for. A tool that raises returns the error
to the model as the tool message and is counted in `state["tool_errors"]`; the run goes on.

As verifiers' ToolEnv (its `ToolMonitorRubric`), every rollout is scored with the metrics
`total_tool_calls` and `<tool>_calls` for each tool (weight 0: logged, never in the reward): a
member rubric next to the env's own, kept in step with `add_tool`/`remove_tool`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import typing
from collections.abc import Callable, Sequence
from typing import Any

from transformers.utils import get_json_schema
from transformers.utils.chat_template_utils import (
    DocstringParsingException,
    TypeHintParsingException,
    parse_google_format_docstring,
)

from workbench.envs.messages import ToolMessage
from workbench.envs.multiturn import MultiTurnEnv
from workbench.envs.rubric import Rubric
from workbench.envs.rubric_group import RubricGroup
from workbench.errors import UserError
from workbench.types import Messages, State

_UNDOCUMENTED = "(undocumented)"  # stands in for a missing description, removed afterwards


def tool_schema(func: Callable[..., Any], hidden: Sequence[str] = ()) -> dict[str, Any]:
    """The OpenAI function-tool schema of a plain Python function: transformers' `get_json_schema`.

    As in verifiers, a tool needs neither a docstring nor a description of every argument, and an
    argument without a type hint is a string; `*args`/`**kwargs` and the `hidden` arguments (filled
    in by the environment) are not offered to the model. A type hint with no JSON form (a custom
    class) is a `UserError` naming the tool.
    """
    name = getattr(func, "__name__", "tool")
    try:
        schema = get_json_schema(_documented_stand_in(func, hidden))
    except (TypeHintParsingException, DocstringParsingException) as exc:
        raise UserError(f"tool '{name}': {str(exc).splitlines()[0]}") from exc
    function = schema["function"]
    function.pop("return", None)  # the model never writes it; kept out of the prompt, as before
    if function["description"] == _UNDOCUMENTED:
        function["description"] = ""
    parameters = function["parameters"]
    parameters.setdefault("required", [])
    for prop in parameters["properties"].values():
        if prop.get("description") == _UNDOCUMENTED:
            del prop["description"]
    return schema


def _documented_stand_in(func: Callable[..., Any], hidden: Sequence[str]) -> Callable[..., Any]:
    """A function with `func`'s name, description and offered parameters, every one typed and
    documented (placeholders where `func` is not), which is what `get_json_schema` insists on."""
    summary, arg_docs, _ = parse_google_format_docstring(inspect.getdoc(func) or "")
    hints = typing.get_type_hints(func)
    params = [
        param.replace(annotation=hints.get(param.name, str))
        for param in inspect.signature(func).parameters.values()
        if param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD) and param.name not in hidden
    ]
    doc = summary or _UNDOCUMENTED
    if params:
        doc += "\n\nArgs:\n" + "".join(
            f"    {param.name}: {(arg_docs or {}).get(param.name) or _UNDOCUMENTED}\n" for param in params
        )

    def stand_in() -> None:
        """Never called: get_json_schema reads only its signature and docstring."""

    stand_in.__name__ = getattr(func, "__name__", "tool")
    stand_in.__doc__ = doc
    stand_in.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    stand_in.__annotations__ = {param.name: param.annotation for param in params}
    return stand_in


class ToolEnv(MultiTurnEnv):
    """Multi-turn environment whose environment turns are tool results.

    `tools` is a list of functions (`self.tools`; `self.tool_map` by name), as in verifiers.
    `error_formatter` turns a tool's exception into the text the model sees; `stop_errors` lists
    exception types that end the rollout with an error instead of going back to the model.
    """

    def __init__(
        self,
        tools: Sequence[Callable[..., Any]] | None = None,
        *,
        max_turns: int = 10,
        max_tool_output_chars: int = 4000,
        error_formatter: Callable[[Exception], str] | None = None,
        stop_errors: Sequence[type[Exception]] | None = None,
        **kwargs: Any,
    ) -> None:  # kwargs: Environment's named arguments
        if kwargs.get("tool_defs"):
            raise TypeError("ToolEnv builds its tool definitions from `tools`; do not pass tool_defs")
        super().__init__(max_turns=max_turns, **kwargs)
        self.tools: list[Callable[..., Any]] = []
        self.tool_map: dict[str, Callable[..., Any]] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        # verifiers' tool metrics, as a member of its own: the env's rubric object is not changed.
        self.tool_monitor_rubric = Rubric()
        self.tool_monitor_rubric.add_metric(total_tool_calls)
        self.rubric = RubricGroup([self.rubric, self.tool_monitor_rubric])
        for tool in tools or ():  # not via add_tool: a subclass may override it with more arguments
            self._register(tool, tool_schema(tool))
        # Long tool outputs blow up the context of small models; the model sees a truncated copy.
        self.max_tool_output_chars = max_tool_output_chars
        self.error_formatter = error_formatter or (lambda exc: f"Error: {type(exc).__name__}: {exc}")
        self.stop_errors: tuple[type[Exception], ...] = tuple(stop_errors or ())

    def add_tool(self, tool: Callable[..., Any]) -> None:
        self._register(tool, tool_schema(tool))

    def remove_tool(self, tool: Callable[..., Any]) -> None:
        self.tools.remove(tool)
        self.tool_map.pop(tool.__name__, None)
        self._schemas.pop(tool.__name__, None)
        monitor = self.tool_monitor_rubric
        for index, func in enumerate(monitor.funcs):
            if func.__name__ == f"{tool.__name__}_calls":
                del monitor.funcs[index], monitor.weights[index]
                break

    def _register(self, tool: Callable[..., Any], schema: dict[str, Any]) -> None:
        name = tool.__name__
        if name in self.tool_map:
            raise ValueError(f"two tools are named '{name}'")
        self.tools.append(tool)
        self.tool_map[name] = tool
        self._schemas[name] = schema
        self.tool_monitor_rubric.add_metric(tool_call_counter(name))

    @property
    def oai_tools(self) -> list[dict[str, Any]] | None:
        return list(self._schemas.values()) or None

    async def setup_state(self, state: State, **kwargs: Any) -> State:
        state["tool_calls"] = 0
        state["tool_errors"] = 0
        return state

    async def is_completed(self, messages: Messages, state: State) -> bool:
        return not messages[-1].get("tool_calls")

    async def call_tool(
        self, tool_name: str, tool_args: dict[str, Any], tool_call_id: str = "", **kwargs: Any
    ) -> str:
        """Run one tool; its result as text. (verifiers' signature; `tool_call_id` is unused here.)"""
        if tool_name not in self.tool_map:
            raise KeyError(f"unknown tool '{tool_name}' (available: {', '.join(self.tool_map)})")
        func = self.tool_map[tool_name]
        if inspect.iscoroutinefunction(func):
            result = await func(**tool_args)
        else:  # sync tools may block (files, subprocesses): keep them off the event loop
            result = await asyncio.to_thread(func, **tool_args)
        return str(result)

    def prepare_tool_args(
        self, tool_name: str, tool_args: dict[str, Any], messages: Messages, state: State
    ) -> dict[str, Any]:
        """Hook between parsing a call and running it (StatefulToolEnv injects arguments here).
        An exception here is an environment error: it ends the rollout."""
        return tool_args

    async def env_response(self, messages: Messages, state: State, **kwargs: Any) -> Messages:
        replies: Messages = []
        for call in messages[-1].get("tool_calls") or []:
            function = call.get("function", {})
            name = function.get("name", "")
            state["tool_calls"] = state.get("tool_calls", 0) + 1
            try:
                raw_args = function.get("arguments") or "{}"
                arguments = json.loads(raw_args) if isinstance(raw_args, str) else dict(raw_args)
                if not isinstance(arguments, dict):
                    raise TypeError("tool arguments must be a JSON object")
            except Exception as exc:  # the model wrote a bad call: tell it, keep going
                replies.append(self._tool_error(exc, call, state))
                continue
            arguments = self.prepare_tool_args(name, arguments, messages, state)
            try:
                result = await self.call_tool(name, arguments, call.get("id", ""))
                content = _tool_content(result)
            except Exception as exc:  # the model made a bad call: tell it, keep going
                replies.append(self._tool_error(exc, call, state))
                continue
            if len(content) > self.max_tool_output_chars:
                content = content[: self.max_tool_output_chars] + "\n[output truncated]"
            replies.append(ToolMessage(tool_call_id=call.get("id", ""), content=content))
        return replies

    def _tool_error(self, exc: Exception, call: dict[str, Any], state: State) -> ToolMessage:
        if isinstance(exc, self.stop_errors):
            raise exc
        state["tool_errors"] = state.get("tool_errors", 0) + 1
        return ToolMessage(tool_call_id=call.get("id", ""), content=self.error_formatter(exc))


def total_tool_calls(completion: Messages) -> float:
    """Tool calls the model made in the rollout, all tools together."""
    return float(_calls(completion, None))


def tool_call_counter(name: str) -> Callable[[Messages], float]:
    """The metric `<name>_calls`: calls of the tool `name` in the rollout."""

    def count(completion: Messages) -> float:
        return float(_calls(completion, name))

    count.__name__ = count.__qualname__ = f"{name}_calls"
    return count


def _calls(completion: Messages, name: str | None) -> int:
    return sum(
        1
        for message in completion
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or ()
        if name is None or (call.get("function") or {}).get("name") == name
    )


def _tool_content(result: Any) -> str:
    """A tool result as text: `call_tool` overrides written for verifiers return a tool message."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict) or hasattr(result, "content"):
        content = result.get("content") if isinstance(result, dict) else result.content
        return content if isinstance(content, str) else json.dumps(content)
    return str(result)
