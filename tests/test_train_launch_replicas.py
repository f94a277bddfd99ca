"""`[inference] launch = true` without vLLM: the run starts `workbench serve` replicas, trains on
them and leaves no process behind — after a normal end and after kill -9 of the trainer — and
`--dry-run` says which process runs where. Real processes, real HTTP on 127.0.0.1, the tiny model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import cli
from workbench.train.placement import launch_blockers, replica_count
from workbench.train.schema import InferenceConfig, TrainConfig

REPO = Path(__file__).resolve().parents[1]
SERVER_CONFIG = REPO / "configs" / "rl" / "reverse-text-server.toml"
# Small enough for a loaded 2-core machine; the file's two base_urls make two replicas.
SMALL = [
    "--set",
    "inference.launch=true",
    "--set",
    "batch_size=8",
    "--set",
    "rollouts_per_example=4",
    "--set",
    "micro_batch_size=8",
    "--set",
    "eval.interval=0",
    "--set",
    "sampling.max_tokens=32",
    "--set",
    "wandb.mode=disabled",
]
PROCESS_DEATH_S = 30.0  # the watchdog polls every 0.5 s; a loaded machine is slow to schedule
RUN_START_S = 300.0  # trainer + two replicas each import torch and load the model


def workbench_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "OPENAI_API_KEY")}
    env["HF_HUB_OFFLINE"] = "1"
    env["COLUMNS"] = "200"
    return env


def train_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "workbench", "train", str(SERVER_CONFIG), *SMALL, *args]


def alive(pid: int) -> bool:
    """A live `workbench serve` replica with this pid (a zombie or a reused pid is not one)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return state != "Z" and b"serve" in cmdline and b"--parent-pid" in cmdline


