"""`CandidateScorer`: score a candidate (system prompt + few-shot turns) on examples through the
shared rollout engine. Every optimizer scores here — GEPA's adapter and the DSPy program alike —
so there is one scoring path: the environment's own rubric, via `run_rollouts`.

- A data instance is a `DataItem` (split + row index); one rollout per item; its score is the
  rollout's reward.
- `Budget` counts metric calls (one per example scored) and refuses a batch that would pass
  `max_calls`: optimizers check their budget between steps only, so without this the last step
  could overshoot by a whole validation pass.
- A model server's failure is never a score: a batch in which any rollout failed on the server
  (after the retries) raises `ServerFailures` and its calls are refunded; a server that is gone
  (`ServerGone`) is kept in `server_gone` so the run stops, resumable or with what it has.
- An env that refuses a candidate (it fails to load with that prompt) scores 0 on each example,
  with the error recorded on the rollout; the run goes on.
- Thread-safe: DSPy scores from several threads at once; each batch is submitted to the one
  event loop of the `AsyncBridge`.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.engine import RetryPolicy, run_rollouts
from workbench.engine.retry import Notify
from workbench.errors import ServerGone
from workbench.gepa.bridge import AsyncBridge
from workbench.gepa.prompted_env import PromptedEnvs
from workbench.types import Group, Message, Rollout, RolloutError, SamplingParams


@dataclass(frozen=True)
class DataItem:
    """One example an optimizer can ask for: row `index` of the env's `split` ('train' or 'eval')."""

    split: str
    index: int


@dataclass(frozen=True)
class Candidate:
    """What an optimizer proposes: the system prompt, and few-shot turns shown before each
    question (user/assistant messages; GEPA's candidates have none)."""

    system_prompt: str
    few_shot: tuple[Message, ...] = field(default=())


OnScored = Callable[[Candidate, Sequence[DataItem], list[Rollout]], None]


class BudgetSpent(Exception):
    """A batch would pass the metric-call budget; the optimizer stops."""


class Stopped(Exception):
    """The user stopped the run (Ctrl-C): no more calls are scored."""


class ServerFailures(Exception):
    """Rollouts of a batch failed on the model server: it has no score (see module doc)."""


class Budget:
    """Metric calls used of `max_calls` (one call = one example scored with one candidate)."""

    def __init__(self, max_calls: int, used: int = 0) -> None:
        self.max_calls = max_calls
        self.used = used
        self.exhausted = used >= max_calls
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int:
        return max(0, self.max_calls - self.used)

    def spend(self, calls: int) -> None:
        with self._lock:
            if self.used + calls > self.max_calls:
                self.exhausted = True
                raise BudgetSpent(
                    f"{calls} more metric calls would pass the budget ({self.used} of {self.max_calls} used)"
                )
            self.used += calls

    def refund(self, calls: int) -> None:
        """Calls of a batch that produced no scores (gepa does not count those either)."""
        with self._lock:
            self.used -= calls


