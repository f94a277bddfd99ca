"""The table of runs on the home screen. Rows are keyed by run folder, so a refresh keeps the
cursor on the same run even when new runs appear above it, and a sort (`o`/`O`) survives the
refresh every second.

Three runs of one env and model must read differently, so every row has a short run id (`id`)
and its start time to the second where there is room. The columns are laid out for the width
there is (`layout`): at 80 columns every column at its narrowest (79 cells); each wider terminal
gives the room first to the start time's seconds, then to env and model (model up to 40 cells at
about 130 columns), and what is left over, from `MIN_ERROR_WIDTH` cells on, to a last column with
a failed row's error (its first line); without room for that, env grows a little. At any width
the Runs screen also shows the highlighted row's error in its hint line.

Grouped by environment (`show(..., counts=...)`), a row is the best eval of one model on one
environment (rows in env order), and `progress` becomes `runs`: how many evals that model has
there."""

from __future__ import annotations

from rich.text import Text
from textual import events, on
from textual.geometry import Size
from textual.message import Message

from workbench.tui.data.runs import RunInfo
from workbench.tui.widgets.format import STATUS_RICH, clip, reward_text, status_text
from workbench.tui.widgets.virtual_table import Cell, Column, SortValue, VirtualTable

# (label, narrowest width): together 79 cells, an 80-column terminal less the scrollbar's cell.
COLUMNS = (
    ("✓", 1),
    ("id", 4),
    ("kind", 5),
    ("env", 9),
    ("model", 10),
    ("status", 8),
    ("progress", 8),
    ("reward", 6),
    ("started", 11),
)
# Where extra width goes, in order: (column, widest it gets at this step).
GROWTH = (
    ("started", 14),  # seconds: 'MM-DD HH:MM:SS'
    ("progress", 9),
    ("env", 14),
    ("model", 24),
    ("id", 6),
    ("model", 40),
)
LAST_GROWTH = (("env", 18),)  # when the room left is too small for an error column
ERROR_LABEL = "error"
MIN_ERROR_WIDTH = 12  # narrower, an error cell says too little to be worth a column
SECONDS_WIDTH = 14
STEP_SUFFIXES = (" step ", " base")


def layout(width: int) -> list[Column]:
    """The columns for a table `width` cells wide (see the module docstring)."""
    widths = dict(COLUMNS)
    room = width - (sum(w + 2 for w in widths.values()) - 1)

    def grow(steps: tuple[tuple[str, int], ...]) -> None:
        nonlocal room
        for name, upto in steps:
            take = max(0, min(room, upto - widths[name]))
            widths[name] += take
            room -= take

    grow(GROWTH)
    columns = [(label, widths[label]) for label, _ in COLUMNS]
    if room - 2 >= MIN_ERROR_WIDTH:
        return [*columns, (ERROR_LABEL, room - 2)]
    grow(LAST_GROWTH)
    return [(label, widths[label]) for label, _ in COLUMNS]


