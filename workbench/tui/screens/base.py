"""What every screen shares: Escape goes back, typed access to the app's services, and navigation
by name.

Screens never import each other (nor the app): the app registers every screen under a name
(`WorkbenchApp.SCREEN_FACTORIES`), and a screen opens another with `self.open("rollouts", ...)`,
which asks the app to build that screen and push it. `WorkbenchHost` is what a screen may use
of the app; the app satisfies it without this module importing it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

from textual.binding import Binding
from textual.screen import Screen

if TYPE_CHECKING:
    from pathlib import Path

    from textual.notifications import SeverityLevel
    from textual.screen import ScreenResultCallbackType

    from workbench.tui.data.runs import RunCatalog
    from workbench.tui.launcher import Launcher, StopProgress


class WorkbenchHost(Protocol):
    """The app as screens see it: the workspace, its runs and launches, and navigation."""

    root: Path
    launcher: Launcher
    catalog: RunCatalog
    poll_s: float  # how often screens re-read the files they show

    def open_screen(
        self, name: str, /, *args: Any, callback: ScreenResultCallbackType[Any] | None = None, **kwargs: Any
    ) -> Screen[Any]:
        """Build the screen registered as `name` from `args`/`kwargs` and push it; `callback`
        gets what it dismisses with."""
        ...


class WorkbenchScreen(Screen[object]):
    """Base screen: `escape` returns to the previous screen."""

    BINDINGS = [Binding("escape", "back", "Back")]

    @property
    def wb(self) -> WorkbenchHost:
        return cast("WorkbenchHost", self.app)

    def open(
        self, name: str, /, *args: Any, callback: ScreenResultCallbackType[Any] | None = None, **kwargs: Any
    ) -> Screen[Any]:
        """Open the screen registered as `name` (see `WorkbenchApp.SCREEN_FACTORIES`)."""
        return self.wb.open_screen(name, *args, callback=callback, **kwargs)

    @property
    def closing(self) -> bool:
        """True once the screen is being removed (popped, or the app quitting). Its widgets may
        already be gone then, so a worker that awaited checks this before it touches them.
        (Textual's `display` is false for a node that is closing, closed or being pruned.)"""
        return not self.display

    def confirm_stop(
        self,
        pid: int,
        what: str,
        *,
        consequence: str = "It saves what it finished.",
        stopping: str = "the run saves what it finished and stops",
        grace_s: float | None = None,
    ) -> None:
        """Ask "Stop <what> (pid N)? <consequence>" and, on yes, stop the run (`x` on every screen):
        Ctrl-C, then SIGTERM if it is still there `grace_s` later (default: the launcher's), each
        step said in a notification. The stop runs on the app, so it goes on when this screen closes."""
        launcher = self.wb.launcher
        grace = launcher.stop_grace_s if grace_s is None else grace_s

        def report(progress: StopProgress) -> None:
            line = progress.said[-1]
            if progress.phase == "interrupted":
                line = f"{line}: {stopping}"
            severity: SeverityLevel = (
                "warning" if progress.phase in ("terminated", "still running", "gone") else "information"
            )
            self.app.notify(line, title=f"stop {what}", severity=severity)

        def answered(yes: object) -> None:
            if yes is True:
                self.app.run_worker(
                    launcher.stop_escalating(pid, what, grace_s=grace, report=report),
                    group="stop",
                    exit_on_error=False,
                )

        self.open(
            "confirm",
            f"Stop {what} (pid {pid})? {consequence} "
            f"If it is still running {grace:.3g} s after the Ctrl-C, it gets SIGTERM.",
            title="Stop run",
            yes="Stop",
            no="Keep running",
            callback=answered,
        )

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 1 and self is not self.app.screen_stack[0]:
            self.dismiss(None)
