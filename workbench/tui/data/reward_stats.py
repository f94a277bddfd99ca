"""The reward distribution and pass@k of a rollouts file, from a `RolloutIndex`'s numbers alone (no
record is read back), for the Rollouts screen's reward panel.

pass@k is the eval summary's (`engine.summary`, issue 34), which is verifiers' and prime-rl's: a
rollout is correct when its reward is at least the environment's pass threshold (recorded in the
run's summary as `pass_threshold`; verifiers' default `PASS_THRESHOLD`, 0.5, when a file has
none); for each example with n rollouts of which c are correct, the unbiased estimator
1 - C(n-c, k) / C(n, k) (Chen et al. 2021), averaged over the examples with at least k rollouts.
pass^k = C(c, k) / C(n, k) is the chance that all k are correct; avg@n the mean of the
examples' mean rewards. Here k runs over 1..n, n the run's rollouts per example (its most common
group size); the summary lists k = 1, 2, 4, ... and n, with the same values. Groups a server
failure spoiled are no result and are left out, as the summary leaves them out.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

# The summary's own estimator: `engine.summary` is torch-free and the engine package loads lazily.
from workbench.engine.summary import DEFAULT_PASS_THRESHOLD, pass_at_k
from workbench.tui.data.rollout_index import GroupRow, RolloutIndex

PASS_THRESHOLD = DEFAULT_PASS_THRESHOLD  # verifiers' default: a rollout with reward >= this passes
HISTOGRAM_BINS = 5


@dataclass(frozen=True)
class PassAtK:
    """pass@k and pass^k for k = 1..n, each over the examples with at least k rollouts."""

    n: int  # rollouts per example (the most common group size)
    examples: int  # examples counted
    threshold: float  # a rollout with at least this reward is correct
    avg: float  # avg@n: the mean of the examples' mean rewards
    pass_at: dict[int, float]  # k -> mean pass@k
    pass_all: dict[int, float]  # k -> mean pass^k


@dataclass(frozen=True)
class RewardStats:
    rollouts: int  # rollouts counted (those of result groups)
    mean: float | None
    histogram: list[tuple[str, int]]  # (bin label, rollouts), low rewards first
    pass_k: PassAtK | None  # None: fewer than 2 rollouts per example, or none counted
    left_out: int  # groups not counted: spoiled by a server failure


def reward_histogram(rewards: Sequence[float], bins: int = HISTOGRAM_BINS) -> list[tuple[str, int]]:
    """Rollouts per reward: one bar per value when there are at most `bins` distinct values (a 0/1
    reward: two bars), else `bins` equal bins over [min(0, lowest), max(1, highest)] (the last one
    closed: a reward of 1.0 falls in the top bin)."""
    if not rewards:
        return []
    distinct = sorted(set(rewards))
    if len(distinct) <= bins:
        counts = Counter(rewards)
        return [(_label(value), counts[value]) for value in distinct]
    low, high = min(0.0, distinct[0]), max(1.0, distinct[-1])
    width = (high - low) / bins
    counted = [0] * bins
    for reward in rewards:
        counted[min(int((reward - low) / width), bins - 1)] += 1
    return [
        (f"{_label(low + i * width)}-{_label(low + (i + 1) * width)}", count)
        for i, count in enumerate(counted)
    ]


def _label(value: float) -> str:
    return f"{round(value, 3):g}"


def pass_at_k_of(
    rows: Sequence[GroupRow], rewards: Sequence[float], threshold: float = PASS_THRESHOLD
) -> PassAtK | None:
    """pass@k and pass^k of result groups (`rewards`: the index's per-line rewards)."""
    sizes = Counter(row.size for row in rows)
    if not sizes:
        return None
    most = max(sizes.values())
    n = next(row.size for row in rows if sizes[row.size] == most)  # the first of the most common
    if n < 2:
        return None
    groups = [(row.size, sum(rewards[line] >= threshold for line in row.lines)) for row in rows]

    def mean_over(k: int, estimate: Callable[[int, int, int], float]) -> float:
        values = [estimate(size, c, k) for size, c in groups if size >= k]
        return math.fsum(values) / len(values)

    return PassAtK(
        n=n,
        examples=len(groups),
        threshold=threshold,
        avg=math.fsum(row.mean for row in rows) / len(rows),
        pass_at={k: mean_over(k, pass_at_k) for k in range(1, n + 1)},
        pass_all={
            k: mean_over(k, lambda m, c, k: math.comb(c, k) / math.comb(m, k)) for k in range(1, n + 1)
        },
    )


def run_pass_threshold(results: Path) -> float:
    """The pass threshold an eval's summary recorded (its environment's), else verifiers' default.
    `results`: an eval's results.jsonl (a training step's rollouts have no summary)."""
    try:
        summary = orjson.loads((results.parent / "metadata.json").read_bytes()).get("summary")
    except (OSError, ValueError, AttributeError):
        return PASS_THRESHOLD
    threshold = summary.get("pass_threshold") if isinstance(summary, dict) else None
    return float(threshold) if isinstance(threshold, (int, float)) else PASS_THRESHOLD


def reward_stats(index: RolloutIndex, threshold: float = PASS_THRESHOLD) -> RewardStats:
    """The panel's numbers for everything `index` holds now."""
    rows = index.groups()
    kept = [row for row in rows if not row.infrastructure_failures]
    rewards = [index.rewards[line] for row in kept for line in row.lines]
    pass_k = pass_at_k_of(kept, index.rewards, threshold)
    return RewardStats(
        rollouts=len(rewards),
        mean=math.fsum(rewards) / len(rewards) if rewards else None,
        histogram=reward_histogram(rewards),
        pass_k=pass_k,
        left_out=len(rows) - len(kept),
    )
