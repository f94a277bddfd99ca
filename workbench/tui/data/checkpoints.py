"""The Checkpoints view's readers: which evals evaluated which checkpoint of a training run, what
each checkpoint's row says about them (a reward, a running eval's progress, or `queued` in a
sweep still going), and which steps a running sweep will evaluate."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workbench.store.checkpoints import checkpoint_step
from workbench.tui.data.runs import STEP_NAME, RunInfo

BASE_LABEL = "base"


def evals_of_run(
    runs: list[RunInfo], run: RunInfo, root: Path, swept: dict[Path, str]
) -> list[tuple[str, RunInfo]]:
    """(label, eval run) for evals of this run's checkpoints ('step N') or of its base model
    ('base'), newest first. `swept` is the run's sweep record ({eval folder: '<run> step N'},
    `RunCatalog.sweep_labels`): it names the step even when a `-b` server evaluated every
    checkpoint under one model name. An eval of `-m RUN` or `-m outputs/runs/latest` is matched by
    the checkpoint it resolved to at launch (`RunInfo.model_path`)."""
    checkpoints = (run.path / "checkpoints").resolve()
    prefix = f"{run.path.name} "
    found = []
    for other in runs:
        if other.kind != "eval" or other.is_launch:
            continue
        named = other.model_path or other.model
        model = Path(named) if Path(named).is_absolute() else root / named
        recorded = swept.get(other.path.resolve())
        if recorded is not None:
            found.append((recorded.removeprefix(prefix), other))
        elif model.resolve().parent == checkpoints and STEP_NAME.match(model.name):
            found.append((f"step {checkpoint_step(model)}", other))
        elif other.checkpoint is not None and other.checkpoint.startswith(prefix):
            found.append((other.checkpoint.removeprefix(prefix), other))  # '<run>-step_N' in a -b server
        elif other.model == run.model and other.env in run.metadata.get("env_ids", [run.env]):
            found.append((BASE_LABEL, other))
    return found


@dataclass
class SweepPlan:
    """A sweep of this run still going (a launch from this TUI): which steps it evaluates."""

    steps: set[int] | None  # None: every checkpoint
    base: bool
    started_at: float  # the launch's start (epoch seconds): evals before it are earlier ones


def sweep_plan(args: list[str], run_dir: Path, root: Path, started_at: float) -> SweepPlan | None:
    """The plan of `workbench eval run ... -m RUN --checkpoints all|STEPS [--no-base]` when RUN is
    this run's folder, else None."""
    if "--checkpoints" not in args or "-m" not in args:
        return None
    model = Path(args[args.index("-m") + 1]) if args.index("-m") + 1 < len(args) else None
    if model is None or (model if model.is_absolute() else root / model).resolve() != run_dir.resolve():
        return None
    which = args[args.index("--checkpoints") + 1] if args.index("--checkpoints") + 1 < len(args) else "all"
    steps = None if which == "all" else {int(s) for s in which.split(",") if s.strip().isdigit()}
    return SweepPlan(steps, "--no-base" not in args, started_at)


def evaluated_cell(label: str, evals: list[tuple[str, RunInfo]], plan: SweepPlan | None) -> str:
    """What a checkpoint's row (or the base model's, `label` 'base') says of its evals: a running
    eval's progress ('▸ 12/48'), else the newest eval's reward, else 'queued' when a sweep going on
    will get to it, else '-'."""
    mine = [run for name, run in evals if name == label]
    live = next((run for run in mine if run.is_live), None)
    if live is not None:
        return f"▸ {live.progress}"
    if plan is not None and planned(label, plan):
        since = [run for run in mine if run.created_at and run.created_at.timestamp() >= plan.started_at]
        if not since:
            return "queued"
        mine = since
    rewarded = [run for run in mine if run.reward is not None]
    if not rewarded:
        return "-"
    newest = max(rewarded, key=lambda run: run.created_at.timestamp() if run.created_at else 0.0)
    return f"{newest.reward:.3f}"


def planned(label: str, plan: SweepPlan) -> bool:
    if label == BASE_LABEL:
        return plan.base
    step = int(label.removeprefix("step "))
    return plan.steps is None or step in plan.steps


def cell_reward(cell: str) -> float | None:
    """The reward an `evaluated_cell` shows, or None for '-', 'queued' or a progress."""
    try:
        return float(cell)
    except ValueError:
        return None
