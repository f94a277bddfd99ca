"""RL (and SFT) training, colocated on one machine: `workbench train CONFIG.toml`.

    workbench train configs/rl/reverse-text.toml
    workbench train configs/rl/reverse-text.toml --set max_steps=20
    workbench train --resume outputs/runs/<run>
    workbench train configs/rl/reverse-text.toml --nproc 2   # data parallel (workbench.train.distributed)

One RL step reads top to bottom in `_rl_step`:
  1. sample batch_size / rollouts_per_example examples (weighted across [[env]]s) and run
     rollouts_per_example rollouts of each through the shared engine with the current policy
  2. online difficulty filtering (oversample to refill the batch)
  3. advantages: reward - group mean (optionally / group std)
  4. token-level policy-gradient loss with the importance ratio against the sampler's logprobs
     (grpo / dapo / cispo), optional k3 KL to the reference, micro-batches with accumulation
  5. gradient clipping, AdamW, warmup; metrics, sampled rollouts, checkpoint

Colocated (the default): generation and training take turns on this machine (the trainer's
own model serves generation through LocalClient, no weight copies), so rollouts always come
from the current policy — lag 0, which satisfies any `max_async_level` and makes runs
reproducible (resume gives the same result as an uninterrupted run).

Server mode (`[inference] mode = "server"`): rollouts come from OpenAI-compatible servers
(vLLM, `workbench serve`) with their token ids and logprobs; the batch for step n+1 is
generated while step n trains in a thread (`rollout_source.py`, bounded by
`max_async_level`), and after each step the new weights are pushed to every server
(`publish.py`). Runs are then not bit-reproducible: which policy a rollout saw depends on timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import orjson

from workbench import startup
from workbench.engine import run_rollouts
from workbench.errors import ServerGone, UserError
from workbench.events import NullReporter, Reporter
from workbench.inference.weight_sync import WeightSyncError
from workbench.store.checkpoints import checkpoint_at, list_checkpoints, read_step_info, set_aside_after
from workbench.store.runs import TrainRun, now_iso, write_run_metadata
from workbench.train.checkpoint import load_trainer_state, save_checkpoint, set_rng_state
from workbench.train.distributed import (
    SINGLE,
    DistInfo,
    agreed_run_dir,
    checkpoint_states,
    close,
    gather_groups,
    generation_weights,
    init_distributed,
    load_optimizer_state,
)
from workbench.train.metrics import MetricsLogger, NullMetricsLogger, step_line, truncate_metrics
from workbench.train.optimize import NonFiniteLoss, adapt_kl_beta, make_optimizer, train_on_samples
from workbench.train.rollout_source import RolloutSource
from workbench.train.samples import groups_to_samples
from workbench.train.schema import TrainConfig
from workbench.train.service import TrainingFailed, TrainResult
from workbench.train.setup import TrainContext, build_context, new_run_dir, refuse_server_mode_ranks
from workbench.train.shared_source import SharedSource, on_main
from workbench.train.teacher import TeacherStats
from workbench.types import SamplingParams


def run_rank(
    config: TrainConfig, reporter: Reporter | None = None, *, resume: str | Path | None = None
) -> TrainResult:
    """This process's part of a run (the whole run with one process); blocking. `resume` is a run
    folder: continue from its newest complete checkpoint. Launched as one of several processes
    (--nproc, torchrun), it first joins their process group. The front door is `service.run_train`."""
    dist = init_distributed()
    try:
        result = asyncio.run(
            _train(config, reporter or NullReporter(), Path(resume) if resume else None, dist)
        )
        # every rank is done with the group before any tears it down: a rank that exits (closing
        # its sockets and rank 0's store) while a slower one is still inside its last collective
        # or its own teardown makes gloo abort that one (SIGABRT), failing a finished run
        dist.barrier()
        return result
    finally:
        close(dist)


async def _train(
    config: TrainConfig, reporter: Reporter, resume: Path | None, dist: DistInfo = SINGLE
) -> TrainResult:
    run_dir = resume or agreed_run_dir(dist, lambda: new_run_dir(config))
    if resume is None and list_checkpoints(run_dir):
        raise UserError(
            f"{run_dir} already holds a training run; continue it with --resume {run_dir} "
            "or choose another run_name/output_dir"
        )
    refuse_server_mode_ranks(config, dist)  # before any server is launched for nothing
    checkpoint = _resume_point(run_dir, config, dist) if resume else None
    async with contextlib.AsyncExitStack() as servers:  # launched inference servers stop when it closes
        launched: list[str] = []
        if config.inference.mode == "server" and config.inference.launch:
            # rank 0 alone starts them (it alone rolls out: shared_source.py); the others get its config
            config, launched = await on_main(
                dist, lambda: _launch_inference(config, run_dir, servers, reporter), (config, [])
            )
        return await _train_in(config, reporter, run_dir, checkpoint, launched, dist)


def _resume_point(run_dir: Path, config: TrainConfig, dist: DistInfo) -> Path | None:
    """The checkpoint a resumed run continues from: checkpointing.resume_step's, else the newest.
    Resuming from an earlier step sets the later checkpoints aside (they would be written again)."""
    step = config.checkpointing.resume_step
    if step is None:
        found = list_checkpoints(run_dir)
        return found[-1] if found else None
    checkpoint = checkpoint_at(run_dir, step)
    dist.barrier()  # every rank has found it before rank 0 moves the later ones
    if dist.is_main:
        set_aside_after(run_dir, step, time.strftime("%Y%m%d-%H%M%S"))
    return checkpoint


async def _launch_inference(
    config: TrainConfig, run_dir: Path, servers: contextlib.AsyncExitStack, reporter: Reporter
) -> tuple[TrainConfig, list[str]]:
    """`[inference] launch = true`: start the run's inference servers (vLLM, or `workbench serve`
    replicas without it: `launch_servers.py`), wait for health, stop them when `servers` closes.
    Returns the config the run goes on with (the launched servers replace inference.base_urls)
    and their base URLs."""
    from workbench.train.launch_servers import launch_inference

    launched = await launch_inference(config, run_dir, servers, reporter)
    return launched.config, launched.base_urls


async def _train_in(
    config: TrainConfig,
    reporter: Reporter,
    run_dir: Path,
    checkpoint: Path | None,
    launched: list[str],
    dist: DistInfo,
) -> TrainResult:
    ctx = build_context(config, run_dir, checkpoint, dist, launched_urls=launched)
    optimizer, scheduler = make_optimizer(ctx.policy, config)
    start_step = 0
    if checkpoint is not None:
        state = load_trainer_state(checkpoint)
        load_optimizer_state(ctx.policy, optimizer, state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        info = read_step_info(checkpoint)
        start_step = info["step"]
        ctx.kl_beta = info.get("kl_beta", ctx.kl_beta)
        reporter.message(f"resuming from {checkpoint.name}")
    if dist.is_main:  # rank 0 alone writes metrics, metadata and W&B
        truncate_metrics(run_dir, start_step)
    logger = (
        MetricsLogger(run_dir, config.wandb, run_dir.name, ctx.saved_config, resume=checkpoint is not None)
        if dist.is_main
        else NullMetricsLogger()
    )
    stop = _StopFlag(reporter)
    metadata = ctx.metadata
    metadata.status, metadata.step = "running", start_step
    _write_metadata(ctx, metadata)
    history: list[dict[str, Any]] = []
    status, step = "failed", start_step
    reporter.start(f"train {run_dir.name}", config.max_steps, start_step)
    ctx.clock.version = start_step
    if ctx.env is not None:
        ctx.source = _rollout_source(ctx, config)
    try:
        if ctx.publisher is not None:
            await ctx.publisher.start(start_step)
        if start_step == 0 and config.eval.interval > 0 and config.on_policy:
            logger.log(0, await _held_out_eval(ctx, config))
        stopping = dist.any(stop.requested)
        startup.release()  # the command's start-up is over (workbench/startup.py)
        while step < config.max_steps and not stopping:
            step += 1
            metrics = await (
                _rl_step(ctx, config, optimizer, scheduler, step)
                if config.on_policy
                else _sft_step(ctx, config, optimizer, scheduler, step)
            )
            if (
                config.eval.interval > 0
                and config.on_policy
                and (step % config.eval.interval == 0 or step == config.max_steps)
            ):
                if ctx.publisher is not None:
                    await ctx.publisher.wait()  # evaluate this step's weights
                metrics.update(await _held_out_eval(ctx, config))
            logger.log(step, metrics)
            history.append({"step": step, **metrics})
            ctx.log.write(step_line(step, metrics, config.max_steps))
            reporter.step_done(step, metrics)
            metadata.step, metadata.updated_at, metadata.reward_mean = (
                step,
                now_iso(),
                metrics.get("reward/mean"),
            )
            metadata.eval_reward_mean = metrics.get("eval/reward_mean", metadata.eval_reward_mean)
            _write_metadata(ctx, metadata)
            stopping = dist.any(stop.requested)  # agreed, so every rank stops after the same step
            if step % config.checkpointing.save_every_n_steps == 0 or step == config.max_steps or stopping:
                _checkpoint(ctx, config, optimizer, scheduler, step, metrics)
        if ctx.publisher is not None:
            await ctx.publisher.wait()  # the servers end on the final weights
        status = "stopped" if step < config.max_steps else "finished"
    except WeightSyncError as exc:
        last = list_checkpoints(run_dir)
        where = f"; resume from the last checkpoint with --resume {run_dir}" if last else ""
        metadata.error = f"weight update failed at step {step}: {exc}"
        raise TrainingFailed(
            f"training stopped at step {step}: no inference server took the new weights ({exc}){where}"
        ) from exc
    except ServerGone as exc:
        where = f"; resume with --resume {run_dir} once a server is back" if list_checkpoints(run_dir) else ""
        metadata.error = f"inference server gone at step {step}: {exc}"
        raise TrainingFailed(
            f"training stopped at step {step}: the inference server stopped answering ({exc}){where}"
        ) from exc
    except NonFiniteLoss as exc:
        last = list_checkpoints(run_dir)
        where = f"; last good checkpoint: {last[-1]}" if last else ""
        metadata.error = f"non-finite loss at step {step}: {exc}"
        raise TrainingFailed(f"training stopped at step {step}: {exc} (NaN/inf){where}") from exc
    finally:
        if ctx.source is not None:
            await ctx.source.close()
        if ctx.publisher is not None:
            await ctx.publisher.cancel()
        stop.restore()
        reporter.finish()
        logger.close()
        await ctx.client.close()
        if ctx.teacher is not None:
            await ctx.teacher.close()
        metadata.status, metadata.updated_at = status, now_iso()
        _write_metadata(ctx, metadata)
        ctx.log.write(f"{status} at step {step}")
    return TrainResult(run_dir, status, step, history, speaks=dist.is_main, world_size=dist.world_size)


async def _rl_step(
    ctx: TrainContext, config: TrainConfig, optimizer: Any, scheduler: Any, step: int
) -> dict[str, Any]:
    started = time.perf_counter()
    learning_rate = scheduler.get_last_lr()[0]  # this step's (the scheduler moves on when it trains)
    if not ctx.server_mode:
        ctx.policy.model.eval()  # colocated: the trainer's own model generates
    with generation_weights(ctx.policy):
        batch = await ctx.source.batch_for(step)
    wait_s = time.perf_counter() - started
    all_groups = gather_groups(ctx.dist, batch.all_groups)  # every rank's (multi-process); metrics use these
    if all_groups and all(g.infrastructure_failures for g in all_groups):
        where = (
            f"; resume with --resume {ctx.run_dir} once a server is back"
            if list_checkpoints(ctx.run_dir)
            else ""
        )
        raise TrainingFailed(
            f"training stopped at step {step}: no inference server answered "
            f"(every rollout failed after retries){where}"
        )
    if ctx.dist.is_main:
        _write_rollouts(ctx.run_dir, step, all_groups)
    samples = groups_to_samples(batch.groups, config)
    distill: dict[str, float] = {}
    if ctx.teacher is not None:  # online distillation: the teacher scores every sampled token
        scored = await ctx.teacher.score(samples, ctx.sampling.temperature)
        distill = TeacherStats(
            *ctx.dist.sum([scored.reverse_kl_sum, scored.teacher_logprob_sum, scored.tokens])
        ).metrics()
    rollouts = [r for g in batch.groups for r in g.rollouts]
    trained, sample_tokens, dropped, server_failed, sampled_rollouts = ctx.dist.sum(
        [
            len(samples) if rollouts else 0,
            sum(len(s.input_ids) for s in samples),
            batch.dropped,
            batch.server_failed,
            len(rollouts),
        ]
    )
    lag = (step - 1) - batch.policy_version
    metrics: dict[str, Any] = {
        "filter/dropped_groups": int(dropped),
        "rollout/server_failed_groups": int(server_failed),
        "rollout/generation_time": batch.generation_s,
        "policy/lag": lag,
        "policy/off_policy_dropped": batch.off_policy_dropped,
        **distill,
    }
    if ctx.dist.any(bool(samples) and any(s.teaches for s in samples)):  # every rank trains, or none
        train = functools.partial(
            train_on_samples,
            ctx.policy,
            optimizer,
            scheduler,
            samples,
            config,
            temperature=ctx.sampling.temperature,
            kl_beta=ctx.kl_beta,
            dist=ctx.dist,
        )
        # Server mode trains in a thread so the event loop keeps generating the next batch.
        stats = await asyncio.to_thread(train) if ctx.server_mode else train()
        if config.kl_penalty.enabled:
            ctx.kl_beta = adapt_kl_beta(ctx.kl_beta, stats.kl, config.kl_penalty.target_kl)
            metrics["policy/kl_beta"] = ctx.kl_beta
        metrics.update(
            {
                "train/loss": stats.loss,
                "train/grad_norm": stats.grad_norm,
                "policy/entropy": stats.entropy,
                "policy/kl": stats.kl,
                "policy/importance_ratio": stats.ratio_mean,
                "policy/clip_frac": stats.clip_frac,
                "policy/mismatch_kl": stats.mismatch_kl,
                "time/forward_backward": stats.forward_backward_s,
                "time/optimizer": stats.optimizer_s,
                "train/padding_fraction": stats.padding_fraction,
            }
        )
    else:  # every group filtered out or zero advantage: nothing to learn this step
        metrics.update(
            {"train/loss": 0.0, "train/grad_norm": 0.0, "time/forward_backward": 0.0, "time/optimizer": 0.0}
        )
    if ctx.publisher is not None:  # the servers get the new weights while the next step trains
        sync_s = await ctx.publisher.publish(step)
    else:
        sync_s = 0.0
        await ctx.clock.advance(step)
    # a group the server failed is no result: left out of the reward numbers (counted above)
    all_rollouts = [r for g in all_groups if not g.infrastructure_failures for r in g.rollouts]
    rewards = [r.reward for r in all_rollouts] or [0.0]
    step_s = time.perf_counter() - started
    completion_tokens = sum(r.usage.get("completion_tokens", 0) for r in all_rollouts)
    metrics.update(
        {
            "reward/mean": sum(rewards) / len(rewards),
            "reward/std": statistics.pstdev(rewards),
            **{f"reward/{name}": value for name, value in _func_means(all_rollouts).items()},
            "train/learning_rate": learning_rate,
            "rollout/mean_length": completion_tokens / max(len(all_rollouts), 1),
            "rollout/truncated_frac": sum(r.is_truncated for r in all_rollouts) / max(len(all_rollouts), 1),
            "rollout/errors": sum(r.error is not None for r in all_rollouts),
            "rollout/trained_samples": int(trained),
            # > 1 for multi-turn rollouts under trajectory_strategy = "branching" (one sample per turn)
            "rollout/samples_per_rollout": trained / max(sampled_rollouts, 1),
            "perf/tokens_per_s": (completion_tokens + sample_tokens) / step_s,
            "time/wait_rollouts": wait_s,
            "time/step": step_s,
        }
    )
    if ctx.publisher is not None:
        metrics["time/weight_sync"] = sync_s  # what the trainer waited for: the write, a push still running
        metrics["time/weight_push"] = ctx.publisher.last_push_s  # the newest completed push, on the servers
    # Colocated, generation happens inside the wait; async, it overlaps the previous step.
    busy = (wait_s if ctx.server_mode else batch.generation_s) + sync_s
    metrics["time/other"] = max(
        0.0, step_s - busy - metrics["time/forward_backward"] - metrics["time/optimizer"]
    )
    return metrics


async def _sft_step(
    ctx: TrainContext, config: TrainConfig, optimizer: Any, scheduler: Any, step: int
) -> dict[str, Any]:
    started = time.perf_counter()
    learning_rate = scheduler.get_last_lr()[0]  # this step's (the scheduler moves on when it trains)
    samples = ctx.dist.shard(ctx.sft_data.batch(step, config.batch_size))  # this rank's slice
    stats = train_on_samples(ctx.policy, optimizer, scheduler, samples, config, sft=True, dist=ctx.dist)
    step_s = time.perf_counter() - started
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


async def _held_out_eval(ctx: TrainContext, config: TrainConfig) -> dict[str, float]:
    """Mean reward on the first `eval.num_examples` examples of the eval split (never trained on)
    of the training environments, or of each `eval.env` (then also logged per environment as
    eval/<name>/reward_mean); eval/reward_mean pools every rollout. Several ranks share the
    examples; in server mode rank 0 evaluates them all (its client serves the newest weights)."""
    if ctx.server_mode and ctx.dist.active:
        return await on_main(
            ctx.dist, lambda: _held_out_eval(dataclasses.replace(ctx, dist=SINGLE), config), {}
        )
    ctx.policy.model.eval()
    targets = [(e.name, e.env, e.sampling) for e in ctx.eval_envs] or [(None, ctx.env, ctx.sampling)]
    metrics: dict[str, float] = {}
    total = count = 0.0
    for name, env, sampling in targets:
        examples = ctx.dist.shard(
            env.get_examples(config.eval.num_examples, split="eval")
        )  # this rank's slice
        groups: list[Any] = []
        with generation_weights(ctx.policy):
            await run_rollouts(
                env,
                ctx.client,
                examples,
                rollouts_per_example=config.eval.rollouts_per_example,
                sampling=held_out_sampling(config, sampling),
                max_concurrent=config.eval_concurrency(),
                on_group=groups.append,
            )
        rewards = [
            r.reward for g in groups if not g.infrastructure_failures for r in g.rollouts
        ]  # server failures: no result
        env_total, env_count = ctx.dist.sum([sum(rewards), len(rewards)])
        if name is not None:
            metrics[f"eval/{name}/reward_mean"] = env_total / env_count if env_count else 0.0
        total, count = total + env_total, count + env_count
    return {"eval/reward_mean": total / count if count else 0.0, **metrics}


def held_out_sampling(config: TrainConfig, sampling: SamplingParams) -> SamplingParams:
    """How held-out evaluation samples: the run's sampling with one seed for every evaluation, so
    each step's reward is measured on the same draws (and `eval run` with these settings, the
    same -n/-r and examples, reproduces the number for a checkpoint)."""
    return dataclasses.replace(sampling, seed=_seed(config, 10_000_019))


def _checkpoint(
    ctx: TrainContext, config: TrainConfig, optimizer: Any, scheduler: Any, step: int, metrics: dict[str, Any]
) -> None:
    states = checkpoint_states(ctx.policy, optimizer)  # FSDP: gathered from every rank
    if not ctx.dist.is_main:
        return
    try:
        path = save_checkpoint(
            ctx.run_dir,
            step,
            ctx.policy,
            optimizer,
            scheduler,
            {
                "reward_mean": metrics.get("reward/mean"),
                "eval_reward_mean": metrics.get("eval/reward_mean"),
                "kl_beta": ctx.kl_beta,
            },
            keep=config.checkpointing.keep_n_checkpoints,
            states=states,
            keep_every=config.checkpointing.keep_every_n_steps,
        )
    except OSError as exc:
        last = list_checkpoints(ctx.run_dir)
        kept = f"; previous checkpoint intact: {last[-1]}" if last else ""
        raise TrainingFailed(
            f"could not write the step {step} checkpoint ({exc.strerror or exc}){kept}"
        ) from exc
    ctx.log.write(f"checkpoint {path.name}")


def _rollout_source(ctx: TrainContext, config: TrainConfig) -> RolloutSource | SharedSource:
    """Colocated: every rank rolls out its share on demand. Server mode: generated ahead of the
    trainer; with several ranks by rank 0 alone, which hands each rank its share."""
    if not (ctx.server_mode and ctx.dist.active):
        return RolloutSource(
            ctx.env,
            ctx.client,
            config,
            ctx.clock,
            lambda s: _sampling(ctx, config, s),
            asynchronous=ctx.server_mode,
            dist=ctx.dist,
        )
    own = (
        RolloutSource(
            ctx.env, ctx.client, config, ctx.clock, lambda s: _sampling(ctx, config, s), asynchronous=True
        )
        if ctx.dist.is_main
        else None
    )
    return SharedSource(own, ctx.dist)


def _write_metadata(ctx: TrainContext, metadata: TrainRun) -> None:
    if ctx.dist.is_main:
        write_run_metadata(ctx.run_dir, metadata)


def _sampling(ctx: TrainContext, config: TrainConfig, step: int) -> SamplingParams:
    """The run's sampling (environment < config) with a seed of its own for every step."""
    return dataclasses.replace(ctx.sampling, seed=_seed(config, step))


def _seed(config: TrainConfig, step: int) -> int:
    return config.seed * 100_003 + step


def _write_rollouts(run_dir: Path, step: int, groups: list[Any]) -> None:
    folder = run_dir / "rollouts"
    folder.mkdir(exist_ok=True)
    with (folder / f"step_{step}.jsonl").open("wb") as f:
        for group in groups:
            for rollout in group.rollouts:
                record = rollout.to_record()
                record.pop("tokens", None)  # large and only needed in memory
                f.write(orjson.dumps(record) + b"\n")


def _func_means(rollouts: list[Any]) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for r in rollouts:  # weighted reward functions, and the weight-0 ones kept as metrics
        for name, value in {**r.rewards, **r.metrics}.items():
            sums.setdefault(name, []).append(value)
    return {name: sum(v) / len(v) for name, v in sums.items()}


class _StopFlag:
    """First Ctrl-C: finish the current step, checkpoint, exit cleanly. Second: stop at once."""

    def __init__(self, reporter: Reporter) -> None:
        self.requested = False
        self._reporter = reporter
        self._previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self._reporter.message(
            "stopping after this step (a checkpoint will be written); Ctrl-C again to abort"
        )

    def restore(self) -> None:
        signal.signal(signal.SIGINT, self._previous)
