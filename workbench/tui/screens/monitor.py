"""Run monitor for a training run: live curves (reward mean/std, loss, entropy, KL, completion
length, step time), step progress with ETA, the latest sampled rollouts and the log tail.

Polls once a second: `metrics.jsonl` is read incrementally (only appended lines), so a change
shows up within about a second; `metadata.json` gives status and step. The header's rewards are
the newest points of the reward chart (train and held-out), so the two always agree; before the
first step the monitor says what the run is doing (the held-out baseline eval, say), not only
its Log tab.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.widgets import Footer, ProgressBar, Static, TabbedContent, TabPane

from workbench.store.files import read_json
from workbench.tui.data.rollout_index import RolloutIndex
from workbench.tui.data.runs import RunInfo, run_from_metadata
from workbench.tui.data.tail import JsonlTail
from workbench.tui.data.training import (
    CURVES,
    eta_seconds,
    format_duration,
    last_value,
    series,
    start_phase,
    step_rollout_files,
    stop_grace,
)
from workbench.tui.screens.base import WorkbenchScreen
from workbench.tui.widgets.conversation import ConversationView, RewardBreakdown
from workbench.tui.widgets.format import num
from workbench.tui.widgets.groups_table import GroupsTable
from workbench.tui.widgets.log_tail import LogTail
from workbench.tui.widgets.metric_plot import MetricPlot


class TrainMonitorScreen(WorkbenchScreen):
    BINDINGS = [
        Binding("1", "tab('curves')", "Curves"),
        Binding("2", "tab('latest')", "Rollouts"),
        Binding("3", "tab('log')", "Log"),
        Binding("r", "rollouts", "All rollouts", show=False),
        Binding("v", "variance", "Reward variance", show=False),
        Binding("K", "checkpoints", "Checkpoints"),
        Binding("t", "logs", "Full logs", show=False),
        Binding("x", "stop", "Stop"),
    ]

    def __init__(self, run: RunInfo) -> None:
        super().__init__()
        self.run = run
        self.metrics = JsonlTail(run.path / "metrics.jsonl")
        self.latest_step: int | None = None
        self.latest: RolloutIndex | None = None
        self.updates = 0  # polls that changed something (tests wait on it)
        self._polling = False

    def compose(self) -> ComposeResult:
        yield Static(id="monitor-title", classes="screen-title")
        with Horizontal(id="monitor-progress"):
            yield ProgressBar(total=None, show_eta=False, show_percentage=False, id="step-bar")
            yield Static(id="monitor-eta")
        yield Static(id="monitor-phase")
        with TabbedContent(id="monitor-tabs"):
            with TabPane("Curves", id="curves"):
                with Grid(id="curves-grid"):
                    for index, (title, _) in enumerate(CURVES):
                        yield MetricPlot(title, id=f"plot-{index}")
            with TabPane("Latest rollouts", id="latest"):
                yield Static("no sampled rollouts yet", id="latest-title")
                with Horizontal(classes="latest-body"):
                    yield GroupsTable(id="latest-groups")
                    with Vertical(id="latest-detail"):
                        yield RewardBreakdown(id="latest-breakdown")
                        yield ConversationView(id="latest-conversation")
            with TabPane("Log", id="log"):
                yield LogTail(self.run.path / "run.log", classes="log-view")
        yield Footer()

    def on_mount(self) -> None:
        self._render_header()
        self.poll()
        self.set_interval(self.wb.poll_s, self.poll)

    # ----- polling ---------------------------------------------------------------------------
    def on_screen_resume(self) -> None:
        self.poll()

    @work(group="monitor")
    async def poll(self) -> None:
        # One read at a time (the tails are not thread-safe); paused under another screen.
        if self._polling or not self.is_current:
            return
        self._polling = True
        try:
            run, metrics_changed, latest_changed = await asyncio.to_thread(self._read)
        finally:
            self._polling = False
        if self.closing:
            return
        if run is not None:
            self.run = run
        if metrics_changed:
            self._render_curves()
        if latest_changed:
            self._render_latest()
        if run is not None or metrics_changed:
            self._render_header()  # its rewards are the curves' last points
        if metrics_changed or latest_changed:
            self.updates += 1

    def _read(self) -> tuple[RunInfo | None, bool, bool]:
        """Runs in a thread: new metadata, new metric lines, a new latest-step rollouts file."""
        run = None
        try:
            run = run_from_metadata(self.run.path, read_json(self.run.path / "metadata.json"), "train")
        except (OSError, ValueError):
            pass
        metrics_changed = self.metrics.poll()
        steps = step_rollout_files(self.run.path)
        latest_changed = False
        if steps and steps[-1][0] != self.latest_step:
            self.latest_step, path = steps[-1]
            self.latest = RolloutIndex(path)
            latest_changed = True
        if self.latest is not None and self.latest.refresh():
            latest_changed = True
        return run, metrics_changed, latest_changed

    # ----- rendering -------------------------------------------------------------------------
    def _render_header(self) -> None:
        run = self.run
        records = self.metrics.records
        rewards = []
        for key, name in (("reward/mean", "reward"), ("eval/reward_mean", "held-out")):
            point = last_value(records, key)  # where the chart's curve ends
            if point is not None:
                rewards.append(f"{name} {num(point[1])} (step {point[0]:g})")
        if not rewards:
            rewards.append(f"reward {num(run.reward)}")
        self.query_one("#monitor-title", Static).update(
            f"[b]Training[/b] · {run.env} · {run.model} · {run.status} · {' · '.join(rewards)}\n"
            f"[dim]{run.run_id}[/]"
        )
        phase = start_phase(run.metadata, records, run.is_live)
        banner = self.query_one("#monitor-phase", Static)
        banner.display = phase is not None
        banner.update(phase or "")
        bar = self.query_one("#step-bar", ProgressBar)
        if run.total:
            bar.update(total=run.total, progress=run.done or 0)
        eta = eta_seconds(self.metrics.records, run.done, run.total) if run.is_live else None
        _, times = series(self.metrics.records, "time/step")
        pace = f"{sum(times[-10:]) / len(times[-10:]):.1f} s/step" if times else "- s/step"
        waiting = " · baseline eval" if phase is not None and phase.startswith("measuring") else ""
        self.query_one("#monitor-eta", Static).update(
            f"step {run.done if run.done is not None else '-'}/{run.total or '-'}{waiting} · {pace} · "
            f"ETA {format_duration(eta)}"
        )

    def _render_curves(self) -> None:
        for index, (_, keys) in enumerate(CURVES):
            lines = [(label, *series(self.metrics.records, key)) for key, label in keys]
            self.query_one(f"#plot-{index}", MetricPlot).show(lines)

    def _render_latest(self) -> None:
        index = self.latest
        if index is None:
            return
        groups = index.groups()
        self.query_one("#latest-title", Static).update(
            f"step {self.latest_step} · {len(groups)} groups · {len(index)} rollouts · mean {num(index.reward_mean)} · "
            "Enter: open in Rollouts"
        )
        self.query_one("#latest-groups", GroupsTable).show(groups)

    @on(GroupsTable.Highlighted, "#latest-groups")
    def _latest_highlighted(self, event: GroupsTable.Highlighted) -> None:
        group = event.group
        if self.latest is None or not group.size:
            return
        rollout = self.latest.load(group.example_id, self.latest.rollout_index_at(group, 0))
        self.query_one("#latest-breakdown", RewardBreakdown).show(rollout, group.size)
        self.query_one("#latest-conversation", ConversationView).rollout = rollout

    @on(GroupsTable.Chosen, "#latest-groups")
    def _latest_chosen(self, event: GroupsTable.Chosen) -> None:
        self._open_rollouts(event.group.example_id)

    # ----- actions ----------------------------------------------------------------------------
    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        focus = {"latest": "#latest-groups", "log": "#log LogTail"}.get(tab)
        if focus:
            self.query_one(focus).focus()

    def _latest_path(self) -> tuple[Path, str] | None:
        steps = step_rollout_files(self.run.path)
        return (steps[-1][1], f"step {steps[-1][0]}") if steps else None

    def _open_rollouts(self, example_id: int | None = None) -> None:
        target = self._latest_path()
        if target is None:
            self.notify("no sampled rollouts yet", severity="warning")
            return
        self.open("rollouts", target[0], run=self.run, label=target[1], focus_example=example_id)

    def action_rollouts(self) -> None:
        self._open_rollouts()

    def action_variance(self) -> None:
        target = self._latest_path()
        if target is None:
            self.notify("no sampled rollouts yet", severity="warning")
            return

        def chosen(example_id: object) -> None:
            if isinstance(example_id, int):
                self._open_rollouts(example_id)

        self.open("variance", target[0], run=self.run, label=target[1], callback=chosen)

    def action_checkpoints(self) -> None:
        self.open("checkpoints", self.run)

    def action_logs(self) -> None:
        logs = self.wb.launcher.logs_of(self.run)
        if logs:
            live_pid = self.run.pid if self.run.is_live else None
            self.open("log", logs, title=f"train · {self.run.run_id}", pid=live_pid)

    def action_stop(self) -> None:
        """`x`: stop the training run, once confirmed: Ctrl-C, then SIGTERM if it is still there
        after its grace period (which grows with its step time: it finishes the step first)."""
        pid = self.run.pid
        if not self.run.is_live or not pid:
            self.notify(f"not running ({self.run.status})", severity="warning")
            return
        _, times = series(self.metrics.records, "time/step")
        step_s = sum(times[-10:]) / len(times[-10:]) if times else None
        self.confirm_stop(
            pid,
            f"training {self.run.env} {self.run.short_id}",
            consequence="It finishes this step and writes a checkpoint.",
            stopping="training finishes this step, writes a checkpoint and stops",
            grace_s=stop_grace("train", self.run.path, self.wb.launcher.stop_grace_s, step_s or 0.0),
        )