def wait_until_gone(pids: list[int], timeout_s: float = PROCESS_DEATH_S) -> list[int]:
    """Poll until none of `pids` is alive (bounded); returns those still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def replica_record(run_dir: Path) -> dict:
    return json.loads((run_dir / "inference" / "replicas.json").read_text())


# --- placement rules and the dry run (fast) ---------------------------------------------------


def test_replica_count_follows_prime_rl_vocabulary() -> None:
    urls = ["http://127.0.0.1:8001/v1", "http://127.0.0.1:8002/v1"]
    assert replica_count(InferenceConfig(mode="server", launch=True)) == 1
    assert (
        replica_count(InferenceConfig(mode="server", launch=True, base_urls=urls)) == 2
    )  # the servers it stands in for
    assert (
        replica_count(InferenceConfig(mode="server", launch=True, gpu_ids=[0, 1, 2])) == 3
    )  # inference_gpu_ids
    assert (
        replica_count(
            InferenceConfig(mode="server", launch=True, gpu_ids=[0, 1, 2, 3], tensor_parallel_size=2)
        )
        == 2
    )
    assert (
        replica_count(InferenceConfig(mode="server", launch=True, base_urls=urls, data_parallel_size=1)) == 1
    )  # set: wins
    assert replica_count(InferenceConfig(mode="server", launch=True, data_parallel_size=3)) == 3


def test_a_model_split_across_gpus_needs_vllm_the_rest_runs_as_processes() -> None:
    split = TrainConfig(
        env=[{"id": "reverse-text"}], inference={"mode": "server", "launch": True, "tensor_parallel_size": 2}
    )
    [problem] = launch_blockers(split, "vLLM is not installed")
    assert (
        problem.startswith("inference.launch needs vLLM on a machine with a GPU")
        and "tensor_parallel_size = 2" in problem
    )
    assert launch_blockers(split, None) == []  # vLLM runs here
    plain = TrainConfig(
        env=[{"id": "reverse-text"}], inference={"mode": "server", "launch": True, "gpu_ids": [0, 1]}
    )
    assert launch_blockers(plain, "vLLM is not installed") == []


def test_a_replicas_dtype_is_inference_dtype_and_float16_is_for_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """`workbench serve` replicas take inference.dtype (bfloat16 decodes the real model ~1.6x
    faster on a CPU with AMX; float32 on a CPU without native bfloat16); float16 is vLLM's alone,
    refused before anything starts."""
    from workbench.train.placement import replica_command

    def config(dtype: str) -> TrainConfig:
        return TrainConfig(
            env=[{"id": "reverse-text"}], inference={"mode": "server", "launch": True, "dtype": dtype}
        )

    for gpus in (0, 1, None):
        assert "--dtype" not in replica_command(config("auto"), gpu_count=gpus)
        assert replica_command(config("float32"), gpu_count=gpus)[-2:] == ["--dtype", "float32"]
    monkeypatch.setattr("workbench.inference.cpu_features.cpu_has_bf16", lambda: True)
    assert replica_command(config("bfloat16"), gpu_count=0)[-2:] == ["--dtype", "bfloat16"]
    # a CPU that only emulates bfloat16 decodes slower in it: float32, as the trainer's dtypes
    monkeypatch.setattr("workbench.inference.cpu_features.cpu_has_bf16", lambda: False)
    assert replica_command(config("bfloat16"), gpu_count=0)[-2:] == ["--dtype", "float32"]
    assert replica_command(config("bfloat16"), gpu_count=1)[-2:] == ["--dtype", "bfloat16"]  # on the GPU
    assert launch_blockers(config("bfloat16"), "vLLM is not installed") == []
    [problem] = launch_blockers(config("float16"), "vLLM is not installed")
    assert "inference.dtype = 'float16' is for a launched vLLM" in problem
    assert launch_blockers(config("float16"), None) == []  # vLLM runs here: its own --dtype float16


def test_dry_run_prints_which_process_runs_where(workspace: Path) -> None:
    result = cli.run(
        [
            sys.executable,
            "-m",
            "workbench",
            "train",
            str(SERVER_CONFIG),
            "--set",
            "inference.launch=true",
            "--dry-run",
        ],
        cwd=workspace,
        env=workbench_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "Placement (which process runs where)" in out
    assert "rank 0 = this `workbench train` process, on the CPU" in out
    assert "2 `workbench serve` replica(s), each its own process group on the CPU" in out
    assert "<run>/inference/replica_0.log" in out and "<run>/inference/replica_1.log" in out
    assert "-m workbench serve tiny --host 127.0.0.1 --port 0 --served-model-name tiny --enable-lora" in out


def test_fsdp_ranks_in_server_mode_are_refused_before_any_replica_starts(tiny_workspace: Path) -> None:
    result = subprocess.run(  # trainer ranks: real processes
        [
            *train_command(
                "--set", "max_steps=1", "--set", "output_dir='runs/ranks'", "--set", "data_parallel='fsdp'"
            ),
            "--nproc",
            "2",
        ],
        cwd=tiny_workspace,
        env=workbench_env(),
        capture_output=True,
        text=True,
        timeout=RUN_START_S,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert "server mode with several trainer processes needs data_parallel = 'ddp'" in lines[0]
    assert not (tiny_workspace / "runs" / "ranks" / "inference").exists()  # nothing was launched for it


def test_plan_places_ranks_and_replicas_on_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.train import plan as plan_module

    config = TrainConfig(
        env=[{"id": "reverse-text"}],
        trainer_gpu_ids=[2],
        inference={"mode": "server", "launch": True, "gpu_ids": [0, 1]},
    )

    def rows(vllm: bool) -> dict[str, str]:
        monkeypatch.setattr(plan_module, "vllm_installed", lambda: vllm)
        built = plan_module.build_plan(config, [], [], gpu_count=4)
        return dict(next(s for s in built.sections if s.title.startswith("Placement")).rows)

    with_vllm = rows(True)
    assert with_vllm["trainer"].startswith(
        "trainer_gpu_ids [2]: rank r on the r-th of them (CUDA_VISIBLE_DEVICES=2"
    )
    assert with_vllm["inference"].startswith(
        "1 `vllm serve` process group on GPUs [0, 1]: 2 replica(s) x tp 1"
    )
    without = rows(False)  # a GPU box without vLLM: the same two replicas, as processes
    assert without["inference"].startswith("2 `workbench serve` replica(s)")
    assert "stands in for GPU 1" in without["replica 1"]


def test_a_replica_that_dies_at_start_stops_the_launch_and_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import contextlib

    from workbench.events import NullReporter
    from workbench.inference.vllm_launch import ServerStartError
    from workbench.train import launch_servers

    # One replica fails as a bad model would (the first to create the marker file); the other
    # would load for ever without announcing a URL. The launch must fail at once and stop both.
    script = (
        "import os, sys, time; print('loading', flush=True)\n"
        "try: open(sys.argv[1], 'x')\nexcept FileExistsError: time.sleep(600)\nsys.exit(3)"
    )
    monkeypatch.setattr(
        launch_servers,
        "replica_command",
        lambda *a, **k: [sys.executable, "-c", script, str(tmp_path / "first")],
    )
    config = TrainConfig(
        model=str(tmp_path),
        env=[{"id": "reverse-text"}],
        inference={"mode": "server", "launch": True, "data_parallel_size": 2},
    )
    monkeypatch.setattr("workbench.inference.resolve.resolve_model_path", lambda name: name)

    async def launch() -> None:
        async with contextlib.AsyncExitStack() as stack:
            await launch_servers.launch_inference(config, tmp_path / "run", stack, NullReporter())

    with pytest.raises(
        ServerStartError, match=r"^inference replica [01] exited with code 3 before it was ready"
    ):
        asyncio.run(launch())
    record = replica_record(tmp_path / "run")
    assert [r["base_url"] for r in record["replicas"]] == [None, None]
    assert all(not _running(r["pid"]) for r in record["replicas"])  # replica 1 was stopped with the launch


# --- the watchdog that outlives kill -9 (fast: no model) ---------------------------------------

WATCHED_CHILD = """
import sys, time
from workbench.inference.parent_watch import watch_parent
watch_parent(int(sys.argv[1]), poll_s=0.05)
print("watching", flush=True)
time.sleep(600)
"""

PARENT = """
import subprocess, sys, os
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())], stdout=subprocess.PIPE,
                         start_new_session=True)
