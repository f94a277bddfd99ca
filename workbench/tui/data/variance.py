"""Reward-variance analysis of a set of groups: the numbers a user reads to decide whether an
environment is ready for RL.

RL (group-relative advantages) learns only from groups whose rollouts disagree. A group whose
within-group std is below the first bucket edge of `evaluate.summary` (0.05) carries almost no
signal: it is *too easy* when its rollouts mostly succeed (mean >= 0.5), *too hard* when they
mostly fail. Every other group is *in range*. Buckets and the run verdict are the ones
`workbench eval run` prints (`evaluate.summary`), so the TUI and the CLI agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.evaluate.summary import STD_EDGES, std_bucket, summarize
from workbench.types import Group

SIGNAL_STD = STD_EDGES[0]


def bucket_labels() -> list[str]:
    """Histogram bucket labels in order, as `std_bucket` names them."""
    labels, lower = ["0"], "0"
    for edge in STD_EDGES:
        labels.append(f"{lower}-{edge:g}")
        lower = f"{edge:g}"
    labels.append(f">={lower}")
    return labels


def difficulty(group: Group) -> str:
    """'too easy' | 'in range' | 'too hard' for one group (see the module docstring)."""
    if group.std >= SIGNAL_STD:
        return "in range"
    return "too easy" if group.mean >= 0.5 else "too hard"


@dataclass
class VarianceReport:
    """Everything the Reward variance screen shows."""

    histogram: list[tuple[str, int]]  # (bucket label, groups) in bucket order
    shares: dict[str, float]  # too easy / in range / too hard -> fraction of groups
    counts: dict[str, int]
    by_variance: list[Group]  # highest within-group std first
    summary: dict[str, Any]  # evaluate.summary.summarize of the same groups

    @property
    def num_groups(self) -> int:
        return len(self.by_variance)


def variance_report(groups: Sequence[Group]) -> VarianceReport:
    counts_by_bucket = {label: 0 for label in bucket_labels()}
    for group in groups:
        counts_by_bucket[std_bucket(group.std)] += 1
    kinds = ("too easy", "in range", "too hard")
    counts = {kind: 0 for kind in kinds}
    for group in groups:
        counts[difficulty(group)] += 1
    total = max(len(groups), 1)
    return VarianceReport(
        histogram=list(counts_by_bucket.items()),
        shares={kind: counts[kind] / total for kind in kinds},
        counts=counts,
        by_variance=sorted(groups, key=lambda g: (-g.std, g.example_id)),
        summary=summarize(list(groups)),
    )
