"""A rollout's full conversation — system, user, assistant, tool calls and tool results — and its
reward breakdown (total, each reward function, logged metrics, flags, usage). The blocks it is
drawn with live in `message_blocks`.

A thinking model's turn shows its thinking (`reasoning_content`) folded: one dim line,
"▸ thinking (N words)", that opens on click or Enter (`h` opens or folds them all), since the
answer is what a reader compares across rollouts and the thinking can be pages long.

Message text is shown as written, or rendered as markdown (`set_markdown`: headings, lists,
emphasis, code blocks; LaTeX math stays its source text, e.g. `$x^2$`, as a terminal cannot
typeset it). `find(query)` highlights a query in what the blocks draw and scrolls to each match
in turn (`n`/`N`); the query stays while other rollouts are shown, so one can look for a word
across a group (see `workbench.tui.widgets.find`).
"""

from __future__ import annotations

from rich.console import Group as RichGroup
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Static

from workbench.tui.widgets.find import locate
from workbench.tui.widgets.format import reward_color
from workbench.tui.widgets.message_blocks import (
    AnswerText,
    FindableText,
    MessageBlock,
    ThinkingFold,
    ThinkingTurn,
    content_text,
    message_block,
    render_body,
    tool_call_names,
    update_static,
)
from workbench.types import Rollout

# What other modules (and tests) import from here, from before the blocks moved out.
__all__ = [
    "ConversationView",
    "MessageBlock",
    "RewardBreakdown",
    "ThinkingFold",
    "ThinkingTurn",
    "breakdown",
    "content_text",
    "update_static",
]


class ConversationView(VerticalScroll, can_focus=True):
    """Set `rollout` to show its conversation (prompt, then completion)."""

    BINDINGS = [
        Binding("h", "toggle_thinking", "Thinking"),
        # vim's keys as well as the arrows: the tables take j/k, so reading does too
        Binding("j,down", "scroll_down", "Scroll down", show=False),
        Binding("k,up", "scroll_up", "Scroll up", show=False),
        Binding("pagedown,space", "page_down", "Page down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("g,home", "scroll_home", "Top", show=False),
        Binding("G,end", "scroll_end", "Bottom", show=False),
        # Only while a find is on; otherwise n/N fall through to the screen (Rollouts: next example).
        Binding("n", "next_match(1)", "Next match", show=False),
        Binding("N", "next_match(-1)", "Previous match", show=False),
    ]

    class Found(Message):
        """What a find shows now: `current` (from 0) of `total` matches of `query`."""

        def __init__(self, view: ConversationView, query: str, current: int, total: int) -> None:
            super().__init__()
            self.view = view
            self.query = query
            self.current = current
            self.total = total

        @property
        def control(self) -> ConversationView:
            return self.view

    # No repaint of the view itself when the rollout changes: its blocks repaint what changed
    # (a repaint of the whole view would redraw every block, changed or not).
    rollout: reactive[Rollout | None] = reactive(None, repaint=False)

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.markdown = False
        self.query_text = ""  # the find's query ("" : no find)
        self.matches: list[tuple[FindableText, int, int]] = []  # (block, occurrence in it, its line)
        self.current = 0  # the match shown, an index into `matches`

    def compose(self) -> ComposeResult:
        rollout = self.rollout
        if rollout is None:
            yield Static("no rollout selected", classes="empty")
            return
        names = tool_call_names([*rollout.prompt, *rollout.completion])
        for message in rollout.prompt:
            yield message_block(message, in_prompt=True, tool_names=names, markdown=self.markdown)
        for message in rollout.completion:
            yield message_block(message, in_prompt=False, tool_names=names, markdown=self.markdown)
        if not rollout.completion:
            yield Static("(no completion)", classes="empty")

    async def watch_rollout(self, rollout: Rollout | None) -> None:
        if not self._update_in_place(rollout):
            await self.recompose()
        self.scroll_home(animate=False)
        if self.query_text:
            self.call_after_refresh(self._refind, True)

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
            block.show(message, in_prompt=in_prompt, tool_names=names, markdown=self.markdown)
        return True

    # ----- markdown ----------------------------------------------------------------------------
    def set_markdown(self, on: bool) -> None:
        """Render message text as markdown (or show it as written)."""
        if on == self.markdown:
            return
        self.markdown = on
        for block in self.query(FindableText):
            if isinstance(block, (MessageBlock, AnswerText)):
                block.set_base(render_body(block.message, on))
        for turn in self.query(ThinkingTurn):
            turn.markdown = on
        if self.query_text:
            self.call_after_refresh(self._refind, False)

    # ----- find --------------------------------------------------------------------------------
    def find(self, query: str) -> None:
        """Highlight `query` and scroll to its first match ("" ends the find). The matches are
        counted once the blocks are laid out (`Found` says how many)."""
        self.query_text = query
        self.current = 0
        self.call_after_refresh(self._refind, True)

    def _refind(self, jump: bool) -> None:
        """Find the matches at the blocks' present widths; `jump`: go to the first, else keep
        the one shown (as near as the new matches allow)."""
        query = self.query_text
        fallback = max(self.scrollable_content_region.width - 6, 10)  # a folded block has no width yet
        self.matches = []
        for block in self.query(FindableText):
            found = locate(self.app.console, block.base, block.content_region.width or fallback, query)
            self.matches += [(block, occurrence, line) for occurrence, line in enumerate(found.lines)]
        self.current = 0 if jump else min(self.current, max(len(self.matches) - 1, 0))
        self._highlight()
        if self.matches:
            self._scroll_to_current()

    def _highlight(self) -> None:
        shown = self.matches[self.current] if self.matches else None
        holding = {block for block, _, _ in self.matches}
        for block in self.query(FindableText):
            if block in holding:
                block.highlight(self.query_text, shown[1] if shown and shown[0] is block else None)
            else:
                block.highlight("", None)
        self.post_message(self.Found(self, self.query_text, self.current, len(self.matches)))

    def action_next_match(self, step: int) -> None:
        if not self.matches:
            self.notify(f"no match for {self.query_text!r} in this rollout", severity="warning")
            return
        self.current = (self.current + step) % len(self.matches)
        self._highlight()
        self._scroll_to_current()

    def _scroll_to_current(self) -> None:
        block, _, line = self.matches[self.current]
        fold = next((node for node in block.ancestors if isinstance(node, ThinkingFold)), None)
        if fold is not None and fold.collapsed:
            fold.collapsed = False  # the match is in folded thinking: open it, then scroll
            self.call_after_refresh(self._scroll_to_current)
            return
        # where the match's line is in the view's scrollable content, centred when it can be
        top = block.region.y - self.scrollable_content_region.y + round(self.scroll_y) + block.gutter.top
        self.scroll_to(y=max(0, top + line - self.scrollable_content_region.height // 2), animate=False)

    def on_resize(self, event: events.Resize) -> None:
        if self.query_text:  # lines wrap elsewhere now: the matches' lines move
            self.call_after_refresh(self._refind, False)

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
        if action == "next_match":  # listed, but the key goes on to the screen until a find is on
            return True if self.query_text else None
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
