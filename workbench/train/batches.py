"""Collect one training step's groups: sample examples, run rollouts through the engine, filter.

Online difficulty filtering drops groups that cannot teach the policy anything (zero or too
little reward variance) or are too easy/hard, and oversamples more examples until the batch
is full or `oversampling_factor` x the needed examples have been tried.

Multi-process (`dist`): every rank draws the same examples and rolls out only its slice; the
ids of kept groups are shared after each draw, so all ranks agree on when the batch is full and
on which groups make the first `needed` (the rank's `groups` are its share of those).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from workbench.engine import run_rollouts
from workbench.engine.difficulty import DifficultyRule
from workbench.envs import EnvGroup
from workbench.envs.environment import Environment
from workbench.inference.client import Client
from workbench.train.distributed import SINGLE, DistInfo
from workbench.train.schema import TrainConfig
from workbench.types import Example, Group, SamplingParams


@dataclass
class StepBatch:
    groups: list[Group]
    dropped: int = 0
    sampled_examples: int = 0
    all_groups: list[Group] = field(default_factory=list)  # including dropped ones (for logging)
    policy_version: int = 0  # optimizer steps in the weights being served when generation began
    generation_s: float = 0.0
    off_policy_dropped: int = 0  # groups replaced because their policy was too old
    server_failed: int = 0  # groups left out because the inference server failed a rollout of them


def sample_examples(env: Environment, n: int, rng: random.Random) -> list[Example]:
    """`n` training examples; an EnvGroup draws members by weight."""
    if isinstance(env, EnvGroup):
        return env.sample_examples(n, "train", rng)
    rows = env.rows("train")
    return [env.example_from_row(i, rows[i]) for i in (rng.randrange(len(rows)) for _ in range(n))]


def keep_group(group: Group, config: TrainConfig) -> bool:
    """Online difficulty filtering: keep only groups the engine's difficulty rule finds in range."""
    f = config.difficulty_filter
    if not f.enabled or (config.mode == "distill" and config.distill.reward_weight == 0):
        return True  # a distillation that ignores the reward learns from every group, scored or not
    return DifficultyRule.from_variance(f.min_reward_variance, f.min_reward, f.max_reward).teaches(group)


async def collect_step(
    env: Environment,
    client: Client,
    config: TrainConfig,
    step: int,
    sampling: SamplingParams,
    *,
    policy_version: int = 0,
    needed: int | None = None,
    draw: str = "",
    dist: DistInfo = SINGLE,
) -> StepBatch:
    """`needed` groups (default: a full batch) for `step`; `draw` salts the example stream so a
    refill of the same step gets other examples. With several trainer processes each rank
    rolls out its share of the examples; all ranks agree on which groups fill the batch."""
    started = time.perf_counter()
    needed = config.batch_size // config.rollouts_per_example if needed is None else needed
    rng = random.Random(f"{config.seed}:{step}{draw}")  # per-step stream: resume replays the same examples
    budget = (
        max(needed, int(needed * config.difficulty_filter.oversampling_factor))
        if config.difficulty_filter.enabled
        else needed
    )
    batch = StepBatch(groups=[], policy_version=policy_version)
    kept: list[int] = []  # example ids of the groups kept so far, on every rank
    while len(kept) < needed and batch.sampled_examples < budget:
        want = min(needed - len(kept), budget - batch.sampled_examples)
        examples = sample_examples(env, want, rng)
        # distinct example ids per draw so groups never merge, even if an example repeats
        for offset, example in enumerate(examples):
            example.example_id = batch.sampled_examples + offset
        batch.sampled_examples += len(examples)
        collected: list[Group] = []
        await run_rollouts(
            env,
            client,
            dist.shard(examples),
            rollouts_per_example=config.rollouts_per_example,
            sampling=sampling,
            max_concurrent=config.step_concurrency(),
            on_group=collected.append,
            policy_version=policy_version,
        )
        collected.sort(key=lambda g: g.example_id)
        batch.all_groups.extend(collected)
        for group in collected:
            if group.infrastructure_failures:  # the server failed it: no result, never trained on
                batch.server_failed += 1
            elif keep_group(group, config):
                batch.groups.append(group)
            else:
                batch.dropped += 1
        kept = sorted(i for ids in dist.all_gather([g.example_id for g in batch.groups]) for i in ids)
    first = set(kept[:needed])
    batch.groups = [g for g in batch.groups if g.example_id in first]
    batch.generation_s = time.perf_counter() - started
    return batch
