"""Training-run readers: metric curves, progress and ETA, the latest sampled rollouts, and
checkpoints (step, time, reward, size) — all from the files `workbench train` writes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson

from workbench.store.runs import METRICS
from workbench.types import is_number

# The curves the run monitor draws: (title, [(metric key, legend label), ...]).
CURVES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("reward", (("reward/mean", "mean"), ("reward/std", "std"), ("eval/reward_mean", "eval"))),
    ("loss", (("train/loss", "loss"),)),
    ("entropy", (("policy/entropy", "entropy"),)),
    # KL to the reference (the penalty's) and trainer vs sampler on the sampled tokens (prime-rl's
    # mismatch_kl): a tokenization or weight-sync bug shows here before it shows as worse learning.
    (
        "KL",
        (
            ("policy/kl", "ref"),
            ("policy/mismatch_kl", "mismatch"),
            ("policy/mismatch_kl_max", "mismatch max"),
        ),
    ),
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


def recent_step_seconds(run_dir: Path, window: int = 10, tail_bytes: int = 65536) -> float | None:
    """Mean `time/step` of the last `window` steps in metrics.jsonl (its tail only: a long run's
    file is large), or None before the first step."""
    path = run_dir / METRICS
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - tail_bytes))
            lines = f.read().split(b"\n")[1 if size > tail_bytes else 0 :]  # the first may be cut
    except OSError:
        return None
    records = []
    for line in lines:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    _, times = series(records, "time/step")
    return sum(times[-window:]) / len(times[-window:]) if times else None


def stop_grace(kind: str, run_dir: Path, default: float, step_seconds: float | None = None) -> float:
    """Seconds a run gets after Ctrl-C before SIGTERM. A training run finishes its step and writes
    a checkpoint first (perhaps after a held-out eval), so it gets twice its recent step time on
    top of `default`: SIGTERM then only reaches a run that ignored the Ctrl-C. Before its first
    step it has nothing to save, and `default` stands."""
    if kind != "train":
        return default
    step = step_seconds if step_seconds is not None else recent_step_seconds(run_dir)
    return default + 2 * step if step else default


def last_value(records: list[dict[str, Any]], key: str) -> tuple[float, float] | None:
    """(step, value) of the newest logged value of a metric (what its curve ends on), or None."""
    steps, values = series(records, key)
    return (steps[-1], values[-1]) if steps else None


def start_phase(metadata: dict[str, Any], records: list[dict[str, Any]], live: bool) -> str | None:
    """What a live training run is doing before its first step is logged, in one line for the
    monitor (the curves are empty until then, for seconds to minutes): the held-out baseline eval
    (`[eval] interval` > 0 on an RL or distillation run measures the starting model first), or
    step 1 under way. None once a step is logged, or when the run is not live."""
    if not live or any(is_number(r.get("step")) and r["step"] >= 1 for r in records):
        return None
    config = metadata.get("config")
    config = config if isinstance(config, dict) else {}
    held_out = config.get("eval")
    held_out = held_out if isinstance(held_out, dict) else {}
    interval = held_out.get("interval", 0)
    baseline = is_number(interval) and interval > 0 and config.get("mode", "rl") in ("rl", "distill")
    measured = last_value(records, "eval/reward_mean")
    if baseline and measured is None:
        n = held_out.get("num_examples", "the")
        return (
            f"measuring the starting model on {n} held-out examples (the baseline) before step 1; "
            "the curves start after it"
        )
    if measured is not None:
        return f"baseline held-out reward {measured[1]:.3f}; step 1 under way"
    return "step 1 under way (loading the model, generating the first rollouts)"
