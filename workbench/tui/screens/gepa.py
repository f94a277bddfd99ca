"""GEPA run: candidates with scores, the Pareto frontier (per validation example: best score and
the candidates reaching it), the best prompt, and its diff against the seed prompt."""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static, TabbedContent, TabPane

from workbench.tui.data.gepa import GepaRun, load_gepa_run
from workbench.tui.data.runs import RunInfo
from workbench.tui.screens.base import WorkbenchScreen
from workbench.tui.widgets.format import clip, num, reward_text
from workbench.tui.widgets.virtual_table import VirtualTable

CANDIDATE_COLUMNS = (("#", 3), ("score", 6), ("parents", 7), ("calls", 6), ("prompt", 40))
PARETO_COLUMNS = (("example", 8), ("best", 6), ("candidates reaching it", 50))


def diff_text(lines: list[str]) -> Text:
    text = Text()
    for line in lines:
        style = "bold" if line.startswith(("---", "+++")) else "green" if line.startswith("+") else \
            "red" if line.startswith("-") else "cyan" if line.startswith("@@") else ""
        text.append(line + "\n", style=style)
    return text


class GepaScreen(WorkbenchScreen):
    BINDINGS = [
        Binding("1", "tab('candidates')", "Candidates"),
        Binding("2", "tab('pareto')", "Pareto"),
        Binding("3", "tab('best')", "Best prompt"),
        Binding("4", "tab('diff')", "Diff"),
        Binding("t", "logs", "Log", show=False),
    ]

    def __init__(self, run: RunInfo) -> None:
        super().__init__()
        self.run = run
        self.gepa: GepaRun | None = None

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
        self.gepa = gepa = await asyncio.to_thread(load_gepa_run, self.run.path)
        if self.closing:
            return
        best = gepa.best_index
        self.query_one("#gepa-title", Static).update(
            f"[b]GEPA[/b] · {self.run.env} · {self.run.model} · {gepa.status}\n"
            f"seed {num(gepa.seed_score)} → best {num(gepa.best_score)} · {len(gepa.candidates)} candidates · "
            f"{gepa.metric_calls if gepa.metric_calls is not None else '-'} metric calls")
        rows = []
        for c in gepa.candidates:
            first_line = (c.prompt or "-").strip().splitlines()[0] if (c.prompt or "").strip() else "-"
            marker = Text(f"{c.index}", style="bold green" if c.index == best else "")
            rows.append((marker, reward_text(c.score), ",".join(map(str, c.parents)) or "-",
                         "-" if c.metric_calls is None else str(c.metric_calls), clip(first_line, 40)))
        self.query_one("#gepa-candidates", VirtualTable).set_rows(rows, keys=[str(c.index) for c in gepa.candidates])
        self.query_one("#gepa-pareto", VirtualTable).set_rows(
            [(row.example, reward_text(row.best_score), clip(", ".join(row.candidates) or "-", 50)) for row in gepa.frontier],
            keys=[str(row.example) for row in gepa.frontier])
        self.query_one("#gepa-best", Static).update(Text(gepa.best_prompt) if gepa.best_prompt else Text("-", style="dim"))
        diff = gepa.prompt_diff()
        self.query_one("#gepa-diff", Static).update(
            diff_text(diff) if diff else Text("- (no seed or best prompt yet, or they are identical)", style="dim"))

    @on(VirtualTable.Selected, "#gepa-candidates")
    def _candidate_chosen(self, event: VirtualTable.Selected) -> None:
        """Enter on a candidate: its whole prompt, on the prompt tab (the best one is shown otherwise)."""
        if self.gepa is None or event.index >= len(self.gepa.candidates):
            return
        candidate = self.gepa.candidates[event.index]
        self.query_one("#gepa-best", Static).update(Text.assemble(
            (f"candidate {candidate.index} · score {num(candidate.score)}\n\n", "bold"), candidate.prompt or "-"))
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
