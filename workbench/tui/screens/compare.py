"""Compare two eval runs side by side: reward per example in each, the difference, and which
examples flipped (fixed: failed in A, solved in B; broke: the reverse)."""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Static

from workbench.tui.data.compare import Comparison, ExampleDiff, compare_groups
from workbench.tui.data.rollout_index import RolloutIndex
from workbench.tui.data.runs import RunInfo
from workbench.tui.screens.base import WorkbenchScreen
from workbench.tui.widgets.format import clip, num, reward_text
from workbench.tui.widgets.virtual_table import VirtualTable

FLIP_STYLE = {"fixed": "bold green", "broke": "bold red"}


class CompareScreen(WorkbenchScreen):
    BINDINGS = [
        Binding("f", "flipped", "Flipped only"),
        Binding("a", "open('a')", "Open in A"),
        Binding("b", "open('b')", "Open in B"),
    ]

    def __init__(self, a: RunInfo, b: RunInfo, labels: tuple[str, str] | None = None) -> None:
        super().__init__()
        self.a, self.b = a, b
        self.labels = labels or (f"{a.model} {a.run_id[-4:]}", f"{b.model} {b.run_id[-4:]}")
        self.comparison: Comparison | None = None
        self.flipped_only = False
        self.shown: list[ExampleDiff] = []

    def compose(self) -> ComposeResult:
        yield Static(id="compare-title", classes="screen-title")
        yield VirtualTable((("example", 7), (f"A {clip(self.labels[0], 12)}", 14), (f"B {clip(self.labels[1], 12)}", 14),
                            ("B - A", 7), ("flip", 6)), id="compare-table")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(VirtualTable).focus()
        self.load()

    @work(group="compare")
    async def load(self) -> None:
        def read() -> Comparison:
            sides = []
            for run in (self.a, self.b):
                index = RolloutIndex(run.path / "results.jsonl")
                index.refresh()
                sides.append(index.groups())
            return compare_groups(*sides)

        self.comparison = await asyncio.to_thread(read)
        if not self.closing:
            self._render_rows()

    def _render_rows(self) -> None:
        comparison = self.comparison
        if comparison is None:
            return
        self.query_one("#compare-title", Static).update(
            f"[b]Compare[/b] · {self.a.env} · A: {self.labels[0]} ({num(comparison.mean_a)}) → "
            f"B: {self.labels[1]} ({num(comparison.mean_b)})\n"
            f"{comparison.shared} shared examples · [green]{comparison.count('fixed')} fixed[/] · "
            f"[red]{comparison.count('broke')} broke[/] · {comparison.better} better · {comparison.worse} worse"
            + (" · showing flipped only" if self.flipped_only else ""))
        self.shown = [row for row in comparison.rows if row.flip or not self.flipped_only]
        cells = []
        for row in self.shown:
            delta = row.delta
            delta_text = Text("-" if delta is None else f"{delta:+.3f}",
                              style="" if delta is None or abs(delta) < 1e-9 else "green" if delta > 0 else "red")
            cells.append((str(row.example_id), reward_text(row.a), reward_text(row.b), delta_text,
                          Text(row.flip, style=FLIP_STYLE.get(row.flip, ""))))
        self.query_one(VirtualTable).set_rows(cells)

    def action_flipped(self) -> None:
        self.flipped_only = not self.flipped_only
        self._render_rows()

    def _current_example(self) -> int | None:
        table = self.query_one(VirtualTable)
        return self.shown[table.cursor_row].example_id if self.shown else None

    @on(VirtualTable.Selected)
    def _selected(self) -> None:
        self.action_open("b")

    def action_open(self, side: str) -> None:
        example = self._current_example()
        run = self.a if side == "a" else self.b
        if example is not None:
            self.open("rollouts", run.path / "results.jsonl", run=run, focus_example=example)
