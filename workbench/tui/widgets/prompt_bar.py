"""A one-line input that appears at the bottom of a screen to ask one thing (a search query, a
reward range), then hides. The screen learns the answer from the `Answered` message."""

from __future__ import annotations

from textual import on
from textual.binding import Binding
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Input


class PromptBar(Input):
    """Hidden until `ask()`; Enter posts `Answered(purpose, value)`, Escape cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", show=False)]

    class Answered(Message):
        def __init__(self, purpose: str, value: str, bar: PromptBar | None = None) -> None:
            super().__init__()
            self.purpose = purpose
            self.value = value
            self.bar = bar

        @property
        def control(self) -> PromptBar | None:
            """The bar that asked (so `@on(PromptBar.Answered, "#id")` picks one bar's answers)."""
            return self.bar

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, compact=True)
        self.purpose = ""
        self.display = False
        self._return_to: Widget | None = None

    def ask(self, purpose: str, placeholder: str, value: str = "") -> None:
        self.purpose = purpose
        self.placeholder = placeholder
        self.value = value
        self.display = True
        self._return_to = self.screen.focused
        self.focus()

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._close()
        self.post_message(self.Answered(self.purpose, self.value, self))

    def action_cancel(self) -> None:
        self._close()

    def _close(self) -> None:
        self.display = False
        if self._return_to is not None and self._return_to.is_attached:
            self._return_to.focus()