class CandidateScorer:
    """Scores candidates on DataItems (see module doc). Counts rollouts and their errors."""

    def __init__(
        self,
        envs: PromptedEnvs,
        client: Any,
        bridge: AsyncBridge,
        sampling: SamplingParams,
        *,
        budget: Budget,
        max_concurrent: int = 32,
        state_columns: Sequence[str] = (),
        retry: RetryPolicy | None = None,
        on_group: Callable[[Group], None] | None = None,
        notify: Notify | None = None,
        on_scored: OnScored | None = None,
    ) -> None:
        self.envs = envs
        self.client = client
        self.bridge = bridge
        self.sampling = sampling
        self.budget = budget
        self.max_concurrent = max_concurrent
        self.state_columns = list(state_columns)
        self.retry = retry
        self.on_group = on_group
        self.notify = notify
        self.on_scored = on_scored
        self.server_failures = 0  # batches lost to the server (not scored, refunded)
        self.scored_calls = 0  # calls that produced scores (Budget.used also counts those in flight)
        self._lock = threading.Lock()
        self.stop = threading.Event()  # set on Ctrl-C: calls still queued in DSPy's threads are refused
        self.server_gone: ServerGone | None = None
        self.rollouts = 0
        self.rollout_errors = 0

    def request_stop(self) -> None:
        """Refuse new calls and cancel those in flight (safe from a signal handler)."""
        self.stop.set()
        self.bridge.cancel_pending()

    def score(self, batch: Sequence[DataItem], candidate: Candidate) -> list[Rollout]:
        """One rollout per item, in batch order (a repeated item is run once and shared)."""
        if self.stop.is_set():
            raise Stopped("the run was stopped")
        self.budget.spend(len(batch))
        try:
            rollouts = self._rollouts(batch, candidate)
        except ServerGone as exc:
            self.budget.refund(len(batch))
            self.server_gone = exc
            raise
        except BaseException:  # interrupted (Ctrl-C, the loop shutting down): nothing was scored
            self.budget.refund(len(batch))
            raise
        if failed := [r.error for r in rollouts if r.error is not None and r.error.infrastructure]:
            self.budget.refund(len(batch))
            self.server_failures += 1
            raise ServerFailures(
                f"{len(failed)} of {len(rollouts)} rollouts failed on the model call "
                f"({failed[0].message[:300]}): this evaluation is not scored"
            )
        with self._lock:
            self.scored_calls += len(batch)
        if self.on_scored is not None:
            self.on_scored(candidate, batch, rollouts)
        return rollouts

    def _rollouts(self, batch: Sequence[DataItem], candidate: Candidate) -> list[Rollout]:
        done: dict[DataItem, Rollout] = {}
        for split in dict.fromkeys(item.split for item in batch):
            indices = list(dict.fromkeys(item.index for item in batch if item.split == split))
            for rollout in self._run_split(split, indices, candidate):
                done[DataItem(split, rollout.example_id)] = rollout
        return [done[item] for item in batch]

    def _run_split(self, split: str, indices: list[int], candidate: Candidate) -> list[Rollout]:
        rows = self.envs.rows(split)
        collected: list[Rollout] = []

        def on_group(group: Group) -> None:  # runs on the bridge's loop thread: one at a time
            collected.extend(group.rollouts)
            self.rollouts += len(group.rollouts)
            self.rollout_errors += sum(r.error is not None for r in group.rollouts)
            if self.on_group is not None:
                self.on_group(group)

        try:
            env, examples = self.envs.examples(candidate.system_prompt, split, indices, candidate.few_shot)
            self.bridge.run(
                run_rollouts(
                    env,
                    self.client,
                    examples,
                    rollouts_per_example=1,
                    sampling=self.sampling,
                    max_concurrent=self.max_concurrent,
                    on_group=on_group,
                    state_columns=self.state_columns,
                    retry=self.retry,
                    notify=self.notify,
                )
            )
        except (
            ServerGone,
            concurrent.futures.CancelledError,
        ):  # a stop is not the env's error: never a score
            raise
        except (
            Exception
        ) as exc:  # the env refuses this candidate (rollout errors are recorded by the engine itself)
            error = RolloutError.from_exception(exc, "env")
            seen = {r.example_id for r in collected}
            for i in indices:
                if i not in seen:  # every example left scores 0 with the error on it; the run goes on
                    self.bridge.run(_deliver(on_group, Group(i, [failed_rollout(i, rows[i], error)])))
        return collected


async def _deliver(on_group: Callable[[Group], None], group: Group) -> None:
    """Call `on_group` on the loop thread, like the engine does (the counters are not locked)."""
    on_group(group)


def failed_rollout(index: int, row: dict[str, Any], error: RolloutError) -> Rollout:
    """A rollout that could not run (the env failed to load with the candidate prompt)."""
    prompt = [{"role": "user", "content": str(row.get("question", row.get("prompt", "")))}]
    return Rollout(
        example_id=index,
        rollout_index=0,
        prompt=prompt,
        answer=str(row.get("answer", "")),
        reward=0.0,
        error=error,
        stop_condition="error",
    )
