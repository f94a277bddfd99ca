"""A yes/no question in a small modal (stop a run? quit while runs go on?). It dismisses with True
for yes; `y` answers yes, `n` or escape no. The No button has the focus, so a stray Enter never
stops a run."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """`ConfirmScreen(question, title=, yes=, no=)`: the question, and Yes (y) / No (n) buttons."""

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen #confirm-box {
        width: 64; max-width: 95%; height: auto; padding: 1 2;
        border: round $warning; background: $surface;
    }
    ConfirmScreen #confirm-question { height: auto; }
    ConfirmScreen #confirm-answers { height: auto; margin-top: 1; }
    ConfirmScreen #confirm-answers Button { margin-right: 2; }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str, *, title: str = "Confirm", yes: str = "Yes", no: str = "No") -> None:
        super().__init__()
        self.question = question
        self.title_text = title
        self.yes, self.no = yes, no

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box") as box:
            box.border_title = self.title_text
            yield Static(self.question, id="confirm-question", markup=False)
            with Horizontal(id="confirm-answers"):
                yield Button(f"{self.yes} (y)", id="confirm-yes", variant="warning", compact=True)
                yield Button(f"{self.no} (n)", id="confirm-no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    @on(Button.Pressed, "#confirm-yes")
    def _yes(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#confirm-no")
    def _no(self) -> None:
        self.dismiss(False)
