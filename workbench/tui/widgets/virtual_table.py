"""A table that renders only the rows on screen (Textual's Line API).

`DataTable` measures every cell of every row when rows are added (about a second for a few
thousand rows), which would make opening a 10,000-rollout run slow. This table has fixed
column widths, so adding rows costs nothing and drawing costs only the visible lines. It keeps
a row cursor, scrolls it into view, and posts `Highlighted` / `Selected` with the row index.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

Cell = str | Text
Column = tuple[str, int]  # (label, width in cells)


class VirtualTable(ScrollView, can_focus=True):
    """Fixed-width columns, one line per row, a header line, a row cursor."""

    COMPONENT_CLASSES = {"virtual-table--header", "virtual-table--cursor"}
    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "first", "First", show=False),
        Binding("end", "last", "Last", show=False),
        Binding("enter", "select", "Open"),
    ]

    class _RowMessage(Message):
        def __init__(self, table: VirtualTable, index: int) -> None:
            super().__init__()
            self.table = table
            self.index = index

        @property
        def control(self) -> VirtualTable:
            return self.table

    class Highlighted(_RowMessage):
        """The cursor moved to row `index`."""

    class Selected(_RowMessage):
        """Enter (or a double click) on row `index`."""

    def __init__(self, columns: Sequence[Column], *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.columns = list(columns)
        self.rows: list[Sequence[Cell]] = []
        self.cursor_row = 0

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def set_rows(self, rows: list[Sequence[Cell]], cursor: int = 0) -> None:
        """Replace every row (cheap: nothing is measured) and put the cursor on `cursor`."""
        self.rows = rows
        self.virtual_size = Size(sum(width + 2 for _, width in self.columns), len(rows) + 1)
        self.cursor_row = max(0, min(cursor, len(rows) - 1))
        self._cursor_into_view()
        self.refresh()
        if rows:
            self.post_message(VirtualTable.Highlighted(self, self.cursor_row))

    def move_cursor(self, row: int, animate: bool = False) -> None:
        if not self.rows:
            return
        row = max(0, min(row, len(self.rows) - 1))
        changed = row != self.cursor_row
        self.cursor_row = row
        self._cursor_into_view()
        self.refresh()
        if changed:
            self.post_message(VirtualTable.Highlighted(self, row))

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
        if self.rows:
            self.post_message(VirtualTable.Selected(self, self.cursor_row))

    def on_click(self, event: events.Click) -> None:
        index = self.scroll_offset.y + event.y - 1
        if 0 <= index < len(self.rows):
            self.move_cursor(index)
            if event.chain >= 2:
                self.action_select()

    # ----- drawing ---------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self.rich_style
        if y == 0:
            header = self.get_component_rich_style("virtual-table--header")
            return self._line([label for label, _ in self.columns], base + header, width)
        index = self.scroll_offset.y + y - 1
        if index >= len(self.rows):
            return Strip.blank(width, base)
        style = base + self.get_component_rich_style("virtual-table--cursor") if index == self.cursor_row else base
        return self._line(self.rows[index], style, width)

    def _line(self, cells: Sequence[Cell], style: Style, width: int) -> Strip:
        line = Text(no_wrap=True)
        for (_, column_width), cell in zip(self.columns, cells, strict=False):
            piece = cell.copy() if isinstance(cell, Text) else Text(str(cell))
            piece.truncate(column_width, overflow="ellipsis", pad=True)
            line.append(" ")
            line.append_text(piece)
            line.append(" ")
        segments = Segment.apply_style(line.render(self.app.console), style)
        return Strip(segments).adjust_cell_length(width, style)
