"""Reward variance: the histogram of within-group reward std, the share of groups too easy / in
range / without signal / too hard, and examples sorted by variance — is this environment ready for RL?
Enter on an example closes the screen with its id (the caller shows its rollouts). Built from
the rollout index's numbers (`index_variance_report`), so it opens as fast as Rollouts does."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Static

from workbench.engine.difficulty import DIFFICULTIES, FLAT_EASY, FLAT_HARD, SIGNAL_STD
from workbench.tui.data.rollout_index import RolloutIndex
from workbench.tui.data.runs import RunInfo
from workbench.tui.data.variance import VarianceReport, difficulty, index_variance_report
from workbench.tui.screens.base import WorkbenchScreen
from workbench.tui.widgets.format import num, reward_text
from workbench.tui.widgets.histogram import BarChart
from workbench.tui.widgets.labelled_table import LabelledTable
from workbench.tui.widgets.prompt_bar import PromptBar
from workbench.tui.widgets.virtual_table import VirtualTable

DIFFICULTY_STYLE = {"too easy": "yellow", "in range": "green", "no signal": "magenta", "too hard": "red"}


class VarianceScreen(WorkbenchScreen):
    BINDINGS = [Binding("number_sign", "jump", "Jump to example")]

    def __init__(
        self,
        path: Path,
        *,
        run: RunInfo | None = None,
        label: str = "results",
        index: RolloutIndex | None = None,
    ) -> None:
        super().__init__()
        self.path = path
        self.run = run
        self.label = label
        self.index = index or RolloutIndex(path)
        self.report: VarianceReport | None = None

    def compose(self) -> ComposeResult:
        run = self.run
        head = f"{run.kind} · {run.env} · {run.model} · " if run else ""
        yield Static(f"[b]Reward variance[/b] · {head}{self.label}", classes="screen-title")
        with Horizontal(id="variance-body"):
            with Vertical(id="variance-left"):
                yield BarChart(id="std-histogram", bar_width=18)
                yield Static(id="variance-shares")
            yield LabelledTable(
                (("example", 7), ("mean", 5), ("std", 5), ("verdict", 9)),
                id="variance-table",
                open_label="Show in Rollouts",
                where="examples table",
                empty="no groups in this run yet",
            )
        yield PromptBar(id="variance-prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#variance-table", VirtualTable).focus()
        self.load()

    @work(group="variance")
    async def load(self) -> None:
        await asyncio.to_thread(self.index.refresh)
        # From the index's group rows: no record is read back, whatever the size of the run.
        report = await asyncio.to_thread(index_variance_report, self.index)
        self.report = report
        if self.closing:
            return
        self.query_one("#std-histogram", BarChart).show(report.histogram, "within-group reward std")
        self.query_one("#variance-shares", Static).update(self._shares(report))
        rows = []
        for group in report.by_variance:
            verdict = difficulty(group)
            rows.append(
                (
                    str(group.example_id),
                    reward_text(group.mean),
                    f"{group.std:.3f}",
                    Text(verdict, style=DIFFICULTY_STYLE[verdict]),
                )
            )
        self.query_one("#variance-table", VirtualTable).set_rows(
            rows, keys=[str(g.example_id) for g in report.by_variance]
        )

    def action_jump(self) -> None:
        self.query_one(PromptBar).ask("jump", "example id (Enter to jump)")

    @on(PromptBar.Answered)
    def _answered(self, event: PromptBar.Answered) -> None:
        value = event.value.strip()
        if not self.query_one("#variance-table", VirtualTable).select_key(value):
            self.notify(f"example {value or '?'} is not in this run", severity="warning")

    @staticmethod
    def _shares(report: VarianceReport) -> Text:
        text = Text()
        text.append(f"{report.num_groups} groups", style="bold")
        text.append(f" · mean reward {num(report.summary.get('reward_mean'))}\n")
        for kind in DIFFICULTIES:
            text.append(f"{kind:>9} ", style=DIFFICULTY_STYLE[kind])
            text.append(f"{report.shares[kind]:>4.0%}  ({report.counts[kind]})\n")
        # The rule in one line, so "no signal" is never read as a verdict on difficulty.
        text.append(
            f"std < {SIGNAL_STD:g}: too hard at mean <= {FLAT_HARD:g}, too easy at >= {FLAT_EASY:g}, "
            "else no signal (same reward every time)\n",
            style="dim",
        )
        zero = report.summary.get("zero_variance_frac")
        if zero is not None:
            text.append(f"zero-variance groups {zero:.0%}\n")
        verdict = report.summary.get("verdict")
        if verdict:
            text.append(str(verdict), style="bold")
        return text

    @on(VirtualTable.Selected, "#variance-table")
    def _chosen(self, event: VirtualTable.Selected) -> None:
        if self.report is not None:
            self.dismiss(self.report.by_variance[event.index].example_id)
