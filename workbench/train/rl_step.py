"""One RL step, top to bottom: generate -> reward -> advantage -> loss -> step -> publish.

    workbench train configs/rl/reverse-text.toml

`rl_step` is the whole step; each stage is one call with a name:
  1. generate: batch_size / rollouts_per_example examples (weighted across [[env]]s), each rolled
     out rollouts_per_example times with the current policy through the shared engine
     (`batches.py`; ahead of the trainer in server mode: `rollout_source.py`)
  2. reward: the engine scores each group with the environment's rubric as it completes, so
     this stage is inside `generate`. Online difficulty filtering then drops groups that cannot
     teach (zero reward variance, too easy or too hard) and oversamples to refill the batch
  3. advantage: each rollout's reward minus its group's mean (optionally / the group's std),
     turned into token samples (`samples.py`); online distillation adds the teacher's per-token
     term (`distill.py`)
  4. loss: token-level policy gradient with the importance ratio against the sampler's logprobs
     (grpo / dapo / cispo: `loss.py`), optional k3 KL to the reference, micro-batches with
     gradient accumulation (`optimize.py`)
  5. step: gradient clipping, AdamW, the learning-rate schedule; the KL coefficient adapts
  6. publish: the new weights become the ones rollouts use (`publish.py`)
Then the step's metrics (`step_metrics.py`); the run loop (`loop.py`) logs and checkpoints.

Simplification: one optimizer step per batch (no PPO-style epochs over the same rollouts), so
colocated the importance ratio is 1 up to numerics; it matters when the sampler lags (server mode).

Several processes (--nproc, torchrun): each rank trains its share of the batch. Every rank runs
the same collectives in the same order: gathering the groups for the metrics, the distillation
and batch counts (all-reduces), the "does anyone train" vote and the gradient all-reduces inside
the optimizer step.
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path

import orjson

from workbench.errors import ServerGone
from workbench.inference.local_client import LocalClient
from workbench.inference.passing_thread import in_passing_thread
from workbench.train.batches import StepBatch
from workbench.train.context import Learner, TrainContext
from workbench.train.distill import distill
from workbench.train.distributed import gather_groups, generation_weights
from workbench.train.optimize import StepStats, adapt_kl_beta, train_on_samples
from workbench.train.publish import publish_weights
from workbench.train.samples import Sample, groups_to_samples
from workbench.train.step_metrics import (
    Metrics,
    StepTimes,
    batch_metrics,
    completion_tokens,
    count_batch,
    reward_metrics,
    rollout_metrics,
    scored_rollouts,
    time_metrics,
    train_metrics,
)
from workbench.types import Group


async def rl_step(ctx: TrainContext, learner: Learner, step: int) -> Metrics:
    """Step `step` (1-based): train on one batch of rollouts; returns the step's metrics."""
    started = time.perf_counter()
    learning_rate = learner.learning_rate  # this step's (the scheduler moves on when it trains)

    # 1-2. generate and reward: this rank's groups from the current policy, each scored by the
    # environment's rubric as it completes (in the engine), difficulty-filtered
    batch = await generate(ctx, learner, step)
    wait_s = time.perf_counter() - started
    everyone = gather_groups(ctx.dist, batch.all_groups)  # every rank's groups: the metrics use these
    stop_if_no_server_answered(everyone, step)
    if ctx.dist.is_main:
        write_rollouts(ctx.files.run_dir, step, everyone)

    # 3. advantage: reward - group mean (/ std), on every sampled token of its rollout
    samples = groups_to_samples(batch.groups, ctx.config)
    distilled = (
        await distill(ctx.teacher, samples, ctx.sampling.temperature, ctx.dist)
        if ctx.teacher is not None
        else {}
    )
    counts = count_batch(ctx.dist, batch, samples)

    # 4-5. loss, backward, optimizer step
    stats = await optimize(ctx, learner, samples)

    # 6. publish: the next batch's rollouts come from the new weights
    sync_s = await publish_weights(ctx.inference.publisher, ctx.inference.clock, step)

    # metrics: rewards and rollouts of every rank, counts summed over ranks (step_metrics.py)
    rollouts = scored_rollouts(everyone)
    step_s = time.perf_counter() - started
    times = StepTimes(
        step=step_s,
        wait_rollouts=wait_s,
        generation=batch.generation_s,
        weight_sync=sync_s,
        forward_backward=stats.forward_backward_s if stats is not None else 0.0,
        optimizer=stats.optimizer_s if stats is not None else 0.0,
    )
    publisher = ctx.inference.publisher
    return {
        **batch_metrics(batch, counts, lag=(step - 1) - batch.policy_version),
        **distilled,
        **train_metrics(stats, learner.kl_beta if ctx.config.kl_penalty.enabled else None),
        **reward_metrics(rollouts),
        "train/learning_rate": learning_rate,
        **rollout_metrics(rollouts, counts),
        **time_metrics(
            times,
            completion_tokens(rollouts) + counts.sample_tokens,
            server_mode=ctx.inference.server_mode,
            weight_push=publisher.last_push_s if publisher is not None else None,
        ),
    }


