"""`[inference] launch = true`: start the run's inference servers, point training at them, and
stop them with the run — on any machine.

    workbench train configs/rl/reverse-text-server.toml --set inference.launch=true

Where vLLM runs (installed, a CUDA GPU visible) this is one `vllm serve` (`train/vllm.py`, log
`<run>/vllm.log`); elsewhere N `workbench serve MODEL --enable-lora` replicas (N and the rule
for it: `placement.py`), each in its own process group with its log in
`<run>/inference/replica_<i>.log` (a resumed run sets the earlier session's aside), found by the
URL it announces and health-checked (GET /health).
`<run>/inference/replicas.json` records every server's pid (= process group id), URL and log
as soon as it starts, so anyone can check that none is left behind.

The launched servers *are* the run's servers: they replace `inference.base_urls` (which, on a
CPU, only size the launch), and the run's saved config says so (base_urls = [], the replica
count in data_parallel_size), so `--resume` launches the same again.

Stopping: the caller's exit stack stops every server (SIGTERM to its group, SIGKILL after a
grace period) on a normal end, Ctrl-C or an error. If the trainer is killed outright (kill -9)
nothing runs in it any more: each replica was started with `--parent-pid <trainer pid>` and
exits on its own once the trainer is gone (`inference/parent_watch.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from workbench.errors import UserError
from workbench.events import Reporter
from workbench.inference.vllm_launch import ManagedServer, vllm_unavailable_reason, wait_until_all_healthy
from workbench.train.placement import (
    INFERENCE_DIR,
    REPLICAS_FILE,
    SERVE_ANNOUNCE,
    launch_backend,
    launch_blockers,
    replica_command,
    replica_count,
    replica_log_name,
    vllm_data_parallel_size,
)
from workbench.train.schema import TrainConfig

REPLICA_STARTUP_TIMEOUT_S = 600.0  # a model from the hub loads on a CPU in minutes, the tiny one in seconds
REPLICA_STOP_TIMEOUT_S = 10.0  # `workbench serve` shuts down within a second of SIGTERM


@dataclass(frozen=True)
class LaunchedInference:
    """What training needs from the launch: the servers' base URLs (with /v1) and the run's
    config as it really runs (base_urls replaced by the launched servers, replica count resolved)."""

    base_urls: list[str]
    config: TrainConfig


async def launch_inference(
    config: TrainConfig, run_dir: Path, stack: contextlib.AsyncExitStack, reporter: Reporter
) -> LaunchedInference:
    """Start the inference side of `config` for the run in `run_dir` and wait until it is healthy;
    `stack` stops it when it closes. UserError (one line) when nothing can be launched here."""
    reason = vllm_unavailable_reason()
    if problems := launch_blockers(config, reason):
        raise UserError(problems[0])
    run_dir.mkdir(parents=True, exist_ok=True)
    if launch_backend(reason is None) == "vllm":
        return await _launch_vllm(config, run_dir, stack, reporter)
    return await _launch_replicas(config, run_dir, stack, reporter, why=reason or "")


async def _launch_vllm(
    config: TrainConfig, run_dir: Path, stack: contextlib.AsyncExitStack, reporter: Reporter
) -> LaunchedInference:
    from workbench.train.vllm import launch_vllm, vllm_model

    folder, checkpoint = vllm_model(config, run_dir)
    if checkpoint is not None:
        reporter.message(f"vLLM loads whole models: serving {checkpoint} merged into {folder}")
    server, plan = launch_vllm(config, run_dir)
    reporter.message(f"starting vLLM for {plan.served_model_name} (log: {run_dir / 'vllm.log'})")
    await stack.enter_async_context(server)
    server.base_url = plan.base_url
    _write_record(run_dir, "vllm", [server])
    return LaunchedInference([plan.base_url], _as_launched(config, vllm_data_parallel_size(config.inference)))


async def _launch_replicas(
    config: TrainConfig, run_dir: Path, stack: contextlib.AsyncExitStack, reporter: Reporter, *, why: str
) -> LaunchedInference:
    from workbench.inference.resolve import resolve_model_path
    from workbench.train.plan import cuda_gpu_count

    count = replica_count(config.inference)
    model = str(resolve_model_path(config.inference.model or config.model))
    # Started from this (the event loop's) thread; --parent-pid makes each exit with this process.
    command = replica_command(config, gpu_count=cuda_gpu_count(), model=model, parent_pid=os.getpid())
    folder = run_dir / INFERENCE_DIR
    _set_aside_logs(folder, count)
    servers: list[ManagedServer] = []
    stack.callback(_stop_all, servers)  # registered first: whatever started is stopped, however we leave
    for index in range(count):
        server = ManagedServer(
            command,
            folder / replica_log_name(index),
            "",
            env=replica_threads(count),
            name=f"inference replica {index}",
            startup_timeout_s=REPLICA_STARTUP_TIMEOUT_S,
            stop_timeout_s=REPLICA_STOP_TIMEOUT_S,
            announce=re.compile(SERVE_ANNOUNCE),
        )
        server.start()
        servers.append(server)
    _write_record(run_dir, "workbench serve", servers)  # pids first, so a leftover can always be found
    reporter.message(
        f"starting {count} `workbench serve` replica(s) of {config.inference.model or config.model} "
        f"on the CPU (no vLLM here: {why}; logs: {folder})"
    )
    # They load in parallel; the first to fail ends the wait (the stack then stops them all).
    await asyncio.to_thread(wait_until_all_healthy, servers)
    urls = [server.base_url for server in servers if server.base_url]
    _write_record(run_dir, "workbench serve", servers)
    reporter.message(f"inference replicas ready: {', '.join(urls)}")
    _share_cores_with(count)
    return LaunchedInference(urls, _as_launched(config, count))


def _set_aside_logs(folder: Path, count: int) -> None:
    """A resumed run's replicas start with empty logs; an earlier session's are renamed
    `replica_<i>.<time>.log` (kept: they may say why that session ended). A replica's URL is read
    from its log, and the first announcement in an appended log would be the earlier session's
    replica, long gone: the new one was then never found (a resume waited out the startup timeout)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for index in range(count):
        log = folder / replica_log_name(index)
        if log.exists():
            log.rename(log.with_name(f"{log.stem}.{stamp}{log.suffix}"))


