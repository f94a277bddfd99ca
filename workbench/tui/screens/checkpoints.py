"""Checkpoints of a training run: step, save time (from its manifest), reward at that step, size,
and what evaluating it gave (`evaluated`: the newest eval's reward, a running eval's progress, or
`queued` while a sweep gets to it); evaluate one (launches `workbench eval run ENV -m
<checkpoint>`) or sweep them all, once confirmed (`--checkpoints all`: the base model and every
checkpoint on the same examples, drawn as reward by step), and compare two evals of the run's
checkpoints (or of its base model) side by side."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label, Select, Static

from workbench.store.checkpoints import CheckpointInfo, list_checkpoint_infos
from workbench.store.sweeps import BASE, SweepPoint, newest_sweep
from workbench.tui.data.checkpoints import (
    BASE_LABEL,
    SweepPlan,
    cell_reward,
    evals_of_run,
    evaluated_cell,
    sweep_plan,
)
from workbench.tui.data.runs import RunCatalog, RunInfo, parse_time
from workbench.tui.data.training import format_size
from workbench.tui.launcher import LaunchSpec, eval_args
from workbench.tui.screens.base import WorkbenchScreen
from workbench.tui.widgets.format import num, reward_text, status_text, when
from workbench.tui.widgets.metric_plot import MetricPlot
from workbench.tui.widgets.virtual_table import VirtualTable

CHECKPOINT_COLUMNS = (
    ("step", 6),
    ("saved", 11),
    ("reward", 6),
    ("eval", 6),
    ("size", 9),
    ("evaluated", 9),
)
EVALS_TITLE = "Evals of these checkpoints and the base model · space: mark · c: compare"
EVAL_COLUMNS = (("✓", 1), ("model", 13), ("status", 8), ("progress", 9), ("reward", 6), ("started", 11))


def _step_order(label: str) -> float:
    """'base' before 'step 1' before 'step 10' when sorting by model."""
    try:
        return -1.0 if label == "base" else float(label.removeprefix("step "))
    except ValueError:
        return float("inf")


class EvalCheckpointScreen(ModalScreen[LaunchSpec | None]):
    """Asks env, examples and rollouts for an eval of one checkpoint, or (`run_dir` given
    instead) for a sweep of the base model and every checkpoint of that run."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "go", "Launch", priority=True)]

    def __init__(
        self, checkpoint: CheckpointInfo | None, envs: list[str], run_dir: Path | None = None
    ) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.envs = envs or ["reverse-text"]
        self.run_dir = run_dir

    def compose(self) -> ComposeResult:
        with Vertical(id="eval-ckpt-box") as box:
            box.border_title = (
                f"Evaluate checkpoint step {self.checkpoint.step}"
                if self.checkpoint is not None
                else "Sweep: the base model and every checkpoint, same examples and seed"
            )
            with Horizontal(classes="field"):
                yield Label("environment", classes="field-label")
                yield Select(
                    [(e, e) for e in self.envs],
                    value=self.envs[0],
                    allow_blank=False,
                    id="ck-env",
                    compact=True,
                )
            with Horizontal(classes="field"):
                yield Label("examples (-n)", classes="field-label")
                yield Input("20", type="integer", id="ck-n", compact=True)
            with Horizontal(classes="field"):
                yield Label("rollouts (-r)", classes="field-label")
                yield Input("4", type="integer", id="ck-r", compact=True)
            yield Button("Launch eval (ctrl+s)", id="ck-go", variant="primary", compact=True)

    @on(Button.Pressed, "#ck-go")
    @on(Input.Submitted)
    def action_go(self) -> None:
        try:
            n = int(self.query_one("#ck-n", Input).value)
            r = int(self.query_one("#ck-r", Input).value)
        except ValueError:
            self.notify("examples and rollouts must be numbers", severity="error")
            return
        env = str(self.query_one("#ck-env", Select).value)
        if self.checkpoint is None and self.run_dir is not None:
            args = eval_args(env, str(self.run_dir.resolve()), n, r, ["--checkpoints", "all"])
            self.dismiss(LaunchSpec("eval", args, env, "checkpoint sweep"))
            return
        assert self.checkpoint is not None
        model = str(self.checkpoint.path.resolve())
        self.dismiss(LaunchSpec("eval", eval_args(env, model, n, r), env, f"step {self.checkpoint.step}"))

    def action_cancel(self) -> None:
        self.dismiss(None)


