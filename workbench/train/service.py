"""`run_train`: the front door of training, for the CLI, the TUI's child processes and code.

    run_train(config, reporter)                                   # one process (colocated or server mode)
    run_train(config, reporter, nproc=2, rank_args=[...])         # N ranks of `workbench train` on this machine
    run_train(config, reporter) under torchrun / a --nproc child  # this process is one rank

A typed `TrainConfig` goes in, progress goes out through the `Reporter`, and a `TrainResult`
comes back. Everything about processes lives here: starting ranks (`launch.py`), naming the
rank that died, and how a rank whose peer died ends (quietly, with `PEER_LOST_EXIT`, so the
launcher can tell the culprit from the bystanders).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import QuietExit, UserError
from workbench.events import NullReporter, Reporter
from workbench.store.checkpoints import list_checkpoints
from workbench.store.lock import releasing_claims
from workbench.store.runs import RUN_LOG, RunLog, TrainRun, read_metrics, read_saved
from workbench.train.config import load_env_files
from workbench.train.distributed import PEER_LOST_EXIT, is_peer_failure, launched_rank, launched_world_size
from workbench.train.schema import TrainConfig


class TrainingFailed(UserError):
    """A run that had to stop (NaN loss, disk full, a dead rank): one line for the user, exit code 1."""


@dataclass
class TrainResult:
    run_dir: Path
    status: str  # finished | stopped | failed
    last_step: int
    metrics: list[dict[str, Any]] = field(default_factory=list)
    # Whether this process tells the user how the run went: rank 0 does; the other ranks and
    # the --nproc launcher (whose rank 0 child already did) stay quiet.
    speaks: bool = True
    world_size: int = 1  # trainer processes (resuming takes as many: --nproc N)


@dataclass
class Outcome:
    """What a finished run means to its user: held-out reward before/after and the checkpoint."""

    held_out: list[tuple[int, float]]  # (step, eval/reward_mean) in step order
    final_checkpoint: Path | None


def is_rank_zero() -> bool:
    """This process talks to the user (one process, or rank 0 of several)."""
    return launched_rank() == 0


def run_train(
    config: TrainConfig,
    reporter: Reporter | None = None,
    *,
    resume: Path | None = None,
    config_path: Path | None = None,
    nproc: int = 1,
    rank_args: Sequence[str] = (),
) -> TrainResult:
    """Train by `config`; `resume` is a run folder to continue from its newest checkpoint.

    `config_path` is where relative env_file names are found. With `nproc` > 1 this process
    starts `nproc` ranks of `workbench train *rank_args` and waits for them; a rank that dies
    is a TrainingFailed naming it and the command that resumes the run."""
    reporter = reporter or NullReporter()
    if config.checkpointing.resume_step is not None and resume is None:
        raise UserError("checkpointing.resume_step continues a run: name it with --resume RUN")
    if nproc > 1:
        if launched_world_size() > 1:
            raise UserError("--nproc starts the processes itself: leave it out under torchrun")
        return _launch_ranks(config, reporter, resume, nproc, rank_args)
    load_env_files(config, config_path)
    _place_single_trainer(config)
    from workbench.train.loop import run_rank

    try:
        with releasing_claims():  # rank 0 claims the run folder (train.setup); freed when it ends
            return run_rank(config, reporter, resume=resume)
    except Exception as exc:
        if launched_world_size() > 1 and is_peer_failure(exc):
            raise QuietExit(PEER_LOST_EXIT) from exc  # the launcher names the rank that died
        raise


def _place_single_trainer(config: TrainConfig) -> None:
    """One trainer process on a GPU box: run it on trainer_gpu_ids[0] (CUDA reads the variable
    when it first initializes, which the model load does later). torchrun's ranks are placed
    by whoever started them, --nproc's by the launcher."""
    from workbench.train.placement import trainer_visible_devices
    from workbench.train.plan import cuda_gpu_count

    if config.trainer_gpu_ids and launched_world_size() <= 1 and cuda_gpu_count():
        os.environ["CUDA_VISIBLE_DEVICES"] = trainer_visible_devices(config) or ""


def _launch_ranks(
    config: TrainConfig, reporter: Reporter, resume: Path | None, nproc: int, rank_args: Sequence[str]
) -> TrainResult:
    from workbench.train.launch import launch
    from workbench.train.placement import trainer_visible_devices
    from workbench.train.plan import cuda_gpu_count
    from workbench.train.setup import new_run_dir

    gpus = cuda_gpu_count()
    if gpus and nproc > gpus:
        raise UserError(f"--nproc {nproc}: this machine has {gpus} GPU(s) and each process needs its own")
    if gpus and config.trainer_gpu_ids and nproc > len(config.trainer_gpu_ids):
        raise UserError(
            f"--nproc {nproc}: trainer_gpu_ids lists {len(config.trainer_gpu_ids)} GPU(s) and each process needs its own"
        )
    run_dir = resume or new_run_dir(config)
    code, failure = launch(list(rank_args), nproc, run_dir, trainer_visible_devices(config) if gpus else None)
    if failure is not None:
        if failure.rank == 0 and failure.code == 1:
            raise QuietExit(1)  # rank 0 printed its own one-line error
        if failure.output and failure.code > 0:
            for line in failure.output.splitlines():
                reporter.message(f"[rank {failure.rank}] {line}")
        elif failure.output and run_dir.is_dir():
            # killed by a signal: its last words (a C++ abort, a fatal error's stack) go to run.log,
            # not the terminal
            log = RunLog(run_dir / RUN_LOG)
            for line in failure.output.splitlines():
                log.write(f"[rank {failure.rank}] {line}")
            reporter.message(f"rank {failure.rank}'s last output is in {run_dir / RUN_LOG}")
        if (run_dir / "config.toml").is_file():
            raise TrainingFailed(
                f"trainer rank {failure.rank} died (exit code {failure.code}); "
                f"the run can be resumed with --resume {run_dir} --nproc {nproc}"
            )
        raise TrainingFailed(
            f"trainer rank {failure.rank} died (exit code {failure.code}) before the run started"
        )
    saved = read_saved(run_dir, "train")
    step = saved.step if isinstance(saved, TrainRun) and saved.step is not None else 0
    return TrainResult(run_dir, "stopped" if code == 130 else "finished", step, speaks=False)


def outcome(run_dir: Path) -> Outcome:
    """Held-out rewards from metrics.jsonl and the newest complete checkpoint."""
    held_out = [
        (int(m["step"]), float(m["eval/reward_mean"]))
        for m in read_metrics(run_dir)
        if "eval/reward_mean" in m
    ]
    checkpoints = list_checkpoints(run_dir)
    return Outcome(held_out, checkpoints[-1] if checkpoints else None)