assert child.stdout.readline() == b"watching\\n"
print(child.pid, flush=True)
sys.stdin.read()  # until killed
"""


def test_a_watched_child_exits_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, WATCHED_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        child_pid = int(parent.stdout.readline())  # the child is watching: the event we wait for
        assert Path(f"/proc/{child_pid}").exists()
        parent.kill()
        parent.wait(30)
        deadline = time.monotonic() + PROCESS_DEATH_S
        while _running(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(child_pid)
    finally:
        parent.kill()


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# --- real runs (slow) ---------------------------------------------------------------------------


@pytest.mark.slow
def test_launch_starts_replicas_trains_and_leaves_no_process_behind(tiny_workspace: Path) -> None:
    result = cli.run(
        train_command(
            "--set",
            "max_steps=2",
            "--set",
            "output_dir='runs/launched'",
            "--set",
            "inference.dtype='bfloat16'",
        ),
        cwd=tiny_workspace,
        env=workbench_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = tiny_workspace / "runs" / "launched"
    record = replica_record(run_dir)
    assert record["backend"] == "workbench serve" and len(record["replicas"]) == 2
    urls = [r["base_url"] for r in record["replicas"]]
    assert all(u.startswith("http://127.0.0.1:") and u.endswith("/v1") for u in urls) and len(set(urls)) == 2
    assert f"inference replicas ready: {', '.join(urls)}" in result.stdout + result.stderr
    for index, replica in enumerate(record["replicas"]):
        log = (run_dir / "inference" / f"replica_{index}.log").read_text()
        assert f"Serving model 'tiny' at {replica['base_url']}" in log
        assert replica["command"][-2:] == ["--parent-pid", str(record["trainer_pid"])]
        assert replica["command"][-4:-2] == ["--dtype", "bfloat16"]  # inference.dtype reaches the replica
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "time/step" in m]
    assert len(steps) == 2 and all(
        m["rollout/trained_samples"] == 8 and m["rollout/errors"] == 0 for m in steps
    )
    assert all(m["time/weight_sync"] > 0 for m in steps)  # the new adapter went to the replicas
    saved = (run_dir / "config.toml").read_text()  # --resume launches the same: two replicas, no stale URLs
    assert "base_urls = []" in saved and "data_parallel_size = 2" in saved
    assert [p for p in (r["pid"] for r in record["replicas"]) if alive(p)] == []  # stopped with the run


def start_and_wait_for_first_step(
    workspace: Path, name: str
) -> tuple[subprocess.Popen[bytes], Path, list[int]]:
    """A long run started in the background; returns once its first step's metrics line is
    written (so its replicas are up and serving), with the replicas' pids."""
    run_dir = workspace / "runs" / name
    output = (workspace / f"{name}.out").open("wb")  # a file, not a pipe: a full pipe would stall the trainer
    trainer = subprocess.Popen(
        train_command("--set", "max_steps=1000", "--set", f"output_dir='runs/{name}'"),
        cwd=workspace,
        env=workbench_env(),
        stdout=output,
        stderr=subprocess.STDOUT,
    )
    output.close()
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + RUN_START_S
    while not (metrics.is_file() and metrics.read_text().strip()):
        if trainer.poll() is not None or time.monotonic() > deadline:
            trainer.kill()
            raise AssertionError(
                f"no training step (exit {trainer.wait()}):\n{(workspace / f'{name}.out').read_text()}"
            )
        time.sleep(0.2)
    pids = [r["pid"] for r in replica_record(run_dir)["replicas"]]
    if not (len(pids) == 2 and all(alive(p) for p in pids)):
        trainer.kill()  # a 1,000-step run (and its replicas, which watch it) must not outlive a failed test
        trainer.wait()
        raise AssertionError(f"replicas {pids} are not both live `workbench serve` processes")
    return trainer, run_dir, pids


