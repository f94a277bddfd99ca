"""Server mode with several trainer ranks: rank 0 is the orchestrator.

    workbench train configs/rl/reverse-text-server.toml --set inference.launch=true --nproc 2

prime-rl runs its orchestrator as a process of its own: it alone talks to the inference servers,
builds each step's batch and hands every trainer rank its share. Here rank 0 plays that part:

- Only rank 0 launches servers, rolls out (its `RolloutSource` generates whole batches, ahead
  of the trainer when async) and publishes weights. None of that calls a collective, so nothing
  it does in the background can interleave with the gradient all-reduces of the training thread.
- At each step every rank receives rank 0's batch with one broadcast, made from the step's own
  code in the same order on every rank, and keeps its slice of the groups (`DistInfo.shard`);
  the loss is normalized by the global token count, so the update is the one of a single
  process training the whole batch.
- Held-out evals run on rank 0 (its client names the newest published adapter) and the other
  ranks receive the numbers.

Simplifications: the whole batch, token ids included, travels through the process group (a few
hundred KB a step on the tiny model; NCCL would carry it as a CUDA tensor). FSDP is refused:
writing weights for the servers would need every rank (a full state dict gather).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TypeVar

from workbench.train.batches import StepBatch
from workbench.train.distributed import DistInfo
from workbench.train.rollout_source import RolloutSource

T = TypeVar("T")


class SharedSource:
    """The `RolloutSource` interface for every rank of a multi-process server-mode run; `source`
    is rank 0's own (None on the other ranks)."""

    def __init__(self, source: RolloutSource | None, dist: DistInfo) -> None:
        self.source = source
        self.dist = dist

    async def batch_for(self, step: int) -> StepBatch:
        batch = await self.source.batch_for(step) if self.source is not None else None
        # In a thread: rank 0's event loop keeps the next batch's requests going meanwhile.
        whole = await asyncio.to_thread(self.dist.broadcast, batch)
        assert (
            whole is not None
        )  # rank 0 always sends a batch (or has raised, and the others lose their peer)
        return rank_share(whole, self.dist)

    async def close(self) -> None:
        if self.source is not None:
            await self.source.close()


def rank_share(batch: StepBatch, dist: DistInfo) -> StepBatch:
    """This rank's part of a whole batch, shaped as if the rank had rolled it out itself: its slice
    of the groups (and of all_groups, which `gather_groups` puts back together for the metrics);
    the counts that the step sums over ranks stay with rank 0."""
    share = dataclasses.replace(
        batch, groups=dist.shard(batch.groups), all_groups=dist.shard(batch.all_groups)
    )
    if not dist.is_main:
        share.dropped = share.server_failed = 0
    return share


async def on_main(dist: DistInfo, compute: Callable[[], Awaitable[T]], empty: T) -> T:
    """`compute()` on rank 0 alone; every rank returns its result (`empty` stands in elsewhere)."""
    value = await compute() if dist.is_main else empty
    return await asyncio.to_thread(dist.broadcast, value)