def _share_cores_with(replicas: int) -> None:
    """The trainer's torch threads next to `replicas` busy replicas: the cores they leave, plus one
    (`trainer_threads`). A user's own OMP_NUM_THREADS wins."""
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return
    import torch

    torch.set_num_threads(trainer_threads(replicas))


def trainer_threads(replicas: int, cores: int | None = None) -> int:
    """The cores the replicas leave, plus one thread (one thread when they leave none): generation
    and training each leave a core idle part of the time (requests, sampling, the optimizer, Python), and one extra thread fills
    those gaps. Measured on 2 cores with one replica (1 thread) and async RL
    (benchmarks/server_mode.py): with a 2-thread trainer, 0.34 s a step on the tiny model and
    21.5 s on SmolLM2-135M (batch 128), against 0.70 s and 31.3 s colocated; a 1-thread trainer
    took 27-28 s a SmolLM2 step, no faster than colocated. More than one extra thread is what
    hurts: with torch's default (a thread per core) next to busy replicas, benchmarks/scale.py
    measured a 1-rank train step at 10.3 s instead of 0.7 s (spinning threads fighting for cores)."""
    cores = cores or os.cpu_count() or 1
    left = cores - replicas * _threads_per_replica(replicas, cores)
    return left + 1 if left >= 1 else 1  # no core left (2 replicas on 2 cores): one thread, no extra


def replica_threads(count: int) -> dict[str, str]:
    """Torch threads per CPU replica: the cores shared by the replicas and the trainer. Each
    process would otherwise start one thread per core, and N+1 processes of busy-waiting
    threads on the same cores slow every one of them. A user's own OMP_NUM_THREADS wins."""
    if os.environ.get("OMP_NUM_THREADS", "").strip():  # set empty, it means nothing to OpenMP
        return {}
    return {"OMP_NUM_THREADS": str(_threads_per_replica(count, os.cpu_count() or 1))}


def _threads_per_replica(count: int, cores: int) -> int:
    """An equal share of the cores for each replica and the trainer, at least one thread."""
    return max(1, cores // (count + 1))


def _stop_all(servers: list[ManagedServer]) -> None:
    for server in servers:
        server.stop()


def _as_launched(config: TrainConfig, replicas: int) -> TrainConfig:
    """The config the run trains with and saves: the launched servers replace base_urls."""
    inference = config.inference.model_copy(update={"base_urls": [], "data_parallel_size": replicas})
    return config.model_copy(update={"inference": inference})


def _write_record(run_dir: Path, backend: str, servers: list[ManagedServer]) -> Path:
    """`<run>/inference/replicas.json`: each server's pid (its process group id: start_new_session),
    URL once known, log and command; written atomically (tests and tools poll it)."""
    folder = run_dir / INFERENCE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "backend": backend,
        "trainer_pid": os.getpid(),
        "replicas": [
            {
                "index": index,
                "pid": server.process.pid if server.process else None,
                "base_url": server.base_url,
                "log": str(server.log_path),
                "command": server.command,
            }
            for index, server in enumerate(servers)
        ],
    }
    target = folder / REPLICAS_FILE
    partial = target.with_suffix(".json.tmp")
    partial.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
    partial.replace(target)
    return target
