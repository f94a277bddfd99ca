"""A verifiers reward function that raises is recorded on its rollout, as Workbench's own are.

verifiers' classic rubric logs the exception and scores the function 0, so in a run's results a
crashing reward reads as a wrong answer. `record_reward_errors(rubric)` wraps the rubric's two
call points (`_call_individual_reward_func`, `_call_group_reward_func`, on every member of a
RubricGroup or EnvGroup) so that, while `collecting()` is open, each exception is kept by the state
it was scored for. verifiers' own code still runs, logs and scores the 0; Workbench then marks the
rollout with a `where="reward"` error and reward 0, as `envs/rubric.py` does for native envs.

This module is the one place Workbench uses verifiers' private rubric API, for want of a public
one: the two call points above, and `_get_reward_func_names`/`_get_reward_weights` (the weights
of a rubric, RubricGroup or EnvGroup by function name: `reward_weights`).
tests/test_verifiers_internals.py fails loudly when a verifiers release renames or reshapes them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from workbench.envs.rubric import reward_error
from workbench.types import RolloutError

# id(state) -> the first reward error of that rollout; a context variable, so groups scored
# concurrently (each in its own task) never see each other's errors.
_ERRORS: ContextVar[dict[int, RolloutError] | None] = ContextVar("workbench_reward_errors", default=None)
_MARK = "_workbench_records_reward_errors"


@contextmanager
def collecting() -> Iterator[dict[int, RolloutError]]:
    """The reward errors raised while scoring inside this block, by `id(state)`."""
    errors: dict[int, RolloutError] = {}
    token = _ERRORS.set(errors)
    try:
        yield errors
    finally:
        _ERRORS.reset(token)


def record_reward_errors(rubric: Any) -> None:
    """Wrap `rubric` (and its members) once so its reward functions' exceptions are recorded."""
    if rubric is None or getattr(rubric, _MARK, False):
        return
    individual = getattr(rubric, "_call_individual_reward_func", None)
    group = getattr(rubric, "_call_group_reward_func", None)
    if individual is not None:

        async def call_individual(func: Callable[..., Any], state: dict[str, Any]) -> float:
            return await individual(func=_recording(func, [state]), state=state)

        rubric._call_individual_reward_func = call_individual
    if group is not None:

        async def call_group(func: Callable[..., Any], states: list[dict[str, Any]]) -> list[float]:
            return await group(func=_recording(func, states), states=states)

        rubric._call_group_reward_func = call_group
    setattr(rubric, _MARK, True)
    for member in getattr(rubric, "rubrics", None) or []:  # RubricGroup
        record_reward_errors(member)
    for env in (getattr(rubric, "env_map", None) or {}).values():  # EnvGroup's rubric routes to its members'
        record_reward_errors(getattr(env, "rubric", None))


def reward_weights(rubric: Any) -> dict[str, float]:
    """Each reward function's weight by name (0: a logged metric), however the rubric is composed."""
    try:
        return dict(zip(rubric._get_reward_func_names(), rubric._get_reward_weights(), strict=False))
    except Exception:  # a rubric without the usual bookkeeping: every score counts as a reward
        return {}


def _recording(func: Callable[..., Any], states: Sequence[dict[str, Any]]) -> Callable[..., Any]:
    """`func`, keeping its exception for `states` before verifiers sees (and swallows) it.
    `functools.wraps` keeps the signature verifiers reads to pick arguments and spot group functions."""
    name = getattr(func, "__name__", "reward")

    @functools.wraps(func)
    async def recording(*args: Any, **kwargs: Any) -> Any:
        try:
            result = func(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result
        except Exception as exc:
            errors = _ERRORS.get()
            if errors is not None:
                for state in states:
                    errors.setdefault(id(state), reward_error(name, exc))
            raise

    return recording