def clip_label(text: str, width: int) -> str:
    """A model label cut to `width` so runs stay told apart: a checkpoint label ('<run> step 12',
    '<run> base') keeps its step and both ends of the run name (generated names differ at the
    end: '…030405-3f2a'), anything else is cut at the end."""
    if len(text) <= width:
        return text
    for marker in STEP_SUFFIXES:
        run, sep, tail = text.rpartition(marker)
        if sep and run:
            suffix = sep + tail
            room = width - len(suffix) - 1  # the ellipsis takes one
            if room >= 6:
                keep_end = min(5, room // 2)
                return f"{run[: room - keep_end]}…{run[-keep_end:]}{suffix}"
            if room >= 1:
                return f"{run[:room]}…{suffix}"
    return clip(text, width)


def started_text(run: RunInfo, width: int) -> str:
    """Local start time, to the second where the column has room."""
    if run.created_at is None:
        return "-"
    stamp = run.created_at.astimezone()
    return stamp.strftime("%m-%d %H:%M:%S" if width >= SECONDS_WIDTH else "%m-%d %H:%M")


def progress_text(run: RunInfo, width: int) -> str:
    """'done/total', or the share done when that does not fit ('1200/1600' in 8 cells: '75%')."""
    text = run.progress
    if len(text) <= width or not run.total or run.done is None:
        return clip(text, width)
    return f"{100 * run.done // run.total}%"


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
        self._marked: set[str] = set()
        self._counts: list[int] | None = None

    @property
    def shows_errors(self) -> bool:
        """Whether the table is wide enough for the `error` column."""
        return len(self.columns) > len(COLUMNS)

    @property
    def grouped(self) -> bool:
        """Whether the rows are the best eval per model and environment (`show(counts=...)`)."""
        return self._counts is not None

    def on_resize(self, event: events.Resize) -> None:
        """Lay the columns out for the new width (`layout`), and redraw the rows to fit them."""
        # the vertical scrollbar's cell is kept free whether or not it shows (rows come and go)
        columns = layout(event.size.width - self.styles.scrollbar_size_vertical)
        if self.grouped:
            columns = self._grouped_labels(columns)
        if columns == self.columns:
            return
        self.columns = columns
        if self.sort_column is not None and self.sort_column >= len(columns):
            self.sort_by(None)
        self.virtual_size = Size(self.line_width, self.row_count + 1)
        self.show(self._given, self._marked, counts=self._counts)

    @property
    def runs(self) -> list[RunInfo]:
        """The runs in the order they are shown (sorted when a sort is on)."""
        return [self._given[i] for i in self.order]

    @property
    def current(self) -> RunInfo | None:
        index = self.cursor_index
        return None if index is None or index >= len(self._given) else self._given[index]

    def show(
        self,
        runs: list[RunInfo],
        marked: set[str],
        select: str | None = None,
        *,
        counts: list[int] | None = None,
    ) -> None:
        """Replace the rows; the cursor stays on the same run (or moves to `select`). `counts`
        (one per run): grouped by environment, each run the best of that many."""
        if (counts is None) != (self._counts is None):
            plain = [(label, width) for (label, width) in self.columns]
            self.columns = self._grouped_labels(plain) if counts is not None else self._plain_labels(plain)
        self._given, self._marked, self._counts = runs, set(marked), counts
        cursor = (
            next((i for i, r in enumerate(runs) if r.key == select), None) if select is not None else None
        )
        widths = dict(self.columns)
        cells = [self._cells(run, run.key in marked, widths) for run in runs]
        values = [self._sort_values(run, run.key in marked) for run in runs]
        if counts is not None:  # the `runs` column: how many evals the row is the best of
            cells = [(*row[:6], str(c), *row[7:]) for row, c in zip(cells, counts, strict=True)]
            values = [(*v[:6], float(c), *v[7:]) for v, c in zip(values, counts, strict=True)]
        self.set_rows(cells, cursor, keys=[run.key for run in runs], sort_values=values)

    @staticmethod
    def _grouped_labels(columns: list[Column]) -> list[Column]:
        return [("runs" if label == "progress" else label, width) for label, width in columns]

    @staticmethod
    def _plain_labels(columns: list[Column]) -> list[Column]:
        return [("progress" if label == "runs" else label, width) for label, width in columns]

    @staticmethod
    def _cells(run: RunInfo, marked: bool, widths: dict[str, int]) -> tuple[Cell, ...]:
        # The error cell is cut to its column's width when drawn (the width follows the terminal).
        progress_width = widths.get("progress", widths.get("runs", 8))
        return (
            "●" if marked else " ",
            Text(clip(run.short_id, widths["id"]), style="dim"),
            run.kind,
            clip(run.env, widths["env"]),
            clip_label(run.model_label, widths["model"]),
            Text(run.status, style="bold yellow") if run.status == "stopping" else status_text(run.status),
            progress_text(run, progress_width),
            reward_text(run.reward),
            started_text(run, widths["started"]),
            error_text(run.error),
        )

    @staticmethod
    def _sort_values(run: RunInfo, marked: bool) -> tuple[SortValue, ...]:
        fraction = run.done / run.total if run.done is not None and run.total else None
        started = run.created_at.timestamp() if run.created_at else None
        return (
            "●" if marked else None,
            run.short_id.casefold(),
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
