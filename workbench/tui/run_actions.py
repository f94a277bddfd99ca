"""The Runs screen's lifecycle keys, on the run under the cursor: `x` stop, `R` resume, `A`
archive, `D` delete, `d` dismiss a launch that never wrote a run folder, and on a GEPA run `V`
verify / `P` apply its best prompt (`workbench.tui.lifecycle`).

Resume, verify and apply start `workbench ...` children through the app's `Launcher`, as any
launch does; verify and apply are short and print their result, so when one ends its last lines
come back as a notification. Archive and delete ask first, say exactly which folder and where it
goes, and run in a thread (a training run's checkpoints can be gigabytes)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from textual.binding import Binding

from workbench.errors import UserError
from workbench.tui.data.runs import RunInfo
from workbench.tui.data.training import stop_grace
from workbench.tui.launcher import Launch, LaunchSpec, launch_of
from workbench.tui.lifecycle import (
    NotApplicable,
    archive_run,
    archive_target,
    delete_run,
    gepa_spec,
    resume_spec,
    shown_path,
)
from workbench.tui.screens.base import WorkbenchScreen

ARTICLE = {"eval": "an eval run", "train": "a training run", "gepa": "a GEPA run"}


def a_run(kind: str) -> str:
    """'an eval run', 'a training run', 'a GEPA run' (never 'a eval run')."""
    return ARTICLE.get(kind, f"a {kind} run")


def outcome_lines(log: Path, keep: int = 3, limit: int = 16384) -> list[str]:
    """The last `keep` lines a short command printed (its result), from the end of its log."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - limit))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("$ ")]
    return lines[-keep:]


def dismissable(run: RunInfo | None) -> bool:
    """A row `d` dismisses: a launch from the TUI that ended before it wrote a run folder."""
    return run is not None and run.is_launch and not run.is_live


