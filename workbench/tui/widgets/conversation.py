"""A rollout's full conversation — system, user, assistant, tool calls and tool results — and its
reward breakdown (total, each reward function, logged metrics, flags, usage)."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group as RichGroup
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.widgets import Static

from workbench.tui.widgets.format import reward_color
from workbench.types import Rollout


def content_text(content: Any) -> str:
    """OpenAI message content as text (a string, or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", p)) if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _arguments(raw: Any) -> str:
    """Tool-call arguments pretty-printed when they are JSON."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return raw
    return json.dumps(raw, ensure_ascii=False)


def message_body(message: dict[str, Any]) -> Text:
    body = Text(content_text(message.get("content")))
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        if body:
            body.append("\n")
        body.append("→ ", style="bold")
        body.append(str(function.get("name", "?")), style="bold")
        body.append(f"({_arguments(function.get('arguments', ''))})")
    if not body:
        body = Text("(empty)", style="dim italic")
    return body


def message_title(message: dict[str, Any], tool_names: dict[str, str] | None = None) -> str:
    """The block title: the role, and for tool traffic which tool (a result names its call's tool)."""
    role = str(message.get("role", "?"))
    if role == "tool":
        call_id = message.get("tool_call_id")
        name = message.get("name") or (tool_names or {}).get(str(call_id)) or call_id
        return f"tool ← {name}" if name else "tool"
    if role == "assistant" and message.get("tool_calls"):
        return "assistant · tool call"
    return role


def tool_call_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    """Tool-call id -> tool name, from the assistant messages' tool calls."""
    names = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id"):
                names[str(call["id"])] = str((call.get("function") or {}).get("name", "?"))
    return names


class MessageBlock(Static):
    """One chat message in a bordered block titled with its role."""

    def __init__(self, message: dict[str, Any], *, in_prompt: bool, tool_names: dict[str, str] | None = None) -> None:
        role = str(message.get("role", "other"))
        role_class = role if role in ("system", "user", "assistant", "tool") else "other"
        super().__init__(message_body(message), classes=f"message -{role_class}" + (" -prompt" if in_prompt else ""))
        self.border_title = message_title(message, tool_names)
        if in_prompt:
            self.border_subtitle = "prompt"


class ConversationView(VerticalScroll, can_focus=True):
    """Set `rollout` to show its conversation (prompt, then completion)."""

    rollout: reactive[Rollout | None] = reactive(None, recompose=True)

    def compose(self) -> ComposeResult:
        rollout = self.rollout
        if rollout is None:
            yield Static("no rollout selected", classes="empty")
            return
        names = tool_call_names([*rollout.prompt, *rollout.completion])
        for message in rollout.prompt:
            yield MessageBlock(message, in_prompt=True, tool_names=names)
        for message in rollout.completion:
            yield MessageBlock(message, in_prompt=False, tool_names=names)
        if not rollout.completion:
            yield Static("(no completion)", classes="empty")

    def watch_rollout(self) -> None:
        self.scroll_home(animate=False)


def breakdown(rollout: Rollout, of: int) -> RichGroup:
    """The header lines above a conversation."""
    head = Text()
    head.append(f"example {rollout.example_id} · rollout {rollout.rollout_index + 1}/{of} · ", style="bold")
    head.append("reward ", style="bold")
    head.append(f"{rollout.reward:.3f}", style=f"bold {reward_color(rollout.reward)}")
    funcs = Text()
    for name, value in rollout.rewards.items():
        funcs.append(f"{name} ", style="cyan")
        funcs.append(f"{value:.3f}  ")
    for name, value in rollout.metrics.items():
        funcs.append(f"{name} ", style="dim cyan")
        funcs.append(f"{value:.3f} ", style="dim")
        funcs.append("(metric)  ", style="dim italic")
    usage = rollout.usage or {}
    tokens = f"tokens {usage.get('prompt_tokens', 0)}→{usage.get('completion_tokens', 0)}"
    facts = [f"turns {rollout.num_turns}", tokens, f"stop {rollout.stop_condition or '-'}"]
    if rollout.timing.get("total_ms") is not None:
        facts.append(f"{rollout.timing['total_ms']:.0f} ms")
    if rollout.policy_version:
        facts.append(f"policy v{rollout.policy_version}")
    meta = Text(" · ".join(facts), style="dim")
    if rollout.is_truncated:
        meta.append(" · TRUNCATED", style="bold yellow")
    lines: list[Text] = [head, funcs or Text("no reward functions recorded", style="dim"), meta]
    if rollout.error is not None:
        error = rollout.error
        lines.append(Text(f"error ({error.where}) {error.type}: {error.message}", style="bold red"))
    if rollout.answer:
        lines.append(Text.assemble(("answer ", "dim"), rollout.answer))
    return RichGroup(*lines)


class RewardBreakdown(Static):
    """Reward total, per-function rewards and metrics, flags and usage of the shown rollout."""

    def show(self, rollout: Rollout | None, group_size: int = 1) -> None:
        self.update(breakdown(rollout, group_size) if rollout is not None else "")
