"""GEPA run: candidates with scores, the Pareto frontier (per validation example: best score and
the candidates reaching it), the best prompt, and its diff against the seed prompt. Runs of the
DSPy optimizers show the same way, their name in the title and each candidate's few-shot turns
under its prompt. A run that is an arm of `workbench gepa compare` gets a Compare tab: every arm's
held-out gain (RL's too) against the rollouts it spent."""

from __future__ import annotations

import asyncio
from typing import Any

from rich.markup import escape
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static, TabbedContent, TabPane

from workbench.store.comparisons import Comparison, comparison_of
from workbench.tui.data.gepa import GepaRun, few_shot_lines, load_gepa_run
from workbench.tui.data.runs import RunInfo
from workbench.tui.screens.base import WorkbenchScreen
from workbench.tui.widgets.comparison_bars import ComparisonBars
from workbench.tui.widgets.format import clip, num, reward_text
from workbench.tui.widgets.virtual_table import VirtualTable

CANDIDATE_COLUMNS = (("#", 3), ("score", 6), ("parents", 7), ("calls", 6), ("prompt", 40))
PARETO_COLUMNS = (("example", 8), ("best", 6), ("candidates reaching it", 50))


def diff_text(lines: list[str]) -> Text:
    text = Text()
    for line in lines:
        style = (
            "bold"
            if line.startswith(("---", "+++"))
            else "green"
            if line.startswith("+")
            else "red"
            if line.startswith("-")
            else "cyan"
            if line.startswith("@@")
            else ""
        )
        text.append(line + "\n", style=style)
    return text


def candidate_view(prompt: str | None, turns: list[dict[str, Any]]) -> Text:
    """A candidate's prompt, then its few-shot turns (if any) below it: a bold heading, each role in cyan."""
    text = Text(prompt) if prompt else Text("-", style="dim")
    lines = few_shot_lines(turns)
    if lines:
        text.append("\n\n" + lines[0] + "\n", style="bold")
        for line in lines[1:]:
            role, sep, rest = line.partition(": ")
            if sep and not line.startswith("    "):  # a message's first line: its role in colour
                text.append(role + sep, style="cyan")
                text.append(rest + "\n")
            else:
                text.append(line + "\n")
    return text


def prompt_cell(prompt: str | None, turns: list[dict[str, Any]], width: int) -> str:
    """The candidates table's prompt column: the prompt's first line, and how many few-shot
    messages come with it."""
    stripped = (prompt or "").strip()
    first_line = stripped.splitlines()[0] if stripped else "-"
    if not turns:
        return clip(first_line, width)
    tag = f" +{len(turns)} turns"
    return clip(first_line, max(width - len(tag), 8)) + tag


