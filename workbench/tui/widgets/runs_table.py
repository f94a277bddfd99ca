"""The table of runs on the home screen. Rows are keyed by run folder, so a refresh keeps the
cursor on the same run even when new runs appear above it."""

from __future__ import annotations

from textual import on
from textual.message import Message
from textual.widgets import DataTable

from workbench.tui.data.runs import RunInfo
from workbench.tui.widgets.format import clip, reward_text, status_text, when

# (label, width): sized so the whole table fits an 80-column terminal.
COLUMNS = (("", 1), ("kind", 5), ("env", 13), ("model", 12), ("status", 8), ("progress", 9),
           ("reward", 6), ("started", 11))


class RunsTable(DataTable):
    """Shows `RunInfo`s; posts `Opened` on Enter."""

    class Opened(Message):
        def __init__(self, table: RunsTable, run: RunInfo) -> None:
            super().__init__()
            self.table = table
            self.run = run

        @property
        def control(self) -> RunsTable:
            return self.table

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.runs: list[RunInfo] = []
        self._rows: list[tuple] = []

    def on_mount(self) -> None:
        for label, width in COLUMNS:
            self.add_column(label, width=width, key=label or "mark")

    @property
    def current(self) -> RunInfo | None:
        if not self.runs or self.cursor_row < 0 or self.cursor_row >= len(self.runs):
            return None
        return self.runs[self.cursor_row]

    def show(self, runs: list[RunInfo], marked: set[str], select: str | None = None) -> None:
        """Replace the rows; the cursor stays on the same run (or moves to `select`)."""
        rows = [self._cells(run, run.key in marked) for run in runs]
        keep = select or (self.current.key if self.current else None)
        if [r.key for r in runs] == [r.key for r in self.runs] and select is None:
            # Same runs in the same order (the common case: progress ticking): update changed cells only.
            for run, old, new in zip(runs, self._rows, rows, strict=True):
                for (label, _), before, after in zip(COLUMNS, old, new, strict=True):
                    if before != after:
                        self.update_cell(run.key, label or "mark", after)
            self.runs, self._rows = runs, rows
            return
        self.runs, self._rows = runs, rows
        self.clear()
        for run, cells in zip(runs, rows, strict=True):
            self.add_row(*cells, key=run.key)
        if keep is not None:
            index = next((i for i, r in enumerate(runs) if r.key == keep), None)
            if index is not None:
                self.move_cursor(row=index, animate=False)

    @staticmethod
    def _cells(run: RunInfo, marked: bool) -> tuple:
        return ("●" if marked else " ", run.kind, clip(run.env, 13), clip(run.model, 12), status_text(run.status),
                clip(run.progress, 9), reward_text(run.reward), when(run.created_at))

    @on(DataTable.RowSelected)
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if self.current is not None:
            self.post_message(self.Opened(self, self.current))
