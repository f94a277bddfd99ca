"""Runs (home): every eval, training and GEPA run in the workspace, refreshed live, with filters
and search; Enter opens a run on the screen made for its kind. `e` groups evals by environment,
the best run per model (as `prime eval view` does).

A failed row says why: in the table's `error` column where the terminal is wide enough for one,
and, for the highlighted row, in the hint line under the table. `d` dismisses a launch that ended
before it wrote a run folder (its row, record and output log), once confirmed. The lifecycle keys
(resume, archive, delete, GEPA verify/apply) live in `workbench.tui.run_actions`; `x` stops a run
(SIGINT, then SIGTERM after a grace period, each step on screen)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.widgets import Footer, Static

from workbench.tui.data.runs import KINDS, RunInfo, best_per_model, filter_runs
from workbench.tui.data.training import step_rollout_files
from workbench.tui.launcher import Launch
from workbench.tui.lifecycle import RESUMABLE
from workbench.tui.run_actions import RunActions, a_run, dismissable
from workbench.tui.widgets.format import STATUS_RICH
from workbench.tui.widgets.prompt_bar import PromptBar
from workbench.tui.widgets.runs_table import RunsTable
from workbench.tui.widgets.virtual_table import VirtualTable

STATUS_FILTERS = (None, "running", "finished", "stopped", "failed", "died")
NO_RUNS = (
    "No runs yet. Press [b]l[/b] to launch one, or run "
    "`workbench eval run reverse-text -m tiny` in this workspace."
)
HINT = (
    "[b]space[/b] mark · [b]c[/b] compare · [b]r[/b] rollouts · [b]v[/b] variance · "
    "[b]K[/b] checkpoints · [b]o[/b]/[b]O[/b] sort · [b]?[/b] all keys"
)
# The hint line on rows the lifecycle keys apply to (they are not in the footer: too many for 80 columns).
RESUME_HINT = "[b]R[/b] resume · [b]A[/b] archive · [b]D[/b] delete · [b]t[/b] log · [b]?[/b] all keys"
GEPA_HINT = (
    "[b]V[/b] verify best prompt · [b]P[/b] apply it · [b]A[/b] archive · [b]D[/b] delete · [b]?[/b] all keys"
)


class RunsScreen(RunActions):
    BINDINGS = [
        Binding("enter", "open", "Open"),
        # Two bindings of `d`: the footer and `?` show "Dismiss" only on a row it applies to
        # (check_action), early enough to fit an 80-column footer; on any other row the second,
        # unlisted one says why nothing happens.
        Binding("d", "dismiss_launch", "Dismiss"),
        Binding("d", "cannot_dismiss", show=False),
        Binding("l", "launch", "Launch"),
        Binding("slash", "search", "Search"),
        Binding("f", "kind_filter", "Kind"),
        Binding("s", "status_filter", "Status"),
        Binding("t", "log", "Log"),
        Binding("x", "stop", "Stop"),
        Binding("space", "mark", "Mark for compare", show=False),
        Binding("c", "compare", "Compare marked evals", show=False),
        Binding("r", "rollouts", "Rollouts", show=False),
        Binding("v", "variance", "Reward variance", show=False),
        Binding("K", "checkpoints", "Checkpoints", show=False),
        Binding("C", "compare(True)", "Compare marked evals anyway", show=False),
        Binding("escape", "clear_filters", "Clear filters", show=False),
        Binding("e", "group_by_env", "Group by environment", show=False),
        *RunActions.LIFECYCLE_BINDINGS,
    ]
    # Keyless actions the command palette (ctrl+p or :) finds by name: (title, action, help).
    PALETTE_COMMANDS = (
        ("Launch eval", "launch('eval')", "Evaluate a model on an environment (Launch screen, Eval form)"),
        (
            "Launch training",
            "launch('train')",
            "Train from an RL config in configs/rl (Launch screen, Train form)",
        ),
        (
            "Launch GEPA run",
            "launch('gepa')",
            "Optimize an environment's system prompt (Launch screen, GEPA form)",
        ),
        ("Launch a config", "launch('configs')", "Run any config in configs/{eval,rl,gepa} (Launch screen)"),
    )

    def __init__(self) -> None:
        super().__init__()
        self.all_runs: list[RunInfo] = []
        self.kind: str | None = None
        self.status: str | None = None
        self.query_text = ""
        self.marked: set[str] = set()
        self.by_env = False  # `e`: the best eval per model and environment
        self._scanning = False
        self._follow_pid: int | None = None  # select this launch's run once its folder appears
        self._generation = 0  # bumped when rows are removed here: a scan begun before is stale
        self._row_state: tuple[bool, str | None, str] | None = None  # the cursor's row: what the hint shows

    def compose(self) -> ComposeResult:
        yield Static(id="runs-summary", classes="screen-title")
        yield RunsTable(id="runs-table")
        yield Static(HINT, id="runs-hint", classes="hint")
        yield Static(NO_RUNS, id="runs-empty", classes="empty")
        yield PromptBar(id="runs-prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(RunsTable).focus()
        self.set_interval(self.wb.poll_s, self.refresh_runs)
        self.refresh_runs()

    def on_screen_resume(self) -> None:
        self.refresh_runs()

    @work(group="scan")
    async def refresh_runs(self) -> None:
        """Re-scan in a thread (one scan at a time) and update the table; paused while another
        screen is on top (it re-scans when it comes back)."""
        if self._scanning or not self.is_current:
            return
        self._scanning = True
        generation = self._generation
        try:
            runs = await asyncio.to_thread(self._scan)
        finally:
            self._scanning = False
        if generation != self._generation:  # a row was dismissed meanwhile: this scan may still list it
            self.refresh_runs()
            return
        self.all_runs = runs
        if not self.is_current or self.closing:  # covered, popped or quitting while the scan ran
            return
        self.check_watched()
        self._render_runs()

    def _scan(self) -> list[RunInfo]:
        launcher = self.wb.launcher
        launcher.poll()
        runs = self.wb.catalog.scan()
        return launcher.rows(runs)

    def _render_runs(self, select: str | None = None) -> None:
        visible = filter_runs(self.all_runs, self.kind, self.status, self.query_text)
        counts: list[int] | None = None
        if self.by_env:
            best = best_per_model(visible)
            visible, counts = [run for run, _ in best], [count for _, count in best]
        if self._follow_pid is not None and select is None:
            match = next((r for r in visible if r.pid == self._follow_pid), None)
            if match is not None:
                select = match.key
                if not match.is_launch:
                    self._follow_pid = None
        self.marked &= {r.key for r in self.all_runs}
        self.query_one(RunsTable).show(visible, self.marked, select, counts=counts)
        live = sum(r.is_live for r in self.all_runs)
        shown = (
            f"by environment: the best of {sum(counts or [])} evals per model"
            if self.by_env
            else f"{len(visible)}/{len(self.all_runs)} runs"
        )
        parts = [shown, f"{live} running", f"kind: {self.kind or 'all'}", f"status: {self.status or 'all'}"]
        if self.query_text:
            parts.append(f"search: {self.query_text}")
        if self.marked:
            parts.append(f"{len(self.marked)} marked")
        self.query_one("#runs-summary", Static).update(
            f"[b]Runs[/b] · {self.wb.root.name} · " + " · ".join(parts)
        )
        empty = self.query_one("#runs-empty", Static)
        empty.display = not visible
        if not self.all_runs:
            empty.update(NO_RUNS)
        elif self.by_env and not any(r.kind == "eval" for r in self.all_runs):
            empty.update("No eval runs to group by environment. Press [b]e[/b] to list every run.")
        elif not visible:
            empty.update("No run matches these filters. Press [b]escape[/b] to clear them.")
        self._sync_row_state()

    @on(VirtualTable.Highlighted, "#runs-table")
    def _highlighted(self) -> None:
        self._sync_row_state()

    def _sync_row_state(self) -> None:
        """Follow the cursor's row: the footer offers `d` only on a row it dismisses, and the hint
        line shows a failed row's error (the table's own column for it needs a wide terminal).
        Acts only on a change (the table re-renders every poll)."""
        run = self.current
        error = run.error if run is not None else None
        state = (
            dismissable(run),
            f"{run.status}: {error}" if run is not None and error is not None else None,
            row_hint(run),
        )
        if state == self._row_state:
            return
        self._row_state = state
        self.refresh_bindings()
        hint = self.query_one("#runs-hint", Static)
        hint.set_class(run is not None and error is not None, "-error")
        if run is not None and error is not None:
            hint.update(Text.assemble((f"{run.status}: ", STATUS_RICH["failed"]), error))
        else:
            hint.update(state[2])

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "dismiss_launch":
            try:
                return dismissable(self.current)
            except NoMatches:  # not composed yet
                return False
        return True

    @property
    def current(self) -> RunInfo | None:
        return self.query_one(RunsTable).current

    def forget(self, run: RunInfo) -> None:
        """Drop a row whose run folder or launch record is gone (the cursor goes to the next row)."""
        self._generation += 1
        visible = self.query_one(RunsTable).runs
        at = next((i for i, r in enumerate(visible) if r.key == run.key), None)
        rest = [r for r in visible if r.key != run.key]
        select = rest[min(at, len(rest) - 1)].key if at is not None and rest else None
        self.all_runs = [r for r in self.all_runs if r.key != run.key]
        self._render_runs(select)

    def launched(self, launch: Launch) -> None:
        """Follow a child started here: its row is selected once it appears, whatever the filters."""
        self._follow_pid = launch.pid
        self.kind = self.status = None
        self.query_text = ""
        self.by_env = False
        self.refresh_runs()

    # ----- navigation --------------------------------------------------------------------
    @on(RunsTable.Opened)
    def _opened(self, event: RunsTable.Opened) -> None:
        self.open_run(event.run)

    def action_open(self) -> None:
        if self.current is not None:
            self.open_run(self.current)

    def open_run(self, run: RunInfo) -> None:
        if run.is_launch:  # still starting, or ended before it wrote a run folder: its output says why
            self.action_log(run)
        elif run.kind == "train":
            self.open("monitor", run)
        elif run.kind == "gepa":
            self.open("gepa", run)
        else:
            self.action_rollouts()

    def action_rollouts(self) -> None:
        run = self._require(("eval", "train"), "rollouts")
        if run is None:
            return
        target = rollouts_file(run)
        if target is None:
            self.notify("this run has no rollouts yet", severity="warning")
            return
        self.open("rollouts", target[0], run=run, label=target[1])

    def action_variance(self) -> None:
        run = self._require(("eval", "train"), "reward variance")
        target = rollouts_file(run) if run else None
        if run is None or target is None:
            return

        def open_example(example_id: object) -> None:
            if isinstance(example_id, int):
                self.open("rollouts", target[0], run=run, label=target[1], focus_example=example_id)

        self.open("variance", target[0], run=run, label=target[1], callback=open_example)

    def action_checkpoints(self) -> None:
        run = self._require(("train",), "checkpoints")
        if run is not None:
            self.open("checkpoints", run)

    def action_log(self, run: RunInfo | None = None) -> None:
        run = run or self.current
        if run is None:
            return
        logs = self.wb.launcher.logs_of(run)
        if not logs:
            self.notify("no log for this run", severity="warning")
            return
        live_pid = run.pid if run.is_live else None
        error = run.metadata.get("error")
        note = (
            f"{run.status}: {error}" if run.status in ("failed", "died") and isinstance(error, str) else None
        )
        self.open(
            "log",
            logs,
            title=f"{run.kind} · {run.env} · {run.model}",
            pid=live_pid,
            label=f"{run.kind} {run.env}",
            note=note,
        )

    def action_launch(self, tab: str | None = None) -> None:
        """`l`: the Launch screen (on `tab`: configs, eval, train or gepa — the palette's Launch ...)."""

        def started(launch: object) -> None:
            if isinstance(launch, Launch):
                self.notify(f"started: {launch.command}", title="launched")
                self.launched(launch)

        self.open("launch", tab=tab, callback=started)

    # ----- marks and compare --------------------------------------------------------------
    def action_mark(self) -> None:
        run = self.current
        if run is None:
            return
        self.marked ^= {run.key}
        self._render_runs()
        table = self.query_one(RunsTable)
        if table.cursor_row < table.row_count - 1:
            table.move_cursor(row=table.cursor_row + 1, animate=False)

    def action_compare(self, force: bool = False) -> None:
        """Compare the two marked evals, older as A; `C` (force) also pairs runs whose examples differ."""
        chosen = [r for r in self.all_runs if r.key in self.marked and r.kind == "eval"]
        if len(chosen) != 2:
            self.notify("mark exactly two eval runs with space, then press c", severity="warning")
            return
        older, newer = sorted(
            chosen, key=lambda r: (r.created_at.timestamp() if r.created_at else 0, r.run_id)
        )
        self.open("compare", older, newer, force=force)

    # ----- filters ------------------------------------------------------------------------
    def action_search(self) -> None:
        self.query_one(PromptBar).ask(
            "search", "search kind, env, model, status, run id (Enter to apply)", self.query_text
        )

    @on(PromptBar.Answered)
    def _answered(self, event: PromptBar.Answered) -> None:
        self.query_text = event.value.strip()
        self._render_runs()

    def action_kind_filter(self) -> None:
        options = (None, *KINDS)
        self.kind = options[(options.index(self.kind) + 1) % len(options)]
        self._render_runs()

    def action_status_filter(self) -> None:
        self.status = STATUS_FILTERS[(STATUS_FILTERS.index(self.status) + 1) % len(STATUS_FILTERS)]
        self._render_runs()

    def action_clear_filters(self) -> None:
        self.kind = self.status = None
        self.query_text = ""
        self._render_runs()

    def action_group_by_env(self) -> None:
        """`e`: the best eval per model on each environment (finished first, then reward), or back."""
        self.by_env = not self.by_env
        self._render_runs()

    def _require(self, kinds: tuple[str, ...], what: str) -> RunInfo | None:
        run = self.current
        if run is None:
            return None
        if run.kind not in kinds or run.is_launch:
            state = " that is still starting" if run.is_launch else ""
            self.notify(f"{what}: not available for {a_run(run.kind)}{state}", severity="warning")
            return None
        return run


def row_hint(run: RunInfo | None) -> str:
    """The hint line for the row under the cursor: its lifecycle keys where they apply."""
    if run is None or run.is_launch:
        return HINT
    if run.kind == "gepa" and not run.is_live:
        return GEPA_HINT
    if run.status in RESUMABLE:
        return RESUME_HINT
    return HINT


def rollouts_file(run: RunInfo) -> tuple[Path, str] | None:
    """The rollouts a run's Rollouts view opens: results.jsonl of an eval, the newest
    rollouts/step_N.jsonl of a training run."""
    if run.kind == "train":
        steps = step_rollout_files(run.path)
        return (steps[-1][1], f"step {steps[-1][0]}") if steps else None
    path = run.path / "results.jsonl"
    return (path, "results") if run.kind == "eval" else None
