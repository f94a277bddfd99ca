"""Where each training step's rollouts come from: generated on demand, or ahead of the trainer.

On-policy (colocated, or `max_async_level = 0`): a step's batch is generated when the step
asks for it, by the policy as it is now (lag 0).

Async off-policy (server mode): a producer task generates batches ahead of the trainer, so
the batch for step n+1 is being generated while step n trains. `max_async_level` bounds how
far ahead it may run: generation of step s's batch starts only once the servers run policy
version >= s - 1 - max_async_level (version = optimizer steps applied). When a batch reaches
the trainer, groups whose policy is more than `max_off_policy_steps` behind are dropped and
replaced by fresh groups from the current policy.

Simplification: a group's policy version is the one served when its batch began. A weight
update that lands mid-batch makes some rollouts fresher than recorded, never staler, so the
recorded lag is an upper bound and the bound still holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from workbench.envs.environment import Environment
from workbench.inference.client import Client
from workbench.train.batches import StepBatch, collect_step
from workbench.train.distributed import SINGLE, DistInfo
from workbench.train.schema import TrainConfig
from workbench.types import SamplingParams


class PolicyClock:
    """The policy version new inference requests use; the producer waits on it."""

    def __init__(self, version: int = 0) -> None:
        self.version = version
        self.error: BaseException | None = None  # a weight update that failed: waiting is futile
        self._changed = asyncio.Condition()

    async def advance(self, version: int) -> None:
        async with self._changed:
            self.version = version
            self._changed.notify_all()

    async def fail(self, error: BaseException) -> None:
        async with self._changed:
            self.error = error
            self._changed.notify_all()

    async def wait_for(self, version: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.version >= version or self.error is not None)
            if self.version < version and self.error is not None:
                raise self.error


class RolloutSource:
    """`await source.batch_for(step)` in step order; `close()` stops any generation ahead."""

    def __init__(
        self,
        env: Environment,
        client: Client,
        config: TrainConfig,
        clock: PolicyClock,
        sampling_for: Callable[[int], SamplingParams],
        *,
        asynchronous: bool,
        dist: DistInfo = SINGLE,
    ) -> None:
        self.env = env
        self.client = client
        self.config = config
        self.clock = clock
        self.sampling_for = sampling_for
        self.dist = dist  # several trainer processes: each rolls out its share (colocated only)
        self.asynchronous = asynchronous and config.max_async_level > 0
        self._queue: asyncio.Queue[StepBatch | BaseException] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def batch_for(self, step: int) -> StepBatch:
        if not self.asynchronous:
            await self.clock.wait_for(step - 1)  # on-policy: the previous step's weights are served
            return await self._collect(step)
        if self._task is None:
            self._task = asyncio.create_task(self._produce(step))
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return await self._replace_stale(item, step)

    async def _produce(self, first_step: int) -> None:
        try:
            for step in range(first_step, self.config.max_steps + 1):
                await self.clock.wait_for(step - 1 - self.config.max_async_level)
                await self._queue.put(await self._collect(step))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the trainer re-raises it at its next batch
            await self._queue.put(exc)

    async def _collect(self, step: int, *, needed: int | None = None, draw: str = "") -> StepBatch:
        return await collect_step(
            self.env,
            self.client,
            self.config,
            step,
            self.sampling_for(step),
            policy_version=self.clock.version,
            needed=needed,
            draw=draw,
            dist=self.dist,
        )

    async def _replace_stale(self, batch: StepBatch, step: int) -> StepBatch:
        """Drop groups older than max_off_policy_steps; refill from the current policy."""
        oldest = step - 1 - self.config.max_off_policy_steps
        if batch.policy_version >= oldest:
            return batch
        dropped = len(batch.groups)
        await self.clock.wait_for(oldest)  # the servers may still be loading the newest weights
        fresh = await self._collect(step, needed=dropped, draw=":fresh")
        fresh.off_policy_dropped = dropped
        fresh.dropped += batch.dropped
        fresh.generation_s += batch.generation_s
        fresh.all_groups = batch.all_groups + fresh.all_groups
        return fresh

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
