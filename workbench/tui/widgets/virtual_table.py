"""A table that renders only the rows on screen (Textual's Line API), sortable by any column.

`DataTable` measures every cell of every row when rows are added (about a second for a few
thousand rows), which would make opening a 10,000-rollout run slow. This table has fixed
column widths, so adding rows costs nothing and drawing costs only the visible lines.

Every table of the TUI is one of these, so every table behaves the same:
- a row cursor (arrows, `j`/`k`, PageUp/PageDown, `g`/`G` or Home/End for first/last);
- `o` sorts by the next column and `O` reverses it (or click a header); the header shows ▲/▼.
  A sort survives `set_rows` (a live run refreshing), and the cursor stays on its row;
- rows may carry keys (a run folder, an example id): `select_key` jumps to one, and a refresh
  keeps the cursor on the same key.

Messages carry the row's index in the order it was given to `set_rows` (not the sorted
position), so a screen maps an event straight back to its own list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from workbench.tui.textual_private import relabel_binding

Cell = str | Text
Column = tuple[str, int]  # (label, width in cells)
SortValue = float | str | None  # None (a "-" cell) always sorts last


def sort_value(cell: Cell) -> SortValue:
    """How a cell sorts when the screen gave no explicit value: numbers as numbers (also the
    first number of '3/10'), '-' and empty last, other text case-insensitively."""
    text = (cell.plain if isinstance(cell, Text) else str(cell)).strip()
    if text in ("", "-", "–"):
        return None
    head = text.split("/", 1)[0].rstrip("%").replace(",", "")
    try:
        return float(head)
    except ValueError:
        return text.casefold()


def _ordering(values: Sequence[SortValue], reverse: bool) -> list[int]:
    """Indices that sort `values` (numbers before text, None last whichever the direction);
    stable, so equal values keep the order they were given in."""
    present = [i for i, v in enumerate(values) if v is not None]
    numbers = [i for i in present if isinstance(values[i], float)]
    texts = [i for i in present if not isinstance(values[i], float)]
    numbers.sort(key=lambda i: values[i], reverse=reverse)  # type: ignore[arg-type, return-value]
    texts.sort(key=lambda i: values[i], reverse=reverse)  # type: ignore[arg-type, return-value]
    return numbers + texts + [i for i, v in enumerate(values) if v is None]


class VirtualTable(ScrollView, can_focus=True):
    """Fixed-width columns, one line per row, a header line, a row cursor, sorting."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"virtual-table--header", "virtual-table--cursor"}
    BINDINGS = [
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("pageup,ctrl+b", "page(-1)", "Page up", show=False),
        Binding("pagedown,ctrl+f", "page(1)", "Page down", show=False),
        Binding("g,home", "first", "First row", show=False),
        Binding("G,end", "last", "Last row", show=False),
        Binding("o", "sort", "Sort by next column", show=False),
        Binding("O", "reverse_sort", "Reverse sort", show=False),
        Binding("enter", "select", "Open"),
    ]

    class _RowMessage(Message):
        def __init__(self, table: VirtualTable, index: int) -> None:
            super().__init__()
            self.table = table
            self.index = index  # position in the rows as given to set_rows

        @property
        def control(self) -> VirtualTable:
            return self.table

    class Highlighted(_RowMessage):
        """The cursor moved to row `index`."""

    class Selected(_RowMessage):
        """Enter (or a double click) on row `index`."""

    class Sorted(Message):
        """The sort changed (column index or None, and direction)."""

        def __init__(self, table: VirtualTable, column: int | None, reverse: bool) -> None:
            super().__init__()
            self.table = table
            self.column = column
            self.reverse = reverse

        @property
        def control(self) -> VirtualTable:
            return self.table

    def __init__(
        self,
        columns: Sequence[Column],
        *,
        id: str | None = None,
        classes: str | None = None,
        sortable: bool = True,
        open_label: str = "Open",
    ) -> None:
        super().__init__(id=id, classes=classes)
        # What Enter does here, as the footer and `?` say it ("Open group", "Open rollout").
        relabel_binding(self, "enter", open_label)
        self.columns = list(columns)
        self.sortable = sortable
        self.sort_column: int | None = None
        self.sort_reverse = False
        self._data: list[Sequence[Cell]] = []  # rows in the order given
        self._keys: list[str] | None = None
        self._values: list[Sequence[SortValue]] | None = None
        self.order: list[int] = []  # display position -> index in _data
        self.rows: list[Sequence[Cell]] = []  # rows in display order
        self.cursor_row = 0  # display position of the cursor

    @property
    def line_width(self) -> int:
        """Cells in a full line: each column padded by a space on both sides, but the last."""
        return sum(width + 2 for _, width in self.columns) - 1

    @property
    def row_count(self) -> int:
        return len(self.rows)

    @property
    def cursor_index(self) -> int | None:
        """The cursor's row as an index into the rows given to `set_rows` (None: no rows)."""
        return self.order[self.cursor_row] if self.order else None

    @property
    def cursor_key(self) -> str | None:
        index = self.cursor_index
        return None if index is None or self._keys is None else self._keys[index]

    def set_rows(
        self,
        rows: Sequence[Sequence[Cell]],
        cursor: int | None = None,
        *,
        keys: Sequence[str] | None = None,
        sort_values: Sequence[Sequence[SortValue]] | None = None,
    ) -> None:
        """Replace every row (cheap: nothing is measured). The cursor goes to row `cursor` (an
        index into `rows`); without one it stays on the same key when rows have keys, else on
        the first row. `sort_values` gives exact per-column sort values (default: `sort_value`
        of each cell)."""
        keep = self.cursor_key if cursor is None and keys is not None else None
        self._data = list(rows)
        self._keys = list(keys) if keys is not None else None
        self._values = list(sort_values) if sort_values is not None else None
        self._apply_order()
        target = cursor
        if keep is not None and self._keys is not None and keep in self._keys:
            target = self._keys.index(keep)
        self.cursor_row = self.order.index(target) if target is not None and 0 <= target < len(rows) else 0
        self.virtual_size = Size(self.line_width, len(rows) + 1)
        self._cursor_into_view()
        self.refresh()
        if rows:
            self._post_highlight()

    def _apply_order(self) -> None:
        count = len(self._data)
        column = self.sort_column
        if column is None:
            self.order = list(range(count))
        else:
            values = [
                self._values[i][column] if self._values is not None else sort_value(self._data[i][column])
                for i in range(count)
            ]
            self.order = _ordering(values, self.sort_reverse)
        self.rows = [self._data[i] for i in self.order]

    def sort_by(self, column: int | None, reverse: bool = False) -> None:
        """Sort by `column` (None: the order rows were given in); the cursor keeps its row."""
        keep = self.cursor_index
        self.sort_column, self.sort_reverse = column, reverse
        self._apply_order()
        if keep is not None:
            self.cursor_row = self.order.index(keep)
        self._cursor_into_view()
        self.refresh()
        self.post_message(VirtualTable.Sorted(self, column, reverse))

    def select_key(self, key: str) -> bool:
        """Move the cursor to the row with `key`; False when no row has it."""
        if self._keys is None or key not in self._keys:
            return False
        self.move_cursor(self.order.index(self._keys.index(key)))
        return True

    def move_cursor(self, row: int, animate: bool = False) -> None:
        """Move the cursor to display position `row` (clamped)."""
        if not self.rows:
            return
        row = max(0, min(row, len(self.rows) - 1))
        changed, before, top = row != self.cursor_row, self.cursor_row, self.scroll_offset.y
        self.cursor_row = row
        self._cursor_into_view()
        if self.scroll_offset.y == top:  # only two lines changed: redraw just those (scrolling stays cheap)
            self.refresh_line(before + 1)
            self.refresh_line(row + 1)
        else:
            self.refresh()
        if changed:
            self._post_highlight()

    def _post_highlight(self) -> None:
        index = self.cursor_index
        if index is not None:
            self.post_message(VirtualTable.Highlighted(self, index))

    def _cursor_into_view(self) -> None:
        visible = max(1, self.scrollable_content_region.height - 1)  # minus the header line
        top = self.scroll_offset.y
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + visible:
            self.scroll_to(y=self.cursor_row - visible + 1, animate=False, immediate=True)

    # ----- keys and mouse ------------------------------------------------------------------
    def action_cursor(self, step: int) -> None:
        self.move_cursor(self.cursor_row + step)

    def action_page(self, direction: int) -> None:
        self.move_cursor(self.cursor_row + direction * max(1, self.scrollable_content_region.height - 2))

    def action_first(self) -> None:
        self.move_cursor(0)

    def action_last(self) -> None:
        self.move_cursor(len(self.rows) - 1)

    def action_select(self) -> None:
        index = self.cursor_index
        if index is not None:
            self.post_message(VirtualTable.Selected(self, index))

    def action_sort(self) -> None:
        """Cycle the sort column: given order, first column, second, ..., given order again."""
        if not self.sortable:
            return
        column = 0 if self.sort_column is None else self.sort_column + 1
        self.sort_by(column if column < len(self.columns) else None)

    def action_reverse_sort(self) -> None:
        if self.sortable and self.sort_column is not None:
            self.sort_by(self.sort_column, not self.sort_reverse)

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:  # the header: sort by the clicked column (again: reverse it)
            column = self._column_at(event.x + self.scroll_offset.x)
            if self.sortable and column is not None:
                self.sort_by(column, not self.sort_reverse if column == self.sort_column else False)
            return
        row = self.scroll_offset.y + event.y - 1
        if 0 <= row < len(self.rows):
            self.move_cursor(row)
            if event.chain >= 2:
                self.action_select()

    def _column_at(self, x: int) -> int | None:
        left = 0
        for position, (_, width) in enumerate(self.columns):
            left += width + 2
            if x < left:
                return position
        return None

    # ----- drawing ---------------------------------------------------------------------------
    def header_labels(self) -> list[str]:
        """Column labels, the sorted one followed by ▲ (ascending) or ▼ (descending). A label that
        fills its column keeps every letter: its arrow goes into the space after the column
        (`_line`), never over the label's last letter."""
        labels = [label for label, _ in self.columns]
        if self.sort_column is not None and self.sort_column < len(labels):
            labels[self.sort_column] += "▼" if self.sort_reverse else "▲"
        return labels

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self.rich_style
        if y == 0:
            header = self.get_component_rich_style("virtual-table--header")
            return self._line(self.header_labels(), base + header, width, spill=self.sort_column)
        row = self.scroll_offset.y + y - 1
        if row >= len(self.rows):
            return Strip.blank(width, base)
        style = (
            base + self.get_component_rich_style("virtual-table--cursor") if row == self.cursor_row else base
        )
        return self._line(self.rows[row], style, width)

    def _line(self, cells: Sequence[Cell], style: Style, width: int, spill: int | None = None) -> Strip:
        """One line of cells, each cut to its column. Column `spill` may run one cell into the
        space after it (a header label with its sort arrow)."""
        line = Text(no_wrap=True)
        last = len(self.columns) - 1
        for position, ((_, column_width), cell) in enumerate(zip(self.columns, cells, strict=False)):
            piece = cell.copy() if isinstance(cell, Text) else Text(str(cell))
            spills = position == spill and piece.cell_len > column_width
            piece.truncate(column_width + spills, overflow="ellipsis", pad=True)
            line.append(" ")
            line.append_text(piece)
            if position < last and not spills:
                line.append(" ")
        segments = Segment.apply_style(line.render(self.app.console), style)
        return (
            Strip(segments)
            .crop(self.scroll_offset.x, self.scroll_offset.x + width)
            .adjust_cell_length(width, style)
        )
