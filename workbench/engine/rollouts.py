"""`run_rollouts`: schedule rollouts with bounded concurrency, score each group as soon as its
last rollout ends, and hand finished groups to the caller (who streams them to disk).

Nothing here outlives its group: groups are started only as rollout slots free up (a few more
than `max_concurrent` rollouts wait for a slot at any time, however many examples there are), and
a finished group is handed over and dropped, so the engine's memory does not grow with the run.

Cancellation (Ctrl-C) stops in-flight rollouts; every group already handed over is kept,
which is what makes `--resume` exact: a group is either complete on disk or redone. A server
that is gone (`ServerGone`, see retry.py) ends the run the same way, raising it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence, Sized
from dataclasses import dataclass, replace
from typing import Any

from workbench import startup
from workbench.config.toml_loader import closest
from workbench.engine.retry import Notify, RetryingClient, RetryPolicy
from workbench.envs.environment import Environment, RolloutOutput
from workbench.envs.rubric import RolloutScore, maybe_await
from workbench.errors import UserError
from workbench.inference.client import Client
from workbench.types import Example, Group, Rollout, RolloutError, SamplingParams

OnGroup = Callable[[Group], Awaitable[None] | None]


@dataclass
class EngineStats:
    groups: int = 0
    rollouts: int = 0
    errors: int = 0
    retries: int = 0


def rollout_seed(base: int | None, example_id: int, rollout_index: int) -> int | None:
    """A distinct, reproducible seed per rollout (one seed for a whole group would make it identical)."""
    if base is None:
        return None
    return (base * 1_000_003 + example_id * 7_919 + rollout_index) % (2**31 - 1)


def with_seed(sampling: SamplingParams, seed: int | None) -> SamplingParams:
    """`sampling.merged({"seed": seed})`: a copy (its own `extra`, the other fields shared) with
    `seed`, made without `merged`'s generic handling of keys, since it runs once per rollout."""
    if isinstance(sampling.stop, str) or type(sampling) is not SamplingParams:  # merged's own normalising
        return sampling.merged({"seed": seed})
    return replace(sampling, seed=seed, extra=dict(sampling.extra))


def json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return repr(value)


async def run_rollouts(
    env: Environment,
    client: Client,
    examples: Iterable[Example],
    *,
    rollouts_per_example: int,
    sampling: SamplingParams,
    max_concurrent: int = 32,
    on_group: OnGroup | None = None,
    state_columns: Sequence[str] = (),
    retry: RetryPolicy | None = None,
    policy_version: int = 0,
    notify: Notify | None = None,
) -> EngineStats:
    """Run `rollouts_per_example` rollouts of each example; return counts. See module doc.
    `notify` hears of retries (a line at a time, see retry.py)."""
    if rollouts_per_example < 1 or max_concurrent < 1:
        raise ValueError("rollouts_per_example and max_concurrent must be at least 1")
    startup.release()  # the command's start-up is over (workbench/startup.py)
    retrying = RetryingClient(client, retry, notify=notify)
    slots = asyncio.Semaphore(max_concurrent)
    stats = EngineStats()

    async def one_rollout(example: Example, index: int) -> tuple[RolloutOutput, float]:
        async with slots:
            started = time.perf_counter()
            params = with_seed(sampling, rollout_seed(sampling.seed, example.example_id, index))
            try:
                output = await env.rollout(retrying, example, params)
            except Exception as exc:  # env.rollout should not raise; a bug there is still data
                output = RolloutOutput(
                    completion=[],
                    state={},
                    error=RolloutError.from_exception(exc, "env"),
                    stop_condition="error",
                )
            if retrying.gone is not None:  # the env recorded it as this rollout's error; it ends the run
                raise retrying.gone
            return output, (time.perf_counter() - started) * 1000

    async def one_group(example: Example) -> None:
        results = await asyncio.gather(*(one_rollout(example, i) for i in range(rollouts_per_example)))
        outputs = [o for o, _ in results]
        for output in outputs:  # -C names a key the env's state does not have: say so once, not N times
            if output.error is None and (missing := [c for c in state_columns if c not in output.state]):
                raise UserError(unknown_state_columns(missing, output.state))
        started = time.perf_counter()
        try:
            scores = await env.score_group(example, outputs)
        except Exception as exc:
            error = RolloutError.from_exception(exc, "reward")
            scores = [RolloutScore(0.0, {}, {}, error) for _ in outputs]
        scoring_ms = (time.perf_counter() - started) * 1000
        group = Group(
            example.example_id,
            [
                _make_rollout(example, i, out, score, total_ms, scoring_ms, state_columns, policy_version)
                for i, ((out, total_ms), score) in enumerate(zip(results, scores, strict=True))
            ],
        )
        stats.groups += 1
        stats.rollouts += len(group.rollouts)
        stats.errors += sum(r.error is not None for r in group.rollouts)
        stats.retries = retrying.retries
        if on_group is not None:
            await maybe_await(on_group(group))

    # Enough groups in flight to keep every rollout slot busy, plus one whose rollouts wait for the
    # next free slot (so a group being scored leaves no slot idle). Examples are taken in order.
    upcoming = iter(examples)
    count = -(-max_concurrent // rollouts_per_example) + 1
    if isinstance(examples, Sized):
        count = min(count, len(examples))

    async def worker() -> None:
        for example in upcoming:
            await one_group(example)

    workers = [asyncio.ensure_future(worker()) for _ in range(count)]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return stats


def unknown_state_columns(missing: Sequence[str], state: dict[str, Any]) -> str:
    """One line for -C/--state-columns keys that a rollout's state lacks, with the closest key."""
    keys = sorted(str(k) for k in state)
    name = missing[0]
    hint = f" (did you mean '{close}'?)" if (close := closest(name, keys)) else ""
    return (
        f"-C/--state-columns: the environment's rollout state has no '{name}'{hint}; "
        f"its keys: {', '.join(keys) or 'none'}"
    )


def _make_rollout(
    example: Example,
    index: int,
    out: RolloutOutput,
    score: RolloutScore,
    total_ms: float,
    scoring_ms: float,
    state_columns: Sequence[str],
    policy_version: int,
) -> Rollout:
    return Rollout(
        example_id=example.example_id,
        rollout_index=index,
        prompt=example.prompt,
        completion=out.completion,
        answer=example.answer,
        task=example.task,
        info=example.info,
        reward=0.0 if out.error else score.reward,
        rewards=score.rewards,
        metrics=score.metrics,
        num_turns=out.num_turns,
        is_truncated=out.is_truncated,
        stop_condition=out.stop_condition,
        error=out.error or score.error,
        usage=out.usage,
        timing={
            "generation_ms": round(out.generation_ms, 3),
            "scoring_ms": round(scoring_ms, 3),
            "total_ms": round(total_ms + scoring_ms, 3),
        },
        policy_version=policy_version,
        tokens=out.tokens,
        turn_tokens=out.turn_tokens,
        state_columns={c: json_safe(out.state.get(c)) for c in state_columns},
    )
