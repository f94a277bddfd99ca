"""Logs of a run: the child's own output (for runs launched from the TUI: the same lines the CLI
prints in a terminal, as they happen) and the run's run.log, followed live; `x` stops the run
after a confirmation."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Static, TabbedContent, TabPane

from workbench.tui.data.runs import pid_alive
from workbench.tui.screens.base import WorkbenchScreen
from workbench.tui.widgets.log_tail import LogTail


class LogScreen(WorkbenchScreen):
    """Tabs of (label, path) logs (`Launcher.logs_of`), each followed live. `label` names the run
    in the stop question ("train reverse-text"); `note` is a line above the logs (why it failed)."""

    DEFAULT_CSS = """
    LogScreen #log-note { height: auto; padding: 0 1; color: $error; }
    """

    BINDINGS = [
        Binding("x", "stop", "Stop run"),
        Binding("1", "tab(0)", "First log", show=False),
        Binding("2", "tab(1)", "Second log", show=False),
    ]

    def __init__(
        self,
        logs: list[tuple[str, Path]],
        *,
        title: str,
        pid: int | None = None,
        label: str | None = None,
        note: str | None = None,
    ) -> None:
        super().__init__()
        self.logs = logs
        self.title_text = title
        self.pid = pid
        self.label = label or title
        self.note = note

    def compose(self) -> ComposeResult:
        yield Static(f"[b]Log[/b] · {self.title_text}", classes="screen-title", markup=True)
        if self.note:
            yield Static(self.note, id="log-note", markup=False)
        with TabbedContent(id="log-tabs"):
            for index, (label, path) in enumerate(self.logs):
                with TabPane(label, id=f"log-{index}"):
                    yield LogTail(path, classes="log-view")
        yield Footer()

    def on_mount(self) -> None:
        self.query(LogTail).first().focus()

    def action_tab(self, index: int) -> None:
        if index < len(self.logs):
            self.query_one(TabbedContent).active = f"log-{index}"
            self.query_one(f"#log-{index} LogTail").focus()

    def action_stop(self) -> None:
        pid = self.pid
        if not pid or not pid_alive(pid):
            self.notify("not running", severity="warning")
            return
        self.confirm_stop(pid, self.label)
