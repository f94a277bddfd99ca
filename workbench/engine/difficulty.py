"""The one difficulty rule: can a group of rollouts teach RL anything?

Group-relative RL learns only from groups whose rollouts disagree. A group whose within-group
reward std is below `min_std` (or exactly zero: every advantage is 0) carries no signal, and its
mean says why: *too hard* when its rollouts all (nearly) fail (mean <= FLAT_HARD), *too easy* when
they all (nearly) succeed (mean >= FLAT_EASY), and plain *no signal* in between (every rollout got
the same partial reward: more samples or a finer reward would help, an easier or harder example
would not). A group with signal is still too easy/hard when its mean is outside
[min_reward, max_reward].

Used by the eval summary and the TUI's variance view (the default rule) and by training's online
difficulty filter (`difficulty_filter` in the config), so all three agree on what a group is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

Difficulty = Literal["too easy", "in range", "no signal", "too hard"]
DIFFICULTIES: tuple[Difficulty, ...] = ("too easy", "in range", "no signal", "too hard")

# Within-group std below this carries almost no signal (the first bucket edge of the eval
# summary's std histogram).
SIGNAL_STD = 0.05
ZERO_STD = 1e-6  # float noise: a group this flat scored every rollout the same
# A flat group's mean at or below FLAT_HARD is a failure every time (too hard), at or above
# FLAT_EASY a success every time (too easy); between them it is "no signal" (issue 35: a flat group
# at mean 0.35 used to be called too hard).
FLAT_HARD = 0.1
FLAT_EASY = 0.9


class Scored(Protocol):
    """What the rule reads of a group: its mean reward and within-group (population) std. A
    `workbench.types.Group`, or a row of those two numbers without the rollouts (the TUI's)."""

    @property
    def mean(self) -> float: ...

    @property
    def std(self) -> float: ...


@dataclass(frozen=True)
class DifficultyRule:
    min_std: float = SIGNAL_STD
    min_reward: float = 0.0
    max_reward: float = 1.0

    @classmethod
    def from_variance(cls, min_variance: float, min_reward: float, max_reward: float) -> DifficultyRule:
        """The rule for a training config, which states the threshold as a variance."""
        return cls(min_std=math.sqrt(min_variance), min_reward=min_reward, max_reward=max_reward)

    def classify(self, group: Scored) -> Difficulty:
        std = group.std
        if std <= ZERO_STD or std < self.min_std:
            if group.mean <= FLAT_HARD:
                return "too hard"
            return "too easy" if group.mean >= FLAT_EASY else "no signal"
        if group.mean > self.max_reward:
            return "too easy"
        if group.mean < self.min_reward:
            return "too hard"
        return "in range"

    def teaches(self, group: Scored) -> bool:
        return self.classify(group) == "in range"


DEFAULT_RULE = DifficultyRule()


def run_verdict(mean_reward: float) -> str:
    """Is an environment ready for RL with this model? Judged on a run's mean reward."""
    if mean_reward > 0.8:
        return "too easy for RL (mean reward over 80%)"
    if mean_reward < 0.05:
        return "too hard for RL (mean reward under 5%)"
    if 0.1 <= mean_reward <= 0.7:
        return "good range for RL (10-70%)"
    return "borderline for RL (between the good range and too easy/hard)"


def difficulty_counts(groups: Iterable[Scored], rule: DifficultyRule = DEFAULT_RULE) -> dict[Difficulty, int]:
    """How many groups are too easy, in range, without signal and too hard under `rule`."""
    counts: dict[Difficulty, int] = dict.fromkeys(DIFFICULTIES, 0)
    for group in groups:
        counts[rule.classify(group)] += 1
    return counts
