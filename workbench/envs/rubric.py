"""Rubric: weighted reward functions, scored per rollout and per group.

Reward functions are plain functions (sync or async) whose names become metric columns.
The rubric passes only the arguments a function names: `prompt`, `completion`, `answer`,
`state`, `info`, `task`, `parser`, `example_id`, and any object added with `add_class_object`
(a `JudgeRubric` adds `judge`); a function with `**kwargs` gets them all. A function whose
arguments are plural (`prompts`, `completions`, `answers`, `states`, `infos`, `tasks`) scores a
whole group and returns one float per rollout. Weight 0 (or `add_metric`) makes a logged metric
that does not enter the reward. A function that raises scores 0 for that rollout and the error
is recorded; it never kills the run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from workbench.envs.decorators import PerFunction
from workbench.envs.messages import ChatMessage
from workbench.envs.parsers import Parser
from workbench.types import RolloutError, State

RewardFunc = Callable[..., Any]

ROLLOUT_ARGS = ("prompt", "completion", "answer", "state", "info", "task", "parser", "example_id")
GROUP_ARGS = {
    "prompts": "prompt",
    "completions": "completion",
    "answers": "answer",
    "states": "state",
    "infos": "info",
    "tasks": "task",
    "example_ids": "example_id",
}


async def maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


@dataclass
class RolloutScore:
    """The scores of one rollout: the weighted reward and each function's raw score."""

    reward: float
    rewards: dict[str, float]
    metrics: dict[str, float]
    error: RolloutError | None = None


@dataclass
class ScoringInput:
    """What a reward function may ask for, for one rollout (messages as ChatMessages)."""

    prompt: list[ChatMessage]
    completion: list[ChatMessage]
    answer: str
    state: State
    info: dict[str, Any] = field(default_factory=dict)
    task: str = "default"
    example_id: int = 0


class Parameters(NamedTuple):
    """The arguments a reward function names (minus *args/**kwargs) and whether it takes **kwargs."""

    names: frozenset[str]
    takes_kwargs: bool

    @property
    def is_group(self) -> bool:
        return not self.names.isdisjoint(GROUP_ARGS)


def _read_parameters(func: RewardFunc) -> Parameters:
    params = inspect.signature(func).parameters
    names = frozenset(p.name for p in params.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params.values())
    return Parameters(names, takes_kwargs)


_parameters = PerFunction(_read_parameters)


def parameters(func: RewardFunc) -> Parameters:
    """The arguments `func` names, read once per function (decorators.PerFunction)."""
    return _parameters(func)


def is_group_func(func: RewardFunc) -> bool:
    return parameters(func).is_group


class Rubric:
    """Weighted reward functions plus a parser they can use."""

    def __init__(
        self,
        funcs: Sequence[RewardFunc] | None = None,
        weights: Sequence[float] | None = None,
        parser: Parser | None = None,
    ) -> None:
        self.funcs: list[RewardFunc] = list(funcs or ())
        # No weights (None or [], as verifiers allows) means 1.0 each.
        self.weights: list[float] = list(weights) if weights else [1.0] * len(self.funcs)
        if len(self.weights) != len(self.funcs):
            raise ValueError(f"Rubric got {len(self.funcs)} functions but {len(self.weights)} weights")
        self.parser = parser or Parser()
        # Extra objects reward functions may name as arguments (verifiers' `class_objects`),
        # e.g. `judge` on a JudgeRubric.
        self.class_objects: dict[str, object] = {}

    def add_reward_func(self, func: RewardFunc, weight: float = 1.0) -> None:
        self.funcs.append(func)
        self.weights.append(weight)

    def add_metric(self, func: RewardFunc, weight: float = 0.0) -> None:
        """A function that is logged as a metric (weight 0) rather than entering the reward."""
        self.add_reward_func(func, weight)

    def add_class_object(self, name: str, obj: object) -> None:
        """Offer `obj` to every reward function that names the argument `name`."""
        self.class_objects[name] = obj

    @property
    def func_names(self) -> list[str]:
        return [f.__name__ for f in self.funcs]

    def _kwargs_for_rollout(self, func: RewardFunc, item: ScoringInput) -> dict[str, Any]:
        names, takes_kwargs = parameters(func)
        available = {
            "prompt": item.prompt,
            "completion": item.completion,
            "answer": item.answer,
            "state": item.state,
            "info": item.info,
            "task": item.task,
            "parser": self.parser,
            "example_id": item.example_id,
            **self.class_objects,
        }
        if takes_kwargs:
            return available
        return {k: v for k, v in available.items() if k in names}

    def _kwargs_for_group(self, func: RewardFunc, items: Sequence[ScoringInput]) -> dict[str, Any]:
        names, takes_kwargs = parameters(func)
        kwargs: dict[str, Any] = {}
        for plural, singular in GROUP_ARGS.items():
            if takes_kwargs or plural in names:
                kwargs[plural] = [getattr(item, singular) for item in items]
        if takes_kwargs or "parser" in names:
            kwargs["parser"] = self.parser
        kwargs.update({k: v for k, v in self.class_objects.items() if takes_kwargs or k in names})
        return kwargs

    async def score_group(self, items: Sequence[ScoringInput]) -> list[RolloutScore]:
        """Score every rollout of one group. Never raises for a reward function's own error."""
        raw: list[dict[str, float]] = [{} for _ in items]
        errors: list[RolloutError | None] = [None for _ in items]
        for func in self.funcs:
            name = func.__name__
            if parameters(func).is_group:
                try:
                    values = await maybe_await(func(**self._kwargs_for_group(func, items)))
                    values = [float(v) for v in values]
                    if len(values) != len(items):
                        raise ValueError(
                            f"group reward '{name}' returned {len(values)} scores for {len(items)} rollouts"
                        )
                except Exception as exc:  # a broken reward function is data, not a crash
                    values = [0.0] * len(items)
                    for i in range(len(items)):
                        errors[i] = errors[i] or reward_error(name, exc)
                for i, value in enumerate(values):
                    raw[i][name] = value
                continue
            for i, item in enumerate(items):
                try:
                    raw[i][name] = float(await maybe_await(func(**self._kwargs_for_rollout(func, item))))
                except Exception as exc:
                    raw[i][name] = 0.0
                    errors[i] = errors[i] or reward_error(name, exc)
        weighted = [(f.__name__, w) for f, w in zip(self.funcs, self.weights, strict=True)]
        scores = []
        for i in range(len(items)):
            scored = raw[i]
            reward = sum(w * scored[name] for name, w in weighted)
            metrics = {name: scored[name] for name, w in weighted if w == 0}
            rewards = {name: scored[name] for name, w in weighted if w != 0}
            scores.append(
                RolloutScore(
                    reward=0.0 if errors[i] else reward, rewards=rewards, metrics=metrics, error=errors[i]
                )
            )
        return scores


def reward_error(name: str, exc: Exception) -> RolloutError:
    return RolloutError(
        type=type(exc).__name__, message=f"reward function '{name}' raised: {exc}"[:2000], where="reward"
    )
