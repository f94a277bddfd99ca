"""Horizontal text bars: a histogram that stays readable at any terminal size (and in tests)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

BAR = "█"


class BarChart(Static):
    """`show([(label, count), ...])` draws one bar per label, scaled to the widest bar."""

    def __init__(self, *, id: str | None = None, bar_width: int = 24) -> None:
        super().__init__(id=id)
        self.bar_width = bar_width
        self.items: list[tuple[str, int]] = []

    def show(self, items: list[tuple[str, int]], title: str = "") -> None:
        self.items = items
        peak = max((count for _, count in items), default=0) or 1
        table = Table.grid(padding=(0, 1))
        table.add_column(justify="right", style="bold")
        table.add_column()
        table.add_column(justify="right")
        for label, count in items:
            length = round(self.bar_width * count / peak)
            bar = Text(BAR * length or ("▏" if count else ""), style="cyan")
            table.add_row(label, bar, str(count))
        if title:
            self.border_title = title
        self.update(table)
