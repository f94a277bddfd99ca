"""A `VirtualTable` that knows what it is called and what it says when it has no rows.

- `where`: the name `?` gives the part of the screen where the table's keys work ("groups
  table"), and `open_label` what its Enter does there ("Open group"), readable without focus.
- `empty`: the line drawn under the header while there are no rows ("no groups match ..."), so
  an empty table never looks like one that is still loading or broken.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.style import Style
from rich.text import Text
from textual.strip import Strip

from workbench.tui.widgets.virtual_table import Column, VirtualTable

EMPTY_STYLE = Style(italic=True, dim=True)


class LabelledTable(VirtualTable):
    """A `VirtualTable` with a `where` name, its Enter label, and a message for no rows."""

    def __init__(
        self,
        columns: Sequence[Column],
        *,
        id: str | None = None,
        classes: str | None = None,
        sortable: bool = True,
        open_label: str = "Open",
        where: str = "table",
        empty: str = "nothing to show",
    ) -> None:
        super().__init__(columns, id=id, classes=classes, sortable=sortable, open_label=open_label)
        self.open_label = open_label
        self.where = where
        self._empty = empty

    @property
    def empty(self) -> str:
        """What the table says while it has no rows."""
        return self._empty

    @empty.setter
    def empty(self, text: str) -> None:
        if text != self._empty:
            self._empty = text
            if not self.rows:
                self.refresh()

    def render_line(self, y: int) -> Strip:
        if y == 0 or self.rows:
            return super().render_line(y)
        width = self.scrollable_content_region.width
        base = self.rich_style
        lines = Text(self._empty, style=EMPTY_STYLE).wrap(self.app.console, max(width - 2, 1))
        if y - 1 >= len(lines):
            return Strip.blank(width, base)
        line = Text(" ").append_text(lines[y - 1])
        return (
            Strip(list(line.render(self.app.console)), line.cell_len)
            .apply_style(base)
            .adjust_cell_length(width, base)
        )
