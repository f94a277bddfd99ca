"""RL (and SFT) training, colocated on one machine: `workbench train CONFIG.toml`.

    workbench train configs/rl/reverse-text.toml
    workbench train configs/rl/reverse-text.toml --set max_steps=20
    workbench train --resume outputs/runs/<run>
    workbench train configs/rl/reverse-text.toml --nproc 2   # data parallel (workbench.train.distributed)

This file is the run around the steps: set up (`setup.py`), resume, then per step: the step
(`rl_step.py` reads top to bottom: generate -> reward -> advantage -> loss -> step -> publish; or
`_sft_step`), held-out evaluation (`held_out.py`), metrics, run metadata, checkpoint; a failure
becomes one line saying where to resume from.

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
import signal
import time
from pathlib import Path
from types import FrameType

from workbench import startup
from workbench.errors import ServerGone, UserError
from workbench.events import NullReporter, Reporter
from workbench.inference.passing_thread import in_passing_thread
from workbench.inference.weight_sync import WeightSyncError
from workbench.store.checkpoints import (
    checkpoint_at,
    checkpoint_folders,
    checkpoint_problem,
    checkpoint_step,
    list_checkpoints,
    read_step_info,
    require_intact,
    set_aside_after,
)
from workbench.store.runs import RunStatus, now_iso
from workbench.train.checkpoint import load_trainer_state, save_checkpoint, set_rng_state
from workbench.train.context import Learner, TrainContext
from workbench.train.distributed import (
    SINGLE,
    DistInfo,
    agreed_run_dir,
    checkpoint_states,
    close,
    init_distributed,
    load_optimizer_state,
    resume_hint,
)
from workbench.train.held_out import held_out_eval
from workbench.train.metrics import MetricsLogger, NullMetricsLogger, step_line, truncate_metrics
from workbench.train.optimize import NonFiniteLoss, train_on_samples
from workbench.train.rl_step import rl_step
from workbench.train.run_timer import RunTimer
from workbench.train.schema import TrainConfig
from workbench.train.service import TrainingFailed, TrainResult
from workbench.train.setup import build_context, new_run_dir, refuse_server_mode_ranks
from workbench.train.shared_source import on_main
from workbench.train.step_metrics import sft_metrics


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
    checkpoint = _resume_point(run_dir, config, dist, reporter) if resume else None
    async with contextlib.AsyncExitStack() as servers:  # launched inference servers stop when it closes
        launched: list[str] = []
        if config.inference.mode == "server" and config.inference.launch:
            # rank 0 alone starts them (it alone rolls out: shared_source.py); the others get its config
            unchanged: tuple[TrainConfig, list[str]] = (config, [])
            config, launched = await on_main(
                dist, lambda: _launch_inference(config, run_dir, servers, reporter), unchanged
            )
        return await _train_in(config, reporter, run_dir, checkpoint, launched, dist)


def _resume_point(run_dir: Path, config: TrainConfig, dist: DistInfo, reporter: Reporter) -> Path | None:
    """The checkpoint a resumed run continues from: checkpointing.resume_step's, else the newest
    intact one (a damaged newer one is skipped, saying why). Resuming from an earlier step sets
    the later checkpoints aside (they would be written again)."""
    step = config.checkpointing.resume_step
    if step is None:
        newer: list[tuple[Path, str]] = []  # damaged ones past the newest intact one, newest first
        found = None
        for candidate in reversed(checkpoint_folders(run_dir)):
            if (why := checkpoint_problem(candidate, hashes=True)) is None:
                found = candidate
                break
            newer.append((candidate, why))
        if dist.is_main:
            for damaged, why in reversed(newer):
                reporter.message(f"skipping checkpoint {damaged.name}: {why}")
        if found is None or not newer:
            return found
        step = checkpoint_step(found)
    checkpoint = require_intact(checkpoint_at(run_dir, step))
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
    timer = RunTimer(config, dist)  # the run's estimate, and its timing for the next one's
    ctx, learner = build_context(config, run_dir, checkpoint, dist, launched_urls=launched)
    start_step = _restore(learner, checkpoint, reporter) if checkpoint is not None else 0
    if dist.is_main:  # rank 0 alone writes metrics, metadata and W&B
        truncate_metrics(run_dir, start_step)
    logger = (
        MetricsLogger(
            run_dir, config.wandb, run_dir.name, ctx.files.metadata.config, resume=checkpoint is not None
        )
        if dist.is_main
        else NullMetricsLogger()
    )
    stop = _StopFlag(reporter)
    metadata = ctx.files.metadata
    timer.begin(metadata, start_step)
    metadata.status, metadata.step = "running", start_step
    ctx.files.write_metadata(dist)
    history: list[dict[str, float]] = []
    status: RunStatus = "failed"
    step = start_step
    reporter.start(f"train {run_dir.name}", config.max_steps, start_step)
    ctx.inference.clock.version = start_step
    publisher = ctx.inference.publisher
    try:
        if publisher is not None:
            await publisher.start(start_step, reporter.message)
        if start_step == 0 and config.eval.interval > 0 and config.on_policy:
            logger.log(0, await timer.held_out(held_out_eval(ctx, learner.policy)))
        stopping = dist.any(stop.requested)
        startup.release()  # the command's start-up is over (workbench/startup.py)
        timer.steps_begin()
        while step < config.max_steps and not stopping:
            step += 1
            metrics = await (
                rl_step(ctx, learner, step) if config.on_policy else _sft_step(ctx, learner, step)
            )
            if _evaluates(config, step):
                if publisher is not None:
                    await publisher.wait()  # evaluate this step's weights
                metrics.update(await timer.held_out(held_out_eval(ctx, learner.policy)))
            logger.log(step, metrics)
            history.append({"step": step, **metrics})
            ctx.files.log.write(step_line(step, metrics, config.max_steps))
            reporter.step_done(step, metrics)
            _record_step(ctx, step, metrics)
            stopping = dist.any(stop.requested)  # agreed, so every rank stops after the same step
            if step % config.checkpointing.save_every_n_steps == 0 or step == config.max_steps or stopping:
                _checkpoint(ctx, learner, step, metrics)
        if publisher is not None:
            await publisher.wait()  # the servers end on the final weights
        status = "stopped" if step < config.max_steps else "finished"
    except WeightSyncError as exc:
        where = _resume_line(run_dir, dist, "; it launches new servers" if launched else "")
        metadata.error = f"weight update failed at step {step}: {exc}"
        raise TrainingFailed(
            f"training stopped at step {step}: no inference server took the new weights ({exc}){where}"
        ) from exc
    except ServerGone as exc:
        where = _resume_line(
            run_dir, dist, "; it launches new servers" if launched else " once a server is back"
        )
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
        await ctx.inference.close()
        stop.restore()
        reporter.finish()
        logger.close()
        if ctx.teacher is not None:
            await ctx.teacher.close()
        timer.finish(metadata, history, status)
        metadata.status, metadata.updated_at = status, now_iso()
        ctx.files.write_metadata(dist)
        ctx.files.log.write(f"{status} at step {step}")
    return TrainResult(run_dir, status, step, history, speaks=dist.is_main, world_size=dist.world_size)


def _resume_line(run_dir: Path, dist: DistInfo, servers: str) -> str:
    """How a run that lost its servers continues: the command (with as many ranks as it had) and
    the checkpoint it starts from; the step that failed was not checkpointed, so nothing of it
    is kept. Empty before the first checkpoint (a new run starts over)."""
    last = list_checkpoints(run_dir)
    if not last:
        return ""
    return f"; {resume_hint(run_dir, dist.world_size)} continues from {last[-1].name}{servers}"


def _restore(learner: Learner, checkpoint: Path, reporter: Reporter) -> int:
    """Load what the checkpoint saved of the learner (the adapter is loaded with the policy) and
    the RNG state; returns the step it was written after."""
    state = load_trainer_state(checkpoint)
    load_optimizer_state(learner.policy, learner.optimizer, state["optimizer"])
    learner.scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    info = read_step_info(checkpoint)
    learner.kl_beta = info.get("kl_beta", learner.kl_beta)
    reporter.message(f"resuming from {checkpoint.name}")
    return int(info["step"])


def _evaluates(config: TrainConfig, step: int) -> bool:
    """Held-out evaluation after this step: every eval.interval steps and after the last (RL only)."""
    interval = config.eval.interval
    return interval > 0 and config.on_policy and (step % interval == 0 or step == config.max_steps)


def _record_step(ctx: TrainContext, step: int, metrics: dict[str, float]) -> None:
    """The run's metadata after a step (what `workbench runs` and the TUI list)."""
    metadata = ctx.files.metadata
    metadata.step, metadata.updated_at, metadata.reward_mean = step, now_iso(), metrics.get("reward/mean")
    metadata.eval_reward_mean = metrics.get("eval/reward_mean", metadata.eval_reward_mean)
    ctx.files.write_metadata(ctx.dist)


