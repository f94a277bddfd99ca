"""`StatefulToolEnv`: a ToolEnv whose tool arguments can come from the rollout's state.

Some tools need values the model must not choose (a sandbox id, a session, an offset): register
them with `add_tool(func, args_to_skip=["sandbox_id"])` so those arguments are hidden from the
schema the model sees, and implement `update_tool_args` to put them in before each call. The
same names and signature as verifiers' classic `StatefulToolEnv`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from workbench.envs.tool_env import ToolEnv, tool_schema
from workbench.types import Messages, State


class StatefulToolEnv(ToolEnv):
    """Calls `update_tool_args(tool_name, tool_args, messages, state)` before each tool call."""

    def __init__(
        self, tools: Sequence[Callable[..., Any]] | None = None, *, max_turns: int = 10, **kwargs: Any
    ) -> None:  # kwargs: ToolEnv's named arguments
        super().__init__(tools=tools, max_turns=max_turns, **kwargs)
        self.skipped_args: dict[str, list[str]] = {}  # by tool name, for tools added with add_tool

    def add_tool(self, tool: Callable[..., Any], args_to_skip: Sequence[str] = ()) -> None:
        """Register `tool`; `args_to_skip` are left out of its schema (update_tool_args fills them)."""
        self._register(tool, tool_schema(tool, hidden=args_to_skip))
        self.skipped_args[tool.__name__] = list(args_to_skip)

    def remove_tool(self, tool: Callable[..., Any]) -> None:
        super().remove_tool(tool)
        self.skipped_args.pop(tool.__name__, None)

    @abstractmethod
    def update_tool_args(
        self, tool_name: str, tool_args: dict[str, Any], messages: Messages, state: State, **kwargs: Any
    ) -> dict[str, Any]:
        """The arguments to call `tool_name` with: the model's `tool_args` plus what the state
        supplies. May update `state` in place."""

    def prepare_tool_args(
        self, tool_name: str, tool_args: dict[str, Any], messages: Messages, state: State
    ) -> dict[str, Any]:
        updated = self.update_tool_args(tool_name, tool_args, messages, state)
        if not isinstance(updated, dict):
            raise TypeError(f"update_tool_args must return a dict of arguments, got {type(updated).__name__}")
        return updated
