"""Reward-variance analysis of a set of groups: the numbers a user reads to decide whether an
environment is ready for RL.

Groups are judged by the engine's one difficulty rule (`engine.difficulty`: too easy / in range
/ no signal / too hard), and the buckets and run verdict are the ones `workbench eval run` prints
(`engine.summary`), so the TUI, the CLI and training's difficulty filter agree.

`index_variance_report` builds the report from a `RolloutIndex`'s group rows (mean, std, flags
and the per-line rewards it already holds), without reading a record back: what the Reward
variance screen uses, so a 100,000-rollout run opens there as fast as in Rollouts.
`variance_report` builds the same report from loaded `Group`s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from workbench.engine.difficulty import (
    DEFAULT_RULE,
    DIFFICULTIES,
    Difficulty,
    Scored,
    difficulty_counts,
    run_verdict,
)
from workbench.engine.summary import STD_EDGES, std_bucket, summarize
from workbench.tui.data.rollout_index import GroupRow, RolloutIndex
from workbench.types import Group


class VarianceRow(Scored, Protocol):
    """One example's group as the report lists it: a `Group` or the index's `GroupRow`."""

    @property
    def example_id(self) -> int: ...


def bucket_labels() -> list[str]:
    """Histogram bucket labels in order, as `std_bucket` names them."""
    labels, lower = ["0"], "0"
    for edge in STD_EDGES:
        labels.append(f"{lower}-{edge:g}")
        lower = f"{edge:g}"
    labels.append(f">={lower}")
    return labels


def difficulty(group: Scored) -> Difficulty:
    """'too easy' | 'in range' | 'no signal' | 'too hard' for one group, by the engine's default rule."""
    return DEFAULT_RULE.classify(group)


@dataclass
class VarianceReport:
    """Everything the Reward variance screen shows."""

    histogram: list[tuple[str, int]]  # (bucket label, groups) in bucket order
    shares: dict[Difficulty, float]  # too easy / in range / no signal / too hard -> fraction of groups
    counts: dict[Difficulty, int]
    by_variance: Sequence[VarianceRow]  # highest within-group std first, then by example id
    # engine.summary.summarize of the same groups: all of it from `variance_report`; from
    # `index_variance_report` the keys the numbers of an index give, with summarize's values
    # (see `index_summary`).
    summary: dict[str, Any]

    @property
    def num_groups(self) -> int:
        return len(self.by_variance)


def _report(rows: Sequence[VarianceRow], summary: dict[str, Any]) -> VarianceReport:
    counts_by_bucket = {label: 0 for label in bucket_labels()}
    for row in rows:
        counts_by_bucket[std_bucket(row.std)] += 1
    counts = difficulty_counts(rows)
    total = max(len(rows), 1)
    return VarianceReport(
        histogram=list(counts_by_bucket.items()),
        shares={kind: counts[kind] / total for kind in DIFFICULTIES},
        counts=counts,
        by_variance=sorted(rows, key=lambda g: (-g.std, g.example_id)),
        summary=summary,
    )


def variance_report(groups: Sequence[Group]) -> VarianceReport:
    """The report of loaded groups (every rollout in memory)."""
    return _report(groups, summarize(list(groups)))


def index_variance_report(index: RolloutIndex) -> VarianceReport:
    """The report of the groups an index holds, from its rows alone (no record is read).
    Equal to `variance_report(index.load_groups())` in everything it shows."""
    rows = index.groups()
    return _report(rows, index_summary(rows, index.rewards))


def index_summary(rows: Sequence[GroupRow], rewards: Sequence[float]) -> dict[str, Any]:
    """The part of `engine.summary.summarize` that an index's numbers determine, with the same
    values for the same groups: group and rollout counts, mean reward (over the groups that are
    results: a group with a rollout the serving side failed is counted apart), the share of
    zero-variance groups, the run verdict, and the infrastructure-failure counts when any (not the
    server's messages, which only the records hold).
    `rewards` are the index's per-line rewards (`RolloutIndex.rewards`)."""
    kept = [row for row in rows if not row.infrastructure_failures]
    failed = len(rows) - len(kept)
    lost = (
        {
            "infrastructure_failures": sum(row.infrastructure_failures for row in rows),
            "incomplete_groups": failed,
        }
        if failed
        else {}
    )
    num_rollouts = sum(row.size for row in kept)
    if not num_rollouts:
        return {"num_groups": 0, "num_rollouts": 0, **lost}
    # summarize's mean is the correctly rounded sum over the count, as fsum gives (index rewards
    # are always finite: JSON has no infinity, and orjson refuses numbers that overflow)
    mean = math.fsum(rewards[line] for row in kept for line in row.lines) / num_rollouts
    return {
        "num_groups": len(kept),
        "num_rollouts": num_rollouts,
        "reward_mean": mean,
        "zero_variance_frac": sum(row.std < 1e-9 for row in kept) / len(kept),
        "verdict": run_verdict(mean),
        **lost,
    }
