"""A rollout's full conversation — system, user, assistant, tool calls and tool results — and its
reward breakdown (total, each reward function, logged metrics, flags, usage).

A thinking model's turn shows its thinking (`reasoning_content`) folded: one dim line,
"▸ thinking (N words)", that opens on click or Enter (`h` opens or folds them all), since the
answer is what a reader compares across rollouts and the thinking can be pages long.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group as RichGroup
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.visual import VisualType
from textual.widget import Widget
from textual.widgets import Collapsible, Static

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


def _classes(message: dict[str, Any], in_prompt: bool) -> str:
    role = str(message.get("role", "other"))
    role_class = role if role in ("system", "user", "assistant", "tool") else "other"
    return f"message -{role_class}" + (" -prompt" if in_prompt else "")


def _same_text(a: object, b: object) -> bool:
    """Both are Rich Text that draws the same (`Text.__eq__` ignores the base style)."""
    return isinstance(a, Text) and isinstance(b, Text) and a == b and a.style == b.style


def update_static(widget: Static, content: VisualType) -> None:
    """Show `content` in `widget`, laying the screen out again only when its height changes.

    `Static.update` asks for a layout by default: the whole screen is arranged again, every
    scroll view on it (the groups table among them) repaints its scroll bars, and the layout
    waits for a frame of its own. Moving the Rollouts cursor one row mostly shows text of the
    same height (another answer to a prompt of the same shape): repainting this widget where
    it is draws the same, for a fraction of the frame."""
    if _same_text(content, widget.content):
        return  # the same text (the system prompt of every rollout): nothing to redraw
    region = widget.content_region
    widget.update(content, layout=False)
    if (
        not region.width
        or widget.get_content_height(widget.container_size, widget.app.size, region.width) != region.height
    ):
        widget.refresh(layout=True)


def _set_border_titles(widget: Widget, title: str, subtitle: str | None) -> None:
    """Set border titles only when they change: each assignment repaints the widget."""
    if widget.border_title != title:
        widget.border_title = title
    if widget.border_subtitle != subtitle:
        widget.border_subtitle = subtitle


class MessageBlock(Static):
    """One chat message in a bordered block titled with its role."""

    def __init__(
        self, message: dict[str, Any], *, in_prompt: bool, tool_names: dict[str, str] | None = None
    ) -> None:
        super().__init__(message_body(message), classes=_classes(message, in_prompt))
        self.border_title = message_title(message, tool_names)
        self.border_subtitle = "prompt" if in_prompt else None

    def show(
        self, message: dict[str, Any], *, in_prompt: bool, tool_names: dict[str, str] | None = None
    ) -> None:
        """Show another message in this block (see `ConversationView._update_in_place`)."""
        update_static(self, message_body(message))
        self.set_classes(_classes(message, in_prompt))  # a no-op when they are the same
        _set_border_titles(self, message_title(message, tool_names), "prompt" if in_prompt else None)


class ThinkingFold(Collapsible):
    """A turn's thinking, folded to one line until opened."""

    def __init__(self, thinking: str) -> None:
        words = len(thinking.split())
        super().__init__(
            Static(thinking, classes="thinking-text"),
            title=f"thinking ({words} word{'s' * (words != 1)})",
            collapsed=True,
            collapsed_symbol="▸",
            expanded_symbol="▾",
            classes="thinking",
        )


class ThinkingTurn(Vertical):
    """An assistant turn that thought: the folded thinking above the answer, in one block."""

    def __init__(
        self, message: dict[str, Any], *, in_prompt: bool, tool_names: dict[str, str] | None = None
    ) -> None:
        super().__init__(classes=_classes(message, in_prompt))
        self.message = message
        self.border_title = message_title(message, tool_names)
        if in_prompt:
            self.border_subtitle = "prompt"

    def compose(self) -> ComposeResult:
        yield ThinkingFold(str(self.message["reasoning_content"]))
        yield Static(message_body(self.message), classes="answer")


def message_block(
    message: dict[str, Any], *, in_prompt: bool, tool_names: dict[str, str]
) -> Static | ThinkingTurn:
    if message.get("reasoning_content"):
        return ThinkingTurn(message, in_prompt=in_prompt, tool_names=tool_names)
    return MessageBlock(message, in_prompt=in_prompt, tool_names=tool_names)


class ConversationView(VerticalScroll, can_focus=True):
    """Set `rollout` to show its conversation (prompt, then completion)."""

    BINDINGS = [Binding("h", "toggle_thinking", "Thinking")]

    # No repaint of the view itself when the rollout changes: its blocks repaint what changed
    # (a repaint of the whole view would redraw every block, changed or not).
    rollout: reactive[Rollout | None] = reactive(None, repaint=False)

    def compose(self) -> ComposeResult:
        rollout = self.rollout
        if rollout is None:
            yield Static("no rollout selected", classes="empty")
            return
        names = tool_call_names([*rollout.prompt, *rollout.completion])
        for message in rollout.prompt:
            yield message_block(message, in_prompt=True, tool_names=names)
        for message in rollout.completion:
            yield message_block(message, in_prompt=False, tool_names=names)
        if not rollout.completion:
            yield Static("(no completion)", classes="empty")

    async def watch_rollout(self, rollout: Rollout | None) -> None:
        if not self._update_in_place(rollout):
            await self.recompose()
        self.scroll_home(animate=False)

    def _update_in_place(self, rollout: Rollout | None) -> bool:
        """Show `rollout` in the blocks already mounted when it has the same shape (the common
        case while scrolling one environment's rollouts: system, user, assistant). Mounting a
        conversation's widgets anew is what makes a frame slow; updating their text is not."""
        if rollout is None or not rollout.completion:
            return False
        messages = [(m, True) for m in rollout.prompt] + [(m, False) for m in rollout.completion]
        blocks = [child for child in self.children if type(child) is MessageBlock]
        if (
            len(blocks) != len(self.children)
            or len(blocks) != len(messages)
            or any(m.get("reasoning_content") for m, _ in messages)
        ):
            return False
        names = tool_call_names([m for m, _ in messages])
        for block, (message, in_prompt) in zip(blocks, messages, strict=True):
            block.show(message, in_prompt=in_prompt, tool_names=names)
        return True

    def action_toggle_thinking(self) -> None:
        """Open every fold when any is closed, else close them all."""
        folds = list(self.query(ThinkingFold))
        opened = any(fold.collapsed for fold in folds)
        for fold in folds:
            fold.collapsed = not opened

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The key (and its footer hint) only where there is thinking to show.
        if action == "toggle_thinking":
            return bool(self.query(ThinkingFold))
        return True


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
        update_static(self, breakdown(rollout, group_size) if rollout is not None else "")
