"""A log viewer that follows one file (a launch's output, a run's run.log) while it grows."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Log

from workbench.tui.data.tail import TextTail

POLL_S = 0.5


class LogTail(Log):
    """Shows the last lines of `path` and appends new ones every half second."""

    def __init__(self, path: Path, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, max_lines=5000, highlight=False)
        self.tail = TextTail(path, keep=5000)

    def on_mount(self) -> None:
        self.poll()
        self.set_interval(POLL_S, self.poll)

    def poll(self) -> None:
        new = self.tail.poll()
        if self.tail.was_reset:
            self.clear()
        if new:
            self.write_lines(new)
