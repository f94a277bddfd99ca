"""The blocks a conversation is drawn with: one bordered block per chat message, titled with its
role (and, for tool traffic, the tool), a thinking model's turn with its thinking folded, and the
text inside them, which a find can highlight (`FindableText`).

A block shows its message as written or rendered as markdown (`render_body`); LaTeX math stays
its source text (`$x^2$`): a terminal cannot typeset it.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group as RichGroup
from rich.console import RenderableType
from rich.markdown import Markdown
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.visual import VisualType
from textual.widget import Widget
from textual.widgets import Collapsible, Static

from workbench.tui.widgets.find import Highlighted


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


def tool_calls_text(message: dict[str, Any]) -> Text:
    """A message's tool calls, one `→ name(arguments)` line each."""
    text = Text()
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        if text:
            text.append("\n")
        text.append("→ ", style="bold")
        text.append(str(function.get("name", "?")), style="bold")
        text.append(f"({_arguments(function.get('arguments', ''))})")
    return text


def message_body(message: dict[str, Any]) -> Text:
    body = Text(content_text(message.get("content")))
    calls = tool_calls_text(message)
    if body and calls:
        body.append("\n")
    body.append_text(calls)
    if not body:
        body = Text("(empty)", style="dim italic")
    return body


def render_body(message: dict[str, Any], markdown: bool) -> RenderableType:
    """What a block shows of `message`: its text as written, or its content rendered as markdown
    (tool calls stay plain lines below it)."""
    content = content_text(message.get("content"))
    if not markdown or not content.strip():
        return message_body(message)
    calls = tool_calls_text(message)
    return RichGroup(Markdown(content), calls) if calls else Markdown(content)


class FindableText(Static):
    """Text a find can highlight: `base` is what it shows without one."""

    def __init__(self, base: RenderableType, *, classes: str | None = None) -> None:
        super().__init__(base, classes=classes)
        self.base = base
        self.highlighted = False

    def set_base(self, base: RenderableType) -> None:
        self.base = base
        self.highlighted = False
        update_static(self, base)

    def highlight(self, query: str, current: int | None) -> None:
        """Highlight `query` (occurrence `current` of this block the most); "" shows `base`."""
        if query:
            self.highlighted = True
            update_static(self, Highlighted(self.base, query, current))
        elif self.highlighted:
            self.set_base(self.base)


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


class MessageBlock(FindableText):
    """One chat message in a bordered block titled with its role."""

    def __init__(
        self,
        message: dict[str, Any],
        *,
        in_prompt: bool,
        tool_names: dict[str, str] | None = None,
        markdown: bool = False,
    ) -> None:
        super().__init__(render_body(message, markdown), classes=_classes(message, in_prompt))
        self.message = message
        self.border_title = message_title(message, tool_names)
        self.border_subtitle = "prompt" if in_prompt else None

    def show(
        self,
        message: dict[str, Any],
        *,
        in_prompt: bool,
        tool_names: dict[str, str] | None = None,
        markdown: bool = False,
    ) -> None:
        """Show another message in this block (see `ConversationView._update_in_place`)."""
        self.message = message
        self.set_base(render_body(message, markdown))
        self.set_classes(_classes(message, in_prompt))  # a no-op when they are the same
        _set_border_titles(self, message_title(message, tool_names), "prompt" if in_prompt else None)


class AnswerText(FindableText):
    """The answer of a turn that thought (below its folded thinking)."""

    def __init__(self, message: dict[str, Any], *, markdown: bool) -> None:
        super().__init__(render_body(message, markdown), classes="answer")
        self.message = message


class ThinkingFold(Collapsible):
    """A turn's thinking, folded to one line until opened."""

    def __init__(self, thinking: str) -> None:
        words = len(thinking.split())
        super().__init__(
            FindableText(Text(thinking), classes="thinking-text"),
            title=f"thinking ({words} word{'s' * (words != 1)})",
            collapsed=True,
            collapsed_symbol="▸",
            expanded_symbol="▾",
            classes="thinking",
        )


class ThinkingTurn(Vertical):
    """An assistant turn that thought: the folded thinking above the answer, in one block."""

    def __init__(
        self,
        message: dict[str, Any],
        *,
        in_prompt: bool,
        tool_names: dict[str, str] | None = None,
        markdown: bool = False,
    ) -> None:
        super().__init__(classes=_classes(message, in_prompt))
        self.message = message
        self.markdown = markdown
        self.border_title = message_title(message, tool_names)
        if in_prompt:
            self.border_subtitle = "prompt"

    def compose(self) -> ComposeResult:
        yield ThinkingFold(str(self.message["reasoning_content"]))
        yield AnswerText(self.message, markdown=self.markdown)


def message_block(
    message: dict[str, Any], *, in_prompt: bool, tool_names: dict[str, str], markdown: bool = False
) -> Static | ThinkingTurn:
    if message.get("reasoning_content"):
        return ThinkingTurn(message, in_prompt=in_prompt, tool_names=tool_names, markdown=markdown)
    return MessageBlock(message, in_prompt=in_prompt, tool_names=tool_names, markdown=markdown)
