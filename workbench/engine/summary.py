"""Reward statistics of a set of scored groups: what `eval run` prints, `eval show` reads and the
TUI's variance view shows.

The point of an eval here is to decide whether an environment is ready for RL, so besides the
mean reward it reports how rewards vary *inside* groups: RL learns only from groups whose
rollouts disagree.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from workbench.engine.difficulty import SIGNAL_STD, run_verdict
from workbench.types import Group

# Within-group std bucket edges for the distribution line; a std of 0 teaches RL nothing.
STD_EDGES = (SIGNAL_STD, 0.1, 0.2, 0.3)


def std_bucket(std: float) -> str:
    if std < 1e-9:
        return "0"
    lower = "0"
    for edge in STD_EDGES:
        if std < edge:
            return f"{lower}-{edge:g}"
        lower = f"{edge:g}"
    return f">={lower}"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021): chance that k of n samples include a pass."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def summarize(groups: Sequence[Group], elapsed_s: float | None = None) -> dict[str, Any]:
    """Statistics of the groups that are results. A group with a rollout the serving side failed
    (connection, timeout, 5xx after retries) is none: it is counted apart, never as a 0 reward."""
    failed = [g for g in groups if g.infrastructure_failures]
    groups = [g for g in groups if not g.infrastructure_failures]
    rollouts = [r for g in groups for r in g.rollouts]
    lost = {"infrastructure_failures": sum(g.infrastructure_failures for g in failed),
            "incomplete_groups": len(failed)} if failed else {}
    if not rollouts:
        return {"num_groups": 0, "num_rollouts": 0, **lost}
    rewards = [r.reward for r in rollouts]
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards)
    per_func: dict[str, list[float]] = {}
    for r in rollouts:
        for name, value in {**r.rewards, **r.metrics}.items():
            per_func.setdefault(name, []).append(value)
    group_stds = [g.std for g in groups]
    zero_var = sum(s < 1e-9 for s in group_stds)
    buckets = Counter(std_bucket(s) for s in group_stds)
    summary: dict[str, Any] = {
        "num_groups": len(groups),
        "num_rollouts": len(rollouts),
        "reward_mean": mean,
        "reward_std": std,
        "reward_funcs": {name: statistics.fmean(values) for name, values in per_func.items()},
        "group_std_mean": statistics.fmean(group_stds),
        "group_std_quantiles": _quantiles(group_stds),
        "group_std_histogram": dict(buckets),
        "zero_variance_frac": zero_var / len(groups),
        "verdict": run_verdict(mean),
        "prompt_tokens_mean": statistics.fmean(r.usage.get("prompt_tokens", 0) for r in rollouts),
        "completion_tokens_mean": statistics.fmean(r.usage.get("completion_tokens", 0) for r in rollouts),
        "num_turns_mean": statistics.fmean(r.num_turns for r in rollouts),
        "truncated_frac": sum(r.is_truncated for r in rollouts) / len(rollouts),
        "errors": sum(r.error is not None for r in rollouts),
        "error_types": dict(Counter(f"{r.error.where}:{r.error.type}" for r in rollouts if r.error)),
    }
    if all(v in (0.0, 1.0) for v in rewards):
        sizes = Counter(len(g.rollouts) for g in groups)
        n = sizes.most_common(1)[0][0]
        summary["pass_at_k"] = {
            f"pass@{k}": statistics.fmean(pass_at_k(len(g.rollouts), sum(g.rewards), k) for g in groups)
            for k in _powers_of_two(n)
        }
    if elapsed_s is not None:
        summary["elapsed_s"] = elapsed_s
    return {**summary, **lost}


def _powers_of_two(n: int) -> list[int]:
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks


def _quantiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]

    return {"p10": q(0.1), "p50": q(0.5), "p90": q(0.9), "max": ordered[-1]}
