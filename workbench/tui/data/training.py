"""Training-run readers: metric curves, progress and ETA, the latest sampled rollouts, and
checkpoints (step, time, reward, size) — all from the files `workbench train` writes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from workbench.types import is_number

# The curves the run monitor draws: (title, [(metric key, legend label), ...]).
CURVES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("reward", (("reward/mean", "mean"), ("reward/std", "std"), ("eval/reward_mean", "eval"))),
    ("loss", (("train/loss", "loss"),)),
    ("entropy", (("policy/entropy", "entropy"),)),
    ("KL", (("policy/kl", "kl"),)),
    ("completion length", (("rollout/mean_length", "tokens"),)),
    ("seconds / step", (("time/step", "s"),)),
)

_STEP_FILE = re.compile(r"step_(\d+)\.jsonl$")


def series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric; steps where it is missing or not a number are skipped.
    A step logged twice (a resumed run re-did it) keeps its last value."""
    points: dict[float, float] = {}
    for record in records:
        step, value = record.get("step"), record.get(key)
        if is_number(step) and is_number(value):
            points[float(step)] = float(value)
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def eta_seconds(
    records: list[dict[str, Any]], step: int | None, max_steps: int | None, window: int = 10
) -> float | None:
    """Remaining steps times the mean `time/step` of the last `window` steps."""
    if step is None or not max_steps:
        return None
    _, times = series(records, "time/step")
    if not times:
        return None
    recent = times[-window:]
    return max(0, max_steps - step) * sum(recent) / len(recent)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def step_rollout_files(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of rollouts/step_N.jsonl, in step order."""
    folder = run_dir / "rollouts"
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _STEP_FILE.search(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def format_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"