class GepaScreen(WorkbenchScreen):
    BINDINGS = [
        Binding("1", "tab('candidates')", "Candidates"),
        Binding("2", "tab('pareto')", "Pareto"),
        Binding("3", "tab('best')", "Best prompt"),
        Binding("4", "tab('diff')", "Diff"),
        Binding("5", "tab('compare')", "Compare"),  # only when the run is in a comparison
        Binding("t", "logs", "Log", show=False),
    ]

    def __init__(self, run: RunInfo) -> None:
        super().__init__()
        self.run = run
        self.gepa: GepaRun | None = None
        self.comparison: Comparison | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="gepa-title", classes="screen-title")
        with TabbedContent(id="gepa-tabs"):
            with TabPane("Candidates", id="candidates"):
                yield VirtualTable(CANDIDATE_COLUMNS, id="gepa-candidates", open_label="Show prompt")
            with TabPane("Pareto", id="pareto"):
                yield VirtualTable(PARETO_COLUMNS, id="gepa-pareto")
            with TabPane("Best prompt", id="best"):
                with VerticalScroll():
                    yield Static(id="gepa-best", classes="prompt-text")
            with TabPane("Diff", id="diff"):
                with VerticalScroll():
                    yield Static(id="gepa-diff", classes="prompt-text")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#gepa-candidates", VirtualTable).focus()
        self.load()
        if self.run.is_live:
            self.set_interval(max(2.0, self.wb.poll_s), self.load)

    @work(group="gepa")
    async def load(self) -> None:
        gepa, comparison = await asyncio.to_thread(
            lambda: (load_gepa_run(self.run.path), comparison_of(self.run.path))
        )
        if self.closing:
            return
        if comparison is not None:
            await self._show_comparison(comparison)
        self.gepa = gepa
        best = gepa.best_index
        demos = (
            f" · demos as {escape(str(gepa.metadata['demos_as']))}" if gepa.metadata.get("demos_as") else ""
        )
        self.query_one("#gepa-title", Static).update(
            f"[b]{escape(gepa.optimizer_name)}[/b] · {self.run.env} · {self.run.model} · {gepa.status}{demos}\n"
            f"seed {num(gepa.seed_score)} → best {num(gepa.best_score)} · {len(gepa.candidates)} candidates · "
            f"{gepa.metric_calls if gepa.metric_calls is not None else '-'} metric calls"
        )
        rows = []
        for c in gepa.candidates:
            marker = Text(f"{c.index}", style="bold green" if c.index == best else "")
            rows.append(
                (
                    marker,
                    reward_text(c.score),
                    ",".join(map(str, c.parents)) or "-",
                    "-" if c.metric_calls is None else str(c.metric_calls),
                    prompt_cell(c.prompt, c.few_shot, 40),
                )
            )
        self.query_one("#gepa-candidates", VirtualTable).set_rows(
            rows, keys=[str(c.index) for c in gepa.candidates]
        )
        self.query_one("#gepa-pareto", VirtualTable).set_rows(
            [
                (row.example, reward_text(row.best_score), clip(", ".join(row.candidates) or "-", 50))
                for row in gepa.frontier
            ],
            keys=[str(row.example) for row in gepa.frontier],
        )
        self.query_one("#gepa-best", Static).update(candidate_view(gepa.best_prompt, gepa.best_few_shot))
        diff = gepa.prompt_diff()
        self.query_one("#gepa-diff", Static).update(
            diff_text(diff)
            if diff
            else Text("- (no seed or best prompt yet, or they are identical)", style="dim")
        )

    async def _show_comparison(self, comparison: Comparison) -> None:
        """The Compare tab (added the first time), with every arm of the comparison."""
        if self.comparison is None:
            bars = ComparisonBars(id="gepa-compare")
            await self.query_one(TabbedContent).add_pane(
                TabPane("Compare", VerticalScroll(bars), id="compare")
            )
            self.refresh_bindings()
        self.comparison = comparison
        self.query_one("#gepa-compare", ComparisonBars).show(comparison, self.run.path)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "tab" and parameters == ("compare",):
            return self.comparison is not None
        return True

    @on(VirtualTable.Selected, "#gepa-candidates")
    def _candidate_chosen(self, event: VirtualTable.Selected) -> None:
        """Enter on a candidate: its whole prompt, on the prompt tab (the best one is shown otherwise)."""
        if self.gepa is None or event.index >= len(self.gepa.candidates):
            return
        candidate = self.gepa.candidates[event.index]
        self.query_one("#gepa-best", Static).update(
            Text.assemble(
                (f"candidate {candidate.index} · score {num(candidate.score)}\n\n", "bold"),
                candidate_view(candidate.prompt or "-", candidate.few_shot),
            )
        )
        self.action_tab("best")

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def action_logs(self) -> None:
        logs = self.wb.launcher.logs_of(self.run)
        if logs:
            live_pid = self.run.pid if self.run.is_live else None
            self.open("log", logs, title=f"gepa · {self.run.run_id}", pid=live_pid)
        else:
            self.notify("no log for this run", severity="warning")
