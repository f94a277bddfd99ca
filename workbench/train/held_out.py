"""Held-out evaluation during RL: `[eval] interval = N` measures the policy every N steps (and
before the first) on examples it never trains on, logged as eval/reward_mean, and as prime-rl
logs its evals, eval/avg@k and eval/pass@k (k = eval.rollouts_per_example; see
workbench.engine.summary: a rollout is correct when its reward reaches the environment's
pass_threshold), each also per `[[eval.env]]` as eval/<env>/....

Simplification: one seed for every evaluation (`held_out_sampling`), so the curve moves with the
policy, not with the draws.
"""

from __future__ import annotations

import dataclasses

from workbench.engine import run_rollouts
from workbench.engine.summary import at_k_totals
from workbench.train.context import EvalEnv, TrainContext
from workbench.train.distributed import SINGLE, generation_weights
from workbench.train.policy import Policy
from workbench.train.schema import TrainConfig
from workbench.train.setup import step_seed
from workbench.train.shared_source import on_main
from workbench.types import Group, SamplingParams

EVAL_SEED_STEP = 10_000_019  # beyond any run's steps: evaluation never samples with a training step's seed


async def held_out_eval(ctx: TrainContext, policy: Policy) -> dict[str, float]:
    """Mean reward, avg@k and pass@k on the first `eval.num_examples` examples of the eval split
    (never trained on) of the training environments, or of each `eval.env` (then also logged per
    environment as eval/<name>/...); eval/reward_mean, eval/avg@k and eval/pass@k pool every
    environment's rollouts. Several ranks share the examples; in server mode rank 0 evaluates
    them all (its client serves the newest weights)."""
    config, dist = ctx.config, ctx.dist
    if ctx.inference.server_mode and dist.active:
        return await on_main(dist, lambda: held_out_eval(dataclasses.replace(ctx, dist=SINGLE), policy), {})
    policy.model.eval()
    targets: list[tuple[str | None, EvalEnv | None]] = [(e.name, e) for e in ctx.eval_envs] or [(None, None)]
    k = config.eval.rollouts_per_example
    metrics: dict[str, float] = {}
    pooled = [0.0] * 6
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
                rollouts_per_example=k,
                sampling=held_out_sampling(config, sampling),
                max_concurrent=config.eval_concurrency(),
                on_group=groups.append,
            )
        results = [g for g in groups if not g.infrastructure_failures]  # server failures: no result
        rewards = [r.reward for g in results for r in g.rollouts]
        totals = dist.sum([sum(rewards), len(rewards), *at_k_totals(results, k, env.pass_threshold)])
        if name is not None:
            metrics.update(eval_metrics(f"eval/{name}/", totals, k))
        pooled = [a + b for a, b in zip(pooled, totals, strict=True)]
    return {**eval_metrics("eval/", pooled, k), **metrics}


def eval_metrics(prefix: str, totals: list[float], k: int) -> dict[str, float]:
    """reward_mean, avg@k and pass@k from [reward sum, rollouts, *engine.summary.at_k_totals]
    (summed over ranks and environments); 0 where nothing was scored."""
    reward_sum, rollouts, group_means, groups, passes, full_groups = totals
    return {
        f"{prefix}reward_mean": reward_sum / rollouts if rollouts else 0.0,
        f"{prefix}avg@{k}": group_means / groups if groups else 0.0,
        f"{prefix}pass@{k}": passes / full_groups if full_groups else 0.0,
    }


def held_out_sampling(config: TrainConfig, sampling: SamplingParams) -> SamplingParams:
    """How held-out evaluation samples: the run's sampling with one seed for every evaluation, so
    each step's reward is measured on the same draws (and `eval run` with these settings, the
    same -n/-r and examples, reproduces the number for a checkpoint)."""
    return dataclasses.replace(sampling, seed=step_seed(config, EVAL_SEED_STEP))
