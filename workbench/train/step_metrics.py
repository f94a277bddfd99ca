"""The numbers a training step logs (metrics.jsonl, W&B, the step line): every name in one place.

Names follow DESIGN §7 (`reward/mean`, `train/loss`, ...); `metrics.py` writes them. An RL step's
metrics come in the order the step makes them: the batch, distillation, the optimizer step, the
rewards, the rollouts, the timings. Reward and rollout numbers are over every rank's rollouts
(`gather_groups`), training numbers over every rank's samples (`count_batch`, one all-reduce).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from workbench.train.batches import StepBatch
from workbench.train.distributed import DistInfo
from workbench.train.optimize import StepStats
from workbench.train.samples import Sample
from workbench.types import Group, Rollout

Metrics = dict[str, float]


@dataclass
class BatchCounts:
    """The step's counts summed over every rank."""

    trained: float  # samples trained on (0 when the rank rolled out nothing)
    sample_tokens: float  # tokens of those samples (prompt + completion)
    dropped: float  # groups the difficulty filter dropped
    server_failed: float  # groups the inference server failed
    rollouts: float  # rollouts the samples came from


def count_batch(dist: DistInfo, batch: StepBatch, samples: Sequence[Sample]) -> BatchCounts:
    """This rank's counts summed with every other rank's (one all-reduce: every rank calls it)."""
    rollouts = sum(len(g.rollouts) for g in batch.groups)
    return BatchCounts(
        *dist.sum(
            [
                len(samples) if rollouts else 0,
                sum(len(s.input_ids) for s in samples),
                batch.dropped,
                batch.server_failed,
                rollouts,
            ]
        )
    )


def batch_metrics(batch: StepBatch, counts: BatchCounts, lag: int) -> Metrics:
    return {
        "filter/dropped_groups": int(counts.dropped),
        "rollout/server_failed_groups": int(counts.server_failed),
        "rollout/generation_time": batch.generation_s,
        "policy/lag": lag,
        "policy/off_policy_dropped": batch.off_policy_dropped,
    }


def train_metrics(stats: StepStats | None, kl_beta: float | None) -> Metrics:
    """The optimizer step's numbers; `stats` None: nothing was trained (every group filtered out
    or zero advantage). `kl_beta`: the KL coefficient after the step, when the KL penalty is on."""
    if stats is None:
        return {
            "train/loss": 0.0,
            "train/grad_norm": 0.0,
            "time/forward_backward": 0.0,
            "time/optimizer": 0.0,
        }
    return {
        **({"policy/kl_beta": kl_beta} if kl_beta is not None else {}),
        "train/loss": stats.loss,
        "train/grad_norm": stats.grad_norm,
        "policy/entropy": stats.entropy,
        "policy/kl": stats.kl,
        "policy/importance_ratio": stats.ratio_mean,
        "policy/clip_frac": stats.clip_frac,
        "policy/mismatch_kl": stats.mismatch_kl,
        "policy/mismatch_kl_max": stats.mismatch_kl_max,
        "policy/mismatch_kl_std": stats.mismatch_kl_std,
        **dppo_metrics(stats),
        "time/forward_backward": stats.forward_backward_s,
        "time/optimizer": stats.optimizer_s,
        "train/padding_fraction": stats.padding_fraction,
    }


def dppo_metrics(stats: StepStats) -> Metrics:
    """loss = "dppo": the shares of the step's loss tokens its trust region masked (all, and those
    with a positive / a negative-or-zero advantage), and prime-rl's `masked_advantage_positive` /
    `_negative`: of the masked tokens, the share whose advantage was positive / not. A rising
    masked share means the policy moves faster than the sampler keeps up with."""
    if stats.masked_frac is None or stats.masked_frac_high is None or stats.masked_frac_low is None:
        return {}
    masked = stats.masked_frac
    return {
        "policy/masked_frac": masked,
        "policy/masked_frac_high": stats.masked_frac_high,
        "policy/masked_frac_low": stats.masked_frac_low,
        "policy/masked_advantage_positive": stats.masked_frac_high / masked if masked > 0 else 0.0,
        "policy/masked_advantage_negative": stats.masked_frac_low / masked if masked > 0 else 0.0,
    }


