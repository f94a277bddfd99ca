"""One rollout read in full: its reward breakdown above its conversation, with a find bar and a
line saying where the find is. The Rollouts and Group screens show one each.

A screen that shows one inherits `DetailActions` (beside its real base) for the keys that work
wherever the focus is: `f` find in the rollout (then `n`/`N`, the conversation focused), `m` markdown,
`F` full screen (the detail fills the screen; `F` or escape gives the screen back) and `ctrl+d` /
`ctrl+u` to scroll the conversation without taking the focus from the table.
"""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Static

from workbench.tui.widgets.conversation import ConversationView, RewardBreakdown
from workbench.tui.widgets.prompt_bar import PromptBar


class RolloutDetail(Vertical):
    """Breakdown, conversation, find status and find bar; may fill the screen (`F`)."""

    ALLOW_MAXIMIZE = True

    def __init__(self, *, id: str | None = None, breakdown_id: str, conversation_id: str) -> None:
        super().__init__(id=id)
        self.breakdown_id = breakdown_id
        self.conversation_id = conversation_id

    def compose(self) -> ComposeResult:
        yield RewardBreakdown(id=self.breakdown_id)
        yield ConversationView(id=self.conversation_id)
        yield Static(classes="find-status")
        yield PromptBar(classes="find-bar")

    @property
    def conversation(self) -> ConversationView:
        return self.query_one(ConversationView)

    @property
    def breakdown(self) -> RewardBreakdown:
        return self.query_one(RewardBreakdown)

    def ask_find(self) -> None:
        """Ask for a query; the bar starts empty (so Enter at once ends a find)."""
        current = self.conversation.query_text
        now = f"now {current!r}; " if current else ""
        self.query_one(".find-bar", PromptBar).ask(
            "find", f"find in this rollout ({now}Enter: first match, then n/N; empty Enter ends the find)"
        )

    @on(PromptBar.Answered, ".find-bar")
    def _find_answered(self, event: PromptBar.Answered) -> None:
        event.stop()
        self.conversation.find(event.value.strip())
        self.conversation.focus()  # n/N are the conversation's keys

    @on(ConversationView.Found)
    def _found(self, event: ConversationView.Found) -> None:
        status = self.query_one(".find-status", Static)
        status.display = bool(event.query)
        if not event.query:
            return
        if event.total:
            status.update(
                f"find [b]{event.query}[/b]: match {event.current + 1}/{event.total} · n next · N previous · f new find"
            )
        else:
            status.update(f"find [b]{event.query}[/b]: not in this rollout · f new find (empty ends it)")


class DetailActions(Screen[object]):
    """The keys of a screen with one `RolloutDetail`. A `Screen`, so Textual merges these
    bindings into the screen's; the screen inherits it beside its real base, and its escape
    calls `leave_full_screen` first."""

    BINDINGS = [
        Binding("f", "find_in_rollout", "Find in rollout"),
        Binding("m", "markdown", "Markdown", show=False),
        Binding("F", "full_screen", "Full screen"),
        Binding("ctrl+d", "scroll_conversation(1)", "Scroll conversation down", show=False),
        Binding("ctrl+u", "scroll_conversation(-1)", "Scroll conversation up", show=False),
    ]

    # Escape minimizes here, not in Textual's key handler: that one runs before any binding and
    # would take escape from the find bar too.
    ESCAPE_TO_MINIMIZE = False
    # The find bar and the screen's own prompt bar stay usable with the detail full screen.
    ALLOW_IN_MAXIMIZED_VIEW = "Footer, PromptBar"

    @property
    def detail(self) -> RolloutDetail:
        return self.query_one(RolloutDetail)

    def action_find_in_rollout(self) -> None:
        self.detail.ask_find()

    def action_markdown(self) -> None:
        view = self.detail.conversation
        view.set_markdown(not view.markdown)
        self.notify(
            "markdown: rendered (math stays as its source text)" if view.markdown else "markdown: as written",
            timeout=2,
        )

    def action_full_screen(self) -> None:
        if self.maximized is not None:
            self.minimize()
            return
        self.maximize(self.detail, container=False)
        self.detail.conversation.focus()

    def action_scroll_conversation(self, direction: int) -> None:
        view = self.detail.conversation
        view.scroll_relative(y=direction * max(1, view.scrollable_content_region.height // 2), animate=False)

    def leave_full_screen(self) -> bool:
        """Escape's first job: give the screen back when the detail fills it."""
        if self.maximized is None:
            return False
        self.minimize()
        return True
