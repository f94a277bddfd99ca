"""What every screen shares: Escape goes back, and typed access to the app's services."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.binding import Binding
from textual.screen import Screen

if TYPE_CHECKING:
    from workbench.tui.app import WorkbenchApp


class WorkbenchScreen(Screen[object]):
    """Base screen: `escape` returns to the previous screen."""

    BINDINGS = [Binding("escape", "back", "Back")]

    @property
    def wb(self) -> WorkbenchApp:
        return cast("WorkbenchApp", self.app)

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 1 and self is not self.app.screen_stack[0]:
            self.dismiss(None)