class RunActions(WorkbenchScreen):
    """Mixed into the Runs screen: it provides `current` (the run under the cursor), `forget(run)`
    (drop a row that no longer exists) and `launched(launch)` (follow a new child)."""

    LIFECYCLE_BINDINGS = [
        Binding("R", "resume", "Resume run", show=False),
        Binding("A", "archive", "Archive run", show=False),
        Binding("D", "delete", "Delete run", show=False),
        # not "GEPA: ..." — the palette's "gepa" must find "Launch GEPA run" first
        Binding("V", "gepa('verify')", "Verify the best prompt", show=False),
        Binding("P", "gepa('apply')", "Apply the best prompt", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._watched: dict[str, tuple[Launch, str]] = {}  # launch id -> (launch, what it does)
        self.outcomes: list[tuple[str, str, list[str]]] = []  # (what, status, last lines) as said

    @property
    def current(self) -> RunInfo | None:
        raise NotImplementedError

    def forget(self, run: RunInfo) -> None:
        """Drop the row of a run folder that was archived or deleted."""
        raise NotImplementedError

    def launched(self, launch: Launch) -> None:
        """A child started from a key here: the screen follows it."""
        raise NotImplementedError

    def _start(self, spec: LaunchSpec, title: str, *, watch: str | None = None) -> Launch | None:
        try:
            launch = self.wb.launcher.start(spec)
        except OSError as exc:
            self.notify(f"could not start {spec.command}: {exc}", severity="error")
            return None
        self.notify(f"started: {launch.command}", title=title)
        if watch is not None:
            self._watched[launch.id] = (launch, watch)
        self.launched(launch)
        return launch

    def check_watched(self) -> None:
        """Say how each watched command ended, with the lines it printed last (called every scan)."""
        launcher = self.wb.launcher
        for launch_id, (launch, what) in list(self._watched.items()):
            if launcher.is_running(launch):
                continue
            del self._watched[launch_id]
            status, error = launcher.status_of(launch)
            said = outcome_lines(launch.log)
            self.outcomes.append((what, status, said))
            lines = "\n".join(said)
            if status == "finished":
                self.notify(lines or "done", title=f"{what}: finished", timeout=20)
            else:
                self.notify(error or lines or status, title=f"{what}: {status}", severity="error", timeout=20)

    def _applicable(self, build: Callable[[RunInfo], LaunchSpec]) -> LaunchSpec | None:
        """`build(run)` for the run under the cursor; None (and why, in a notification) when it
        does not apply."""
        run = self.current
        if run is None:
            return None
        try:
            return build(run)
        except NotApplicable as exc:
            self.notify(f"not for this row: {exc}", severity="warning")
            return None

    def action_resume(self) -> None:
        """`R`: continue a stopped, failed or died run where it left off, once confirmed."""
        root = self.wb.root
        spec = self._applicable(lambda run: resume_spec(run, root))
        run = self.current
        if spec is None or run is None:
            return

        def answered(yes: object) -> None:
            if yes is True:
                self._start(spec, f"resuming {run.kind} {run.short_id}")

        self.open(
            "confirm",
            f"Resume {a_run(run.kind)} ({run.env}, {run.model_label}, {run.status})? It continues where it "
            f"left off, in the same folder:\n{spec.command}",
            title="Resume run",
            yes="Resume",
            no="Cancel",
            callback=answered,
        )

    def action_gepa(self, action: str) -> None:
        """`V` / `P`: `workbench gepa verify|apply RUN` on the GEPA run under the cursor."""
        root = self.wb.root
        spec = self._applicable(lambda run: gepa_spec(run, root, action))
        run = self.current
        if spec is None or run is None:
            return
        if action == "verify":  # evaluates two prompts: only starts, its result comes back when it ends
            self._start(spec, "verifying the best prompt", watch="gepa verify")
            return

        def answered(yes: object) -> None:
            if yes is True:
                self._start(spec, "applying the best prompt", watch="gepa apply")

        self.open(
            "confirm",
            f"Make this run's best prompt the default system prompt of {run.env}? "
            f"Its environment file is rewritten (an installed env gets the -a form instead):\n{spec.command}",
            title="Apply best prompt",
            yes="Apply",
            no="Cancel",
            callback=answered,
        )

    def action_archive(self) -> None:
        """`A`: move the run folder under outputs/archive/, once confirmed (moving it back restores it)."""
        run = self.current
        if run is None or not self._may_remove(run):
            return
        root = self.wb.root
        target = archive_target(run, root)

        def answered(yes: object) -> None:
            if yes is True:
                self.run_worker(self._remove(run, "archive"), group="lifecycle")

        self.open(
            "confirm",
            f"Archive {a_run(run.kind)} ({run.env}, {run.model_label}, {run.short_id})? Its folder moves to "
            f"{shown_path(target, root)}; move it back to restore it.",
            title="Archive run",
            yes="Archive",
            no="Keep",
            callback=answered,
        )

    def action_delete(self) -> None:
        """`D`: delete the run folder for good, once confirmed (the No button has the focus)."""
        run = self.current
        if run is None or not self._may_remove(run):
            return

        def answered(yes: object) -> None:
            if yes is True:
                self.run_worker(self._remove(run, "delete"), group="lifecycle")

        what = "its checkpoints, " if run.kind == "train" else ""
        self.open(
            "confirm",
            f"Delete {a_run(run.kind)} ({run.env}, {run.model_label}, {run.short_id}) for good? Its folder "
            f"{shown_path(run.path, self.wb.root)} and everything in it ({what}results, logs) are deleted; "
            "A archives it instead.",
            title="Delete run",
            yes="Delete",
            no="Keep",
            callback=answered,
        )

    def _may_remove(self, run: RunInfo) -> bool:
        if run.is_launch:
            self.notify(
                "not for this row: it is a launch, not a run folder (d dismisses it)", severity="warning"
            )
            return False
        if run.is_live or run.status == "stopping":
            self.notify(f"not for this row: it is still {run.status}; stop it first (x)", severity="warning")
            return False
        return True

    async def _remove(self, run: RunInfo, what: str) -> None:
        root = self.wb.root
        try:
            if what == "archive":
                target = await asyncio.to_thread(archive_run, run, root)
                said = f"moved to {shown_path(target, root)}"
            else:
                await asyncio.to_thread(delete_run, run)
                said = f"deleted {shown_path(run.path, root)}"
        except (NotApplicable, UserError, OSError) as exc:
            self.notify(f"not {what}d: {exc}", severity="error")
            return
        self.forget(run)
        self.notify(said, title=f"{what}d {run.kind} {run.short_id}")

    def action_stop(self) -> None:
        """`x`: stop the run under the cursor, once confirmed (it keeps what it finished): Ctrl-C,
        then SIGTERM if it is still there after its grace period."""
        run = self.current
        if run is None:
            return
        pid = run.pid
        if not run.is_live or not pid:
            self.notify(f"not running ({run.status})", severity="warning")
            return
        grace = stop_grace(run.kind, run.path, self.wb.launcher.stop_grace_s) if not run.is_launch else None
        if run.kind == "train" and not run.is_launch:
            self.confirm_stop(
                pid,
                f"training {run.env} {run.short_id}",
                consequence="It finishes this step and writes a checkpoint.",
                stopping="training finishes this step, writes a checkpoint and stops",
                grace_s=grace,
            )
        else:
            self.confirm_stop(pid, f"{run.kind} {run.env} {run.short_id}", grace_s=grace)

    def action_dismiss_launch(self) -> None:
        """`d`: forget a launch that ended before it wrote a run folder — its row, and its record
        and output log in outputs/tui/launches/ — once confirmed (the log is all that says why it
        failed). A run folder or a live process is never touched."""
        run = self.current
        launch = launch_of(run) if run is not None and dismissable(run) else None
        if run is None or launch is None:
            self.action_cannot_dismiss()
            return
        log = launch.log
        shown = log.relative_to(self.wb.root) if log.is_relative_to(self.wb.root) else log
        what = f"{run.status} {run.kind} launch ({run.env}, {run.model})"

        def answered(yes: object) -> None:
            if yes is True:
                self.dismiss_launch(run, launch)

        self.open(
            "confirm",
            f"Dismiss the {what}? Its record and its output log ({shown}) are deleted.",
            title="Dismiss launch",
            yes="Dismiss",
            no="Keep",
            callback=answered,
        )

    def dismiss_launch(self, run: RunInfo, launch: Launch) -> None:
        """Delete the launch's record and log, and its row (the cursor goes to the next row)."""
        try:
            self.wb.launcher.dismiss(launch.id)
        except (OSError, ValueError) as exc:
            self.notify(f"not dismissed: {exc}", severity="warning")
            return
        self.forget(run)
        self.notify(f"dismissed the {run.status} {run.kind} launch {launch.id}", title="dismissed")

    def action_cannot_dismiss(self) -> None:
        """`d` on a row it does not apply to: say what it is for."""
        run = self.current
        if run is None:
            return
        why = (
            "it is still starting"
            if run.is_launch
            else "it has a run folder (d never deletes runs: A archives one, D deletes it)"
        )
        self.notify(
            f"d dismisses a launch that ended before it wrote a run folder; not this row: {why}",
            severity="warning",
        )
