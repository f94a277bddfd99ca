"""The table of runs on the home screen. Rows are keyed by run folder, so a refresh keeps the
cursor on the same run even when new runs appear above it, and a sort (`o`/`O`) survives the
refresh every second."""

from __future__ import annotations

from textual import on
from textual.message import Message

from workbench.tui.data.runs import RunInfo
from workbench.tui.widgets.format import clip, clip_head, reward_text, status_text, when
from workbench.tui.widgets.virtual_table import Cell, SortValue, VirtualTable

# (label, width): sized so the whole table fits an 80-column terminal.
COLUMNS = (("✓", 1), ("kind", 5), ("env", 13), ("model", 12), ("status", 8), ("progress", 8),
           ("reward", 6), ("started", 11))


class RunsTable(VirtualTable):
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
        super().__init__(COLUMNS, id=id, open_label="Open run")
        self._given: list[RunInfo] = []

    @property
    def runs(self) -> list[RunInfo]:
        """The runs in the order they are shown (sorted when a sort is on)."""
        return [self._given[i] for i in self.order]

    @property
    def current(self) -> RunInfo | None:
        index = self.cursor_index
        return None if index is None or index >= len(self._given) else self._given[index]

    def show(self, runs: list[RunInfo], marked: set[str], select: str | None = None) -> None:
        """Replace the rows; the cursor stays on the same run (or moves to `select`)."""
        self._given = runs
        cursor = next((i for i, r in enumerate(runs) if r.key == select), None) if select is not None else None
        self.set_rows([self._cells(run, run.key in marked) for run in runs], cursor,
                      keys=[run.key for run in runs], sort_values=[self._sort_values(run, run.key in marked) for run in runs])

    @staticmethod
    def _cells(run: RunInfo, marked: bool) -> tuple[Cell, ...]:
        return ("●" if marked else " ", run.kind, clip(run.env, 13), clip_head(run.model_label, 12),
                status_text(run.status), clip(run.progress, 8), reward_text(run.reward), when(run.created_at))

    @staticmethod
    def _sort_values(run: RunInfo, marked: bool) -> tuple[SortValue, ...]:
        fraction = run.done / run.total if run.done is not None and run.total else None
        started = run.created_at.timestamp() if run.created_at else None
        return ("●" if marked else None, run.kind, run.env.casefold(), run.model_label.casefold(), run.status,
                fraction, run.reward, started)

    @on(VirtualTable.Selected)
    def _selected(self, event: VirtualTable.Selected) -> None:
        event.stop()
        if self.current is not None:
            self.post_message(self.Opened(self, self.current))
