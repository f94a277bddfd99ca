"""Reward-variance analysis of a set of groups: the numbers a user reads to decide whether an
environment is ready for RL.

Groups are judged by the engine's one difficulty rule (`engine.difficulty`: too easy / in range
/ too hard), and the buckets and run verdict are the ones `workbench eval run` prints
(`engine.summary`), so the TUI, the CLI and training's difficulty filter agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.engine.difficulty import DEFAULT_RULE, DIFFICULTIES, Difficulty, difficulty_counts
from workbench.engine.summary import STD_EDGES, std_bucket, summarize
from workbench.types import Group


def bucket_labels() -> list[str]:
    """Histogram bucket labels in order, as `std_bucket` names them."""
    labels, lower = ["0"], "0"
    for edge in STD_EDGES:
        labels.append(f"{lower}-{edge:g}")
        lower = f"{edge:g}"
    labels.append(f">={lower}")
    return labels


def difficulty(group: Group) -> Difficulty:
    """'too easy' | 'in range' | 'too hard' for one group, by the engine's default rule."""
    return DEFAULT_RULE.classify(group)


@dataclass
class VarianceReport:
    """Everything the Reward variance screen shows."""

    histogram: list[tuple[str, int]]  # (bucket label, groups) in bucket order
    shares: dict[str, float]  # too easy / in range / too hard -> fraction of groups
    counts: dict[str, int]
    by_variance: list[Group]  # highest within-group std first
    summary: dict[str, Any]  # engine.summary.summarize of the same groups

    @property
    def num_groups(self) -> int:
        return len(self.by_variance)


def variance_report(groups: Sequence[Group]) -> VarianceReport:
    counts_by_bucket = {label: 0 for label in bucket_labels()}
    for group in groups:
        counts_by_bucket[std_bucket(group.std)] += 1
    counts: dict[str, int] = dict(difficulty_counts(groups))
    total = max(len(groups), 1)
    return VarianceReport(
        histogram=list(counts_by_bucket.items()),
        shares={kind: counts[kind] / total for kind in DIFFICULTIES},
        counts=counts,
        by_variance=sorted(groups, key=lambda g: (-g.std, g.example_id)),
        summary=summarize(list(groups)),
    )