class CheckpointsScreen(WorkbenchScreen):
    BINDINGS = [
        Binding("e", "evaluate", "Evaluate checkpoint"),
        Binding("s", "sweep", "Sweep all"),
        Binding("space", "mark", "Mark eval"),
        Binding("c", "compare", "Compare marked"),
    ]

    def __init__(self, run: RunInfo) -> None:
        super().__init__()
        self.run = run
        self.checkpoints: list[CheckpointInfo] = []
        self.evals: list[tuple[str, RunInfo]] = []
        self.sweep: list[SweepPoint] = []
        self.marked: set[str] = set()
        self.plan: SweepPlan | None = None  # a sweep of this run going on (launched from this TUI)
        self._catalog: RunCatalog | None = None
        self._scanning = False

    def compose(self) -> ComposeResult:
        yield Static(
            f"[b]Checkpoints[/b] · {self.run.env} · {self.run.model} · [dim]{self.run.run_id}[/]",
            classes="screen-title",
        )
        with Horizontal(id="ckpt-top"):
            yield VirtualTable(CHECKPOINT_COLUMNS, id="ckpt-table", open_label="Evaluate")
            yield MetricPlot("sweep reward (base at step 0) · s: sweep", id="sweep-plot")
        yield Static(id="sweep-status", classes="hint")
        yield Static(EVALS_TITLE, id="evals-title", classes="section-title")
        yield VirtualTable(EVAL_COLUMNS, id="ckpt-evals", open_label="Open eval")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#ckpt-table", VirtualTable).focus()
        self._catalog = RunCatalog(self.wb.root)
        self.refresh_data()
        self.set_interval(max(2.0, self.wb.poll_s), self.refresh_data)

    @work(group="checkpoints")
    async def refresh_data(self) -> None:
        if self._scanning:
            return
        self._scanning = True
        try:
            checkpoints, evals, sweep, plan = await asyncio.to_thread(self._read)
        finally:
            self._scanning = False
        if self.closing:
            return
        self.checkpoints, self.evals, self.plan = checkpoints, evals, plan
        self._render_checkpoints()
        self._render_evals()
        self.sweep = sweep
        steps = [0.0 if p.step == BASE else float(p.step) for p in sweep]
        plot = self.query_one("#sweep-plot", MetricPlot)
        plot.display = bool(sweep)
        plot.show([("reward", steps, [p.reward_mean for p in sweep])])

    def _read(
        self,
    ) -> tuple[list[CheckpointInfo], list[tuple[str, RunInfo]], list[SweepPoint], SweepPlan | None]:
        assert self._catalog is not None
        runs = self._catalog.scan()
        launcher, plan = self.wb.launcher, None
        for launch in launcher.launches():  # newest first: the newest sweep of this run still going
            started = parse_time(launch.started_at)
            if started is not None and launcher.is_running(launch):
                plan = sweep_plan(launch.args, self.run.path, self.wb.root, started.timestamp())
                if plan is not None:
                    break
        return (
            list_checkpoint_infos(self.run.path),
            evals_of_run(runs, self.run, self.wb.root, self._catalog.sweep_labels(self.run.path)),
            newest_sweep(self.run.path),
            plan,
        )

    def _render_checkpoints(self) -> None:
        """The checkpoint table, its `evaluated` column included (it moves while a sweep runs)."""
        cells = {c.step: evaluated_cell(f"step {c.step}", self.evals, self.plan) for c in self.checkpoints}
        self.query_one("#ckpt-table", VirtualTable).set_rows(
            [
                (
                    str(c.step),
                    when(c.saved_at),
                    reward_text(c.reward),
                    num(c.eval_reward),
                    format_size(c.size_bytes),
                    evaluated_text(cells[c.step]),
                )
                for c in self.checkpoints
            ],
            keys=[str(c.step) for c in self.checkpoints],
            sort_values=[
                (
                    float(c.step),
                    c.saved_at.timestamp() if c.saved_at else None,
                    c.reward,
                    c.eval_reward,
                    float(c.size_bytes) if c.size_bytes is not None else None,
                    cell_reward(cells[c.step]),
                )
                for c in self.checkpoints
            ],
        )
        base = evaluated_cell(BASE_LABEL, self.evals, self.plan)
        done = sum(cell_reward(cell) is not None for cell in cells.values())
        line = self.query_one("#sweep-status", Static)
        line.display = self.plan is not None or base != "-"  # nothing to say: no line
        line.update(
            f"sweep running: {done} of {len(cells)} checkpoints evaluated · base model {base}"
            if self.plan is not None
            else f"base model {base} (its newest eval)"
        )

    def _render_evals(self) -> None:
        self.query_one("#ckpt-evals", VirtualTable).set_rows(
            [
                (
                    "●" if run.key in self.marked else " ",
                    label,
                    status_text(run.status),
                    run.progress,
                    reward_text(run.reward),
                    when(run.created_at),
                )
                for label, run in self.evals
            ],
            keys=[run.key for _, run in self.evals],
            sort_values=[
                (
                    "●" if run.key in self.marked else None,
                    _step_order(label),
                    run.status,
                    run.done / run.total if run.done is not None and run.total else None,
                    run.reward,
                    run.created_at.timestamp() if run.created_at else None,
                )
                for label, run in self.evals
            ],
        )
        title = self.query_one("#evals-title", Static)
        if not self.checkpoints:
            title.update(Text("no complete checkpoints yet", style="dim"))
        elif not self.evals:
            title.update(
                Text("no evals of these checkpoints yet · e: evaluate one · s: sweep them all", style="dim")
            )
        else:  # the first evals arrived (a sweep): "no evals yet" must not stay above them
            title.update(EVALS_TITLE)

    def _current_eval(self) -> RunInfo | None:
        index = self.query_one("#ckpt-evals", VirtualTable).cursor_index
        return None if index is None or index >= len(self.evals) else self.evals[index][1]

    def action_evaluate(self) -> None:
        index = self.query_one("#ckpt-table", VirtualTable).cursor_index
        if not self.checkpoints or index is None:
            self.notify("no checkpoints yet", severity="warning")
            return
        checkpoint = self.checkpoints[index]
        envs = self.run.metadata.get("env_ids") or ([self.run.env] if self.run.env != "-" else [])

        def launch(spec: LaunchSpec | None) -> None:
            if spec is None:
                return
            launch = self.wb.launcher.start(spec)
            self.notify(f"started: {launch.command}", title="evaluating checkpoint")
            self.refresh_data()

        self.app.push_screen(EvalCheckpointScreen(checkpoint, [str(e) for e in envs]), launch)

    def action_sweep(self) -> None:
        if not self.checkpoints:
            self.notify("no checkpoints yet", severity="warning")
            return
        envs = self.run.metadata.get("env_ids") or ([self.run.env] if self.run.env != "-" else [])

        def confirm(spec: LaunchSpec | None) -> None:
            if spec is None:
                return
            n, r = int(spec.args[spec.args.index("-n") + 1]), int(spec.args[spec.args.index("-r") + 1])
            points = len(self.checkpoints) + 1
            self.open(
                "confirm",
                f"Sweep the base model and {len(self.checkpoints)} checkpoints of {self.run.run_id}: "
                f"{points} evals of {n} examples x {r} rollouts ({points * n * r} rollouts), one after "
                f"another; points already evaluated with these settings are skipped.\n{spec.command}",
                title="Sweep checkpoints",
                yes="Sweep",
                no="Cancel",
                callback=lambda yes: launch(spec) if yes is True else None,
            )

        def launch(spec: LaunchSpec) -> None:
            self.notify(f"started: {self.wb.launcher.start(spec).command}", title="sweeping checkpoints")
            self.refresh_data()

        self.app.push_screen(
            EvalCheckpointScreen(None, [str(e) for e in envs], run_dir=self.run.path), confirm
        )

    def action_mark(self) -> None:
        # focused now, not on the next message (`focus()`): a key pressed right after space (Down,
        # to mark the next eval) must already move the evals table's cursor, not the checkpoints'
        self.set_focus(self.query_one("#ckpt-evals", VirtualTable))
        run = self._current_eval()
        if run is None:
            return
        self.marked ^= {run.key}
        self._render_evals()

    def action_compare(self) -> None:
        chosen = [(label, run) for label, run in self.evals if run.key in self.marked]
        if len(chosen) != 2:
            self.notify("mark exactly two evals with space, then press c", severity="warning")
            return
        (label_a, a), (label_b, b) = sorted(  # older as A; a sweep's evals start within a second: by step
            chosen,
            key=lambda item: (
                item[1].created_at.timestamp() if item[1].created_at else 0,
                _step_order(item[0]),
            ),
        )
        self.open("compare", a, b, labels=(label_a, label_b))

    @on(VirtualTable.Selected, "#ckpt-table")
    def _checkpoint_chosen(self, event: VirtualTable.Selected) -> None:
        self.action_evaluate()

    @on(VirtualTable.Selected, "#ckpt-evals")
    def action_open_eval(self) -> None:
        run = self._current_eval()
        if run is not None:
            self.open("rollouts", run.path / "results.jsonl", run=run)


def evaluated_text(cell: str) -> Text:
    """An `evaluated` cell: a reward in its color, a running eval bold, `queued` dim."""
    reward = cell_reward(cell)
    if reward is not None:
        return reward_text(reward)
    return Text(cell, style="bold" if cell.startswith("▸") else "dim")