@pytest.mark.slow
def test_kill_9_of_the_trainer_takes_its_replicas_along(tiny_workspace: Path) -> None:
    trainer, _, pids = start_and_wait_for_first_step(tiny_workspace, "killed")
    try:
        trainer.send_signal(
            signal.SIGKILL
        )  # nothing runs in the trainer any more: the replicas' watchdog acts
        assert trainer.wait(30) == -signal.SIGKILL
        assert wait_until_gone(pids) == []
    finally:
        trainer.kill()
        trainer.wait()


@pytest.mark.slow
def test_ctrl_c_stops_the_run_and_its_replicas(tiny_workspace: Path) -> None:
    trainer, run_dir, pids = start_and_wait_for_first_step(tiny_workspace, "interrupted")
    try:
        trainer.send_signal(signal.SIGINT)  # finish the step, checkpoint, stop the replicas, exit
        code = trainer.wait(300)
    finally:
        trainer.kill()
        trainer.wait()
    assert code == 130, (tiny_workspace / "interrupted.out").read_text()
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "stopped"
    assert [p for p in pids if alive(p)] == []  # stopped by the trainer itself, before it exited


def test_the_trainer_takes_the_cores_the_replicas_leave_plus_one_thread() -> None:
    """One extra thread fills the gaps both sides leave (2 cores, 1 replica: the trainer at 2
    threads ran async SmolLM2 steps in 21.5 s, at 1 thread 27-28 s); none when the replicas
    already take every core (a 2-thread trainer beside 2 replicas on 2 cores was ~15x slower)."""
    from workbench.train.launch_servers import trainer_threads

    assert [trainer_threads(1, cores) for cores in (1, 2, 4, 16)] == [1, 2, 3, 9]
    assert [trainer_threads(2, cores) for cores in (2, 4)] == [1, 3]
