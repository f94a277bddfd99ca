"""Checkpoint sweeps: `<training run>/checkpoint_evals.jsonl`, one line per finished evaluation of
the base model or a checkpoint of that run (`workbench eval run ENV -m RUN --checkpoints ...`).

A line names the eval run folder that holds the rollouts and the settings that make two
evaluations comparable (`SweepKey`: environment, its args, examples, rollouts, seed, sampling);
a sweep skips every point that already has a line with the same key. Appending a line is the
last thing an evaluation does, so an interrupted sweep keeps the points it finished.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from workbench.store.files import iter_jsonl

SWEEP_FILE = "checkpoint_evals.jsonl"
SWEEP_TABLE = "checkpoint_evals.csv"  # the newest sweep's table: step, reward, vs base, eval run
BASE = -1  # the step recorded for the base model (before training: shown as "base")


class SweepKey(BaseModel):
    """What must match for a saved evaluation to stand in for a new one."""

    env_id: str
    env_args: dict[str, Any] = {}
    num_examples: int
    rollouts_per_example: int
    seed: int | None
    sampling: dict[str, Any] = {}  # max_tokens, temperature and -S as given
    server: str | None = None  # the -b server the checkpoints were loaded into; None: in-process
    dtype: str = "auto"  # an in-process model's weights (--dtype); sweeps saved before it had auto


class SweepPoint(BaseModel):
    """One finished evaluation in a sweep."""

    model_config = ConfigDict(extra="ignore")

    key: SweepKey
    step: int  # BASE for the base model
    model: str  # the folder that was evaluated
    eval_run: str  # the eval run folder (rollouts, metadata)
    reward_mean: float
    reward_std: float | None = None
    finished_at: str | None = None


def read_sweep(run_dir: Path) -> list[SweepPoint]:
    """Every readable line, oldest first (a line from a newer writer it cannot parse is skipped)."""
    points = []
    for line in iter_jsonl(run_dir / SWEEP_FILE):
        try:
            points.append(SweepPoint.model_validate(line))
        except ValidationError:
            continue
    return points


def points_for(run_dir: Path, key: SweepKey) -> dict[int, SweepPoint]:
    """The newest saved point of each step for `key`."""
    return {point.step: point for point in read_sweep(run_dir) if point.key == key}


def newest_sweep(run_dir: Path) -> list[SweepPoint]:
    """The points recorded with the settings of the newest line, one per step (base first)."""
    points = read_sweep(run_dir)
    if not points:
        return []
    return sorted(points_for(run_dir, points[-1].key).values(), key=lambda p: p.step)


def append_point(run_dir: Path, point: SweepPoint) -> None:
    with (run_dir / SWEEP_FILE).open("ab") as f:
        f.write(orjson.dumps(point.model_dump(mode="json")) + b"\n")


def write_table(run_dir: Path, points: list[SweepPoint]) -> Path:
    """The table a sweep printed, as CSV (for a spreadsheet or a plot script)."""
    import csv

    base = next((p.reward_mean for p in points if p.step == BASE), None)
    path = run_dir / SWEEP_TABLE
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "reward_mean", "reward_std", "vs_base", "model", "eval_run"])
        for p in points:
            delta = "" if base is None or p.step == BASE else f"{p.reward_mean - base:.6f}"
            writer.writerow(
                [
                    step_label(p.step),
                    f"{p.reward_mean:.6f}",
                    "" if p.reward_std is None else f"{p.reward_std:.6f}",
                    delta,
                    p.model,
                    p.eval_run,
                ]
            )
    return path


def step_label(step: int) -> str:
    return "base" if step == BASE else str(step)