def scored_rollouts(groups: Sequence[Group]) -> list[Rollout]:
    """The rollouts that have a result: a group the server failed is left out of the reward
    numbers (it is counted in rollout/server_failed_groups)."""
    return [r for g in groups if not g.infrastructure_failures for r in g.rollouts]


def reward_metrics(rollouts: Sequence[Rollout]) -> Metrics:
    """Mean and spread of the reward, and the mean of every reward function (weighted ones and
    the weight-0 ones kept as metrics) as reward/<name>."""
    rewards = [r.reward for r in rollouts] or [0.0]
    return {
        "reward/mean": sum(rewards) / len(rewards),
        "reward/std": statistics.pstdev(rewards),
        **{f"reward/{name}": value for name, value in _func_means(rollouts).items()},
    }


def rollout_metrics(rollouts: Sequence[Rollout], counts: BatchCounts) -> Metrics:
    count = max(len(rollouts), 1)
    return {
        "rollout/mean_length": completion_tokens(rollouts) / count,
        "rollout/truncated_frac": sum(r.is_truncated for r in rollouts) / count,
        "rollout/errors": sum(r.error is not None for r in rollouts),
        "rollout/trained_samples": int(counts.trained),
        # > 1 for multi-turn rollouts under trajectory_strategy = "branching" (one sample per turn)
        "rollout/samples_per_rollout": counts.trained / max(counts.rollouts, 1),
    }


@dataclass
class StepTimes:
    """Where an RL step's seconds went."""

    step: float  # the whole step
    wait_rollouts: float  # waiting for the batch (colocated: generating it)
    generation: float  # generating the batch (server mode: overlapped with the previous step)
    weight_sync: float  # waiting to publish the new weights (0 colocated)
    forward_backward: float
    optimizer: float


def time_metrics(
    times: StepTimes, tokens: float, *, server_mode: bool, weight_push: float | None = None
) -> Metrics:
    """Throughput and timings. `weight_push`: how long the newest completed push took on the
    servers (server mode, on the rank that publishes)."""
    metrics: Metrics = {
        "perf/tokens_per_s": tokens / times.step,
        "time/wait_rollouts": times.wait_rollouts,
        "time/step": times.step,
    }
    if weight_push is not None:
        metrics["time/weight_sync"] = times.weight_sync  # the trainer waited: the write, a push still running
        metrics["time/weight_push"] = weight_push
    # Colocated, generation happens inside the wait; async, it overlaps the previous step.
    busy = (times.wait_rollouts if server_mode else times.generation) + times.weight_sync
    metrics["time/other"] = max(0.0, times.step - busy - times.forward_backward - times.optimizer)
    return metrics


def sft_metrics(stats: StepStats, learning_rate: float, step_s: float) -> Metrics:
    return {
        "train/loss": stats.loss,
        "train/grad_norm": stats.grad_norm,
        "policy/entropy": stats.entropy,
        "train/learning_rate": learning_rate,
        "perf/tokens_per_s": stats.tokens / step_s,
        "time/forward_backward": stats.forward_backward_s,
        "time/optimizer": stats.optimizer_s,
        "time/step": step_s,
        "train/padding_fraction": stats.padding_fraction,
    }


def completion_tokens(rollouts: Sequence[Rollout]) -> int:
    return sum(r.usage.get("completion_tokens", 0) for r in rollouts)


def _func_means(rollouts: Sequence[Rollout]) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for r in rollouts:  # weighted reward functions, and the weight-0 ones kept as metrics
        for name, value in {**r.rewards, **r.metrics}.items():
            sums.setdefault(name, []).append(value)
    return {name: sum(v) / len(v) for name, v in sums.items()}
