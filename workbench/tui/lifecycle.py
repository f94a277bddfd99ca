"""What the TUI can do to a run after it started, besides stopping it: resume it, archive it,
delete it, and verify or apply a GEPA run's best prompt.

Resume, verify and apply are `workbench ...` commands, run as children through the `Launcher`
like any launch (`LaunchSpec`s built here: the same commands the CLI prints). Archive and delete
only move or remove a run folder, and refuse a run whose process is alive or that another process
holds (`run.lock`): archiving moves the folder under `outputs/archive/`, keeping its path inside
the workspace, so nothing vanishes and moving it back restores it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from workbench.store.lock import claim_run
from workbench.tui.data.runs import RunInfo
from workbench.tui.launcher import LaunchSpec

ARCHIVE = Path("outputs") / "archive"
RESUMABLE = ("stopped", "failed", "died", "unknown")


class NotApplicable(ValueError):
    """The action does not apply to this run; the message says why, in one line."""


def shown_path(path: Path, root: Path) -> str:
    """A run folder as a command names it: relative to the workspace (where children run)."""
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def resume_spec(run: RunInfo, root: Path) -> LaunchSpec:
    """The command that continues a stopped, failed or died run (eval: its unfinished groups;
    training: from its newest complete checkpoint, with as many processes as it had; GEPA: from
    its last iteration). NotApplicable saying why for any other run."""
    if run.is_launch:
        raise NotApplicable("this launch never wrote a run folder: there is nothing to resume")
    if run.is_live:
        raise NotApplicable(f"it is still {run.status}")
    if run.status not in RESUMABLE:
        raise NotApplicable(f"it is {run.status}: nothing to resume")
    path = shown_path(run.path, root)
    if run.kind == "eval":
        args = ["eval", "run", "-R", path]
    elif run.kind == "train":
        args = ["train", "--resume", path]
        world = run.metadata.get("world_size")
        if isinstance(world, int) and world > 1:  # as many processes as it had
            args += ["--nproc", str(world)]
    else:
        optimizer = run.metadata.get("optimizer", "gepa")
        if optimizer != "gepa":
            raise NotApplicable(f"{optimizer} runs cannot be resumed")
        args = ["gepa", "run", "--resume", path]
    return LaunchSpec(run.kind, args, run.env, f"resume {run.short_id}")


def gepa_spec(run: RunInfo, root: Path, action: str) -> LaunchSpec:
    """`workbench gepa verify RUN` (seed vs best prompt on held-out examples, with a CI) or
    `workbench gepa apply RUN` (the best prompt becomes the env's default)."""
    if run.kind != "gepa" or run.is_launch:
        raise NotApplicable(f"gepa {action} works on a GEPA run")
    if run.metadata.get("best_candidate") is None and not (run.path / "best_prompt.txt").is_file():
        raise NotApplicable("this GEPA run has no best prompt yet")
    return LaunchSpec("gepa", ["gepa", action, shown_path(run.path, root)], run.env, f"{action} best prompt")


def _owned(run: RunInfo, what: str) -> None:
    """Refuse a run that is going, or that a process holds (its run.lock)."""
    if run.is_launch:
        raise NotApplicable(f"this row is a launch, not a run folder: d dismisses it, {what} does not")
    if run.is_live or run.status == "stopping":
        raise NotApplicable(f"it is still {run.status}: stop it first (x)")
    if not (run.path / "metadata.json").is_file():
        raise NotApplicable(f"{run.path} is not a run folder")


def archive_target(run: RunInfo, root: Path) -> Path:
    """Where archiving puts a run: its path in the workspace, under outputs/archive/ (a name
    already taken gets -2, -3, ...)."""
    inside = run.path.relative_to(root) if run.path.is_relative_to(root) else Path(run.path.name)
    target = root / ARCHIVE / inside
    stem, n = target, 2
    while target.exists():
        target, n = stem.with_name(f"{stem.name}-{n}"), n + 1
    return target


def archive_run(run: RunInfo, root: Path) -> Path:
    """Move the run folder to `archive_target` (same filesystem: a rename); returns where it went.
    NotApplicable for a run that is going; UserError (`workbench.errors`) when another process
    holds it."""
    _owned(run, "archive")
    target = archive_target(run, root)
    lock = claim_run(run.path)  # no writer may start while it moves (UserError: one holds it)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(run.path, target)
    finally:
        lock.release()
    return target


def delete_run(run: RunInfo) -> None:
    """Delete the run folder and everything in it (checkpoints included). NotApplicable for a run
    that is going; UserError when another process holds it."""
    _owned(run, "delete")
    lock = claim_run(run.path)
    try:
        shutil.rmtree(run.path)
    finally:
        lock.release()
