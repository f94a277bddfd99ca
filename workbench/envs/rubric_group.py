"""`RubricGroup`: several rubrics scored as one, as verifiers' `RubricGroup(rubrics=[...])`.

For environments whose reward comes from rubrics that each own a parser or a judge (say a
`MathRubric` for correctness plus a `JudgeRubric` for style): every member scores the rollout
with its own functions and parser, the rewards add up, and every member's function names become
columns (a name two members share adds up too, as in verifiers). A member's reward-function error
is recorded on the rollout exactly as a single rubric records it.
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.envs.parsers import Parser
from workbench.envs.rubric import RewardFunc, RolloutScore, Rubric, ScoringInput


def _add(into: dict[str, float], scores: dict[str, float]) -> None:
    for name, value in scores.items():
        into[name] = into.get(name, 0.0) + value


class RubricGroup(Rubric):
    """The sum of its member rubrics. Functions given to the group itself are scored as one more
    member; `add_reward_func` / `add_metric` go to the first member (verifiers does the same)."""

    def __init__(
        self,
        rubrics: Sequence[Rubric],
        funcs: Sequence[RewardFunc] | None = None,
        weights: Sequence[float] | None = None,
        parser: Parser | None = None,
    ) -> None:
        if not rubrics:
            raise ValueError("RubricGroup needs at least one rubric")
        super().__init__(funcs, weights, parser)
        self.rubrics: list[Rubric] = list(rubrics)

    def add_reward_func(self, func: RewardFunc, weight: float = 1.0) -> None:
        self.rubrics[0].add_reward_func(func, weight)

    def add_class_object(self, name: str, obj: object) -> None:
        self.rubrics[0].add_class_object(name, obj)

    @property
    def func_names(self) -> list[str]:
        names = [name for rubric in self.rubrics for name in rubric.func_names]
        return names + [f.__name__ for f in self.funcs]

    async def score_group(self, items: Sequence[ScoringInput]) -> list[RolloutScore]:
        members: list[Rubric] = (
            [*self.rubrics, Rubric(self.funcs, self.weights, self.parser)] if self.funcs else self.rubrics
        )
        totals = [RolloutScore(reward=0.0, rewards={}, metrics={}) for _ in items]
        for rubric in members:
            for total, score in zip(totals, await rubric.score_group(items), strict=True):
                total.reward += score.reward
                _add(total.rewards, score.rewards)
                _add(total.metrics, score.metrics)
                total.error = total.error or score.error
        for total in totals:
            if total.error is not None:  # as in Rubric: a rollout whose reward function failed scores 0
                total.reward = 0.0
        return totals