async def _sft_step(ctx: TrainContext, learner: Learner, step: int) -> dict[str, float]:
    """Supervised fine-tuning: the step's demonstrations (this rank's slice), one optimizer step."""
    started = time.perf_counter()
    learning_rate = learner.learning_rate  # this step's (the scheduler moves on when it trains)
    assert ctx.sft_data is not None  # mode = "sft" (setup.build_context)
    samples = ctx.dist.shard(ctx.sft_data.batch(step, ctx.config.batch_size))  # this rank's slice
    stats = in_passing_thread(  # no thread team left here for held-out evals to decode beside
        lambda: train_on_samples(
            learner.policy, learner.optimizer, learner.scheduler, samples, ctx.config, sft=True, dist=ctx.dist
        ),
        device=ctx.dist.device,
    )
    return sft_metrics(stats, learning_rate, time.perf_counter() - started)


def _checkpoint(ctx: TrainContext, learner: Learner, step: int, metrics: dict[str, float]) -> None:
    states = checkpoint_states(learner.policy, learner.optimizer)  # FSDP: gathered from every rank
    if not ctx.dist.is_main:
        return
    config = ctx.config
    try:
        # In a passing thread: a full model's copies would leave a thread team here that slows
        # the colocated client's decode thread (`passing_thread`).
        path = in_passing_thread(
            lambda: save_checkpoint(
                ctx.files.run_dir,
                step,
                learner.policy,
                learner.optimizer,
                learner.scheduler,
                {
                    "reward_mean": metrics.get("reward/mean"),
                    "eval_reward_mean": metrics.get("eval/reward_mean"),
                    "kl_beta": learner.kl_beta,
                },
                keep=config.checkpointing.keep_n_checkpoints,
                states=states,
                keep_every=config.checkpointing.keep_every_n_steps,
            ),
            device=ctx.dist.device,
        )
    except OSError as exc:
        last = list_checkpoints(ctx.files.run_dir)
        kept = f"; previous checkpoint intact: {last[-1]}" if last else ""
        raise TrainingFailed(
            f"could not write the step {step} checkpoint ({exc.strerror or exc}){kept}"
        ) from exc
    ctx.files.log.write(f"checkpoint {path.name}")


class _StopFlag:
    """First Ctrl-C: finish the current step, checkpoint, exit cleanly. Second: stop at once."""

    def __init__(self, reporter: Reporter) -> None:
        self.requested = False
        self._reporter = reporter
        self._previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self._reporter.message(
            "stopping after this step (a checkpoint will be written); Ctrl-C again to abort"
        )

    def restore(self) -> None:
        signal.signal(signal.SIGINT, self._previous)
