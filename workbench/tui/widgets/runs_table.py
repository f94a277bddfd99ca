"""The table of runs on the home screen. Rows are keyed by run folder, so a refresh keeps the
cursor on the same run even when new runs appear above it, and a sort (`o`/`O`) survives the
refresh every second.

A failed row's error (its first line) gets a last column, `error`, only where there is room for
one: the other columns are sized for 80 columns and take 79 cells there, and narrowing env or
model, which tell runs apart, for a few cells of error would help no one. From 94 columns on
(`MIN_ERROR_WIDTH` cells of error) it takes the width left over. At any width the Runs screen
also shows the highlighted row's error in its hint line."""

from __future__ import annotations

from rich.text import Text
from textual import events, on
from textual.geometry import Size
from textual.message import Message

from workbench.tui.data.runs import RunInfo
from workbench.tui.widgets.format import STATUS_RICH, clip, clip_head, reward_text, status_text, when
from workbench.tui.widgets.virtual_table import Cell, SortValue, VirtualTable

# (label, width): sized so the whole table fits an 80-column terminal.
COLUMNS = (
    ("✓", 1),
    ("kind", 5),
    ("env", 13),
    ("model", 12),
    ("status", 8),
    ("progress", 8),
    ("reward", 6),
    ("started", 11),
)
ERROR_LABEL = "error"
MIN_ERROR_WIDTH = 12  # narrower, an error cell says too little to be worth a column


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
    def shows_errors(self) -> bool:
        """Whether the table is wide enough for the `error` column."""
        return len(self.columns) > len(COLUMNS)

    def on_resize(self, event: events.Resize) -> None:
        """Add the `error` column when there is room for it, sized to the room; drop it when not."""
        # the vertical scrollbar's cell is kept free whether or not it shows (rows come and go)
        width = event.size.width - self.styles.scrollbar_size_vertical
        room = width - (sum(column + 2 for _, column in COLUMNS) - 1) - 2
        columns = [*COLUMNS, (ERROR_LABEL, room)] if room >= MIN_ERROR_WIDTH else list(COLUMNS)
        if columns == self.columns:
            return
        self.columns = columns
        if self.sort_column is not None and self.sort_column >= len(columns):
            self.sort_by(None)
        self.virtual_size = Size(self.line_width, self.row_count + 1)
        self.refresh()

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
        cursor = (
            next((i for i, r in enumerate(runs) if r.key == select), None) if select is not None else None
        )
        self.set_rows(
            [self._cells(run, run.key in marked) for run in runs],
            cursor,
            keys=[run.key for run in runs],
            sort_values=[self._sort_values(run, run.key in marked) for run in runs],
        )

    @staticmethod
    def _cells(run: RunInfo, marked: bool) -> tuple[Cell, ...]:
        # The error cell is cut to its column's width when drawn (the width follows the terminal).
        return (
            "●" if marked else " ",
            run.kind,
            clip(run.env, 13),
            clip_head(run.model_label, 12),
            status_text(run.status),
            clip(run.progress, 8),
            reward_text(run.reward),
            when(run.created_at),
            error_text(run.error),
        )

    @staticmethod
    def _sort_values(run: RunInfo, marked: bool) -> tuple[SortValue, ...]:
        fraction = run.done / run.total if run.done is not None and run.total else None
        started = run.created_at.timestamp() if run.created_at else None
        return (
            "●" if marked else None,
            run.kind,
            run.env.casefold(),
            run.model_label.casefold(),
            run.status,
            fraction,
            run.reward,
            started,
            run.error.casefold() if run.error else None,
        )

    @on(VirtualTable.Selected)
    def _selected(self, event: VirtualTable.Selected) -> None:
        event.stop()
        if self.current is not None:
            self.post_message(self.Opened(self, self.current))


def error_text(error: str | None) -> Text:
    """An error cell: the error's first line in the failed status's color, or nothing."""
    return Text(error or "", style=STATUS_RICH["failed"] if error else "")
