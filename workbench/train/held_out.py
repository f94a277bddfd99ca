"""Held-out evaluation during RL: `[eval] interval = N` measures the policy every N steps (and
before the first) on examples it never trains on, logged as eval/reward_mean.

Simplification: one seed for every evaluation (`held_out_sampling`), so the curve moves with the
policy, not with the draws.
"""

from __future__ import annotations

import dataclasses

from workbench.engine import run_rollouts
from workbench.train.context import EvalEnv, TrainContext
from workbench.train.distributed import SINGLE, generation_weights
from workbench.train.policy import Policy
from workbench.train.schema import TrainConfig
from workbench.train.setup import step_seed
from workbench.train.shared_source import on_main
from workbench.types import Group, SamplingParams

EVAL_SEED_STEP = 10_000_019  # beyond any run's steps: evaluation never samples with a training step's seed


async def held_out_eval(ctx: TrainContext, policy: Policy) -> dict[str, float]:
    """Mean reward on the first `eval.num_examples` examples of the eval split (never trained on)
    of the training environments, or of each `eval.env` (then also logged per environment as
    eval/<name>/reward_mean); eval/reward_mean pools every rollout. Several ranks share the
    examples; in server mode rank 0 evaluates them all (its client serves the newest weights)."""
    config, dist = ctx.config, ctx.dist
    if ctx.inference.server_mode and dist.active:
        return await on_main(dist, lambda: held_out_eval(dataclasses.replace(ctx, dist=SINGLE), policy), {})
    policy.model.eval()
    targets: list[tuple[str | None, EvalEnv | None]] = [(e.name, e) for e in ctx.eval_envs] or [(None, None)]
    metrics: dict[str, float] = {}
    total = count = 0.0
    for name, target in targets:
        env = target.env if target is not None else ctx.env
        sampling = target.sampling if target is not None else ctx.sampling
        assert env is not None  # RL runs have an env (setup.build_context)
        examples = dist.shard(env.get_examples(config.eval.num_examples, split="eval"))  # this rank's slice
        groups: list[Group] = []
        with generation_weights(policy):
            await run_rollouts(
                env,
                ctx.inference.client,
                examples,
                rollouts_per_example=config.eval.rollouts_per_example,
                sampling=held_out_sampling(config, sampling),
                max_concurrent=config.eval_concurrency(),
                on_group=groups.append,
            )
        # server failures: no result
        rewards = [r.reward for g in groups if not g.infrastructure_failures for r in g.rollouts]
        env_total, env_count = dist.sum([sum(rewards), len(rewards)])
        if name is not None:
            metrics[f"eval/{name}/reward_mean"] = env_total / env_count if env_count else 0.0
        total, count = total + env_total, count + env_count
    return {"eval/reward_mean": total / count if count else 0.0, **metrics}


def held_out_sampling(config: TrainConfig, sampling: SamplingParams) -> SamplingParams:
    """How held-out evaluation samples: the run's sampling with one seed for every evaluation, so
    each step's reward is measured on the same draws (and `eval run` with these settings, the
    same -n/-r and examples, reproduces the number for a checkpoint)."""
    return dataclasses.replace(sampling, seed=step_seed(config, EVAL_SEED_STEP))