async def generate(ctx: TrainContext, learner: Learner, step: int) -> StepBatch:
    """The step's batch from the rollout source: generated now by the trainer's own model
    (colocated), or taken from what the servers generated ahead (server mode)."""
    assert ctx.inference.source is not None  # RL runs have one (setup.build_context)
    if not ctx.inference.server_mode:
        learner.policy.model.eval()  # colocated: the trainer's own model generates
    with generation_weights(learner.policy):
        return await ctx.inference.source.batch_for(step)


async def optimize(ctx: TrainContext, learner: Learner, samples: list[Sample]) -> StepStats | None:
    """Loss, backward and one optimizer step on this rank's samples; None when no rank has a
    sample that teaches (every group filtered out, or every advantage zero): nothing to learn."""
    if not ctx.dist.any(bool(samples) and any(s.teaches for s in samples)):  # every rank trains, or none
        return None
    train = functools.partial(
        train_on_samples,
        learner.policy,
        learner.optimizer,
        learner.scheduler,
        samples,
        ctx.config,
        temperature=ctx.sampling.temperature,
        kl_beta=learner.kl_beta,
        dist=ctx.dist,
    )
    # Server mode trains in a thread so the event loop keeps generating the next batch. Colocated,
    # the step blocks the loop (nothing generates meanwhile) on the client's decode thread: one
    # thread team and one malloc arena for both (`LocalClient.run_between_batches`); elsewhere in a
    # thread that ends with it, as a team left in this thread would slow the decode thread.
    client = ctx.inference.client
    if ctx.inference.server_mode:
        stats = await asyncio.to_thread(train)
    elif isinstance(client, LocalClient) and ctx.dist.device == "cpu":
        stats = client.run_between_batches(train)
    else:
        stats = in_passing_thread(train, device=ctx.dist.device)
    if ctx.config.kl_penalty.enabled:
        learner.kl_beta = adapt_kl_beta(learner.kl_beta, stats.kl, ctx.config.kl_penalty.target_kl)
    return stats


def stop_if_no_server_answered(groups: list[Group], step: int) -> None:
    """Every rollout failed after the engine's retries: the servers are gone, training on nothing
    would only burn steps. The run loop turns it into the stop line with the resume command."""
    if groups and all(g.infrastructure_failures for g in groups):
        raise ServerGone("no inference server answered (every rollout failed after retries)")


def write_rollouts(run_dir: Path, step: int, groups: list[Group]) -> None:
    """rollouts/step_N.jsonl: every rollout of the step, as eval writes them (without token ids)."""
    folder = run_dir / "rollouts"
    folder.mkdir(exist_ok=True)
    with (folder / f"step_{step}.jsonl").open("wb") as f:
        for group in groups:
            for rollout in group.rollouts:
                record = rollout.to_record()
                record.pop("tokens", None)  # large and only needed in memory
                f.write(orjson.dumps(record) + b"\n")
