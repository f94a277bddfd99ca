"""Several trainer ranks with inference replicas (issue 34.2): what the run records about its
ranks, the same update from 2 ranks as from 1, resume after kill -9 of a rank, a replica dying
mid-step. Real processes (gloo ranks, `workbench serve` replicas), real HTTP on 127.0.0.1, the
tiny model."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.marks import by_default
from tests.test_train_launch_replicas import (
    PROCESS_DEATH_S,
    RUN_START_S,
    replica_record,
    train_command,
    workbench_env,
)
from workbench.store.checkpoints import checkpoint_problem, checkpoint_step, list_checkpoints
from workbench.store.runs import (
    RankProcess,
    TrainRun,
    effective_status,
    read_metrics,
    read_run_metadata,
    write_run_metadata,
)


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_running_training_run_missing_any_of_its_ranks_on_this_machine_has_died(tmp_path: Path) -> None:
    here, me, gone = socket.gethostname(), os.getpid(), _dead_pid()
    ranks = [RankProcess(rank=0, pid=me, host=here), RankProcess(rank=1, pid=gone, host=here)]
    run = TrainRun(run_id="r", status="running", pid=me, world_size=2, ranks=ranks)
    write_run_metadata(tmp_path, run)
    saved = read_run_metadata(tmp_path, "train")
    assert isinstance(saved, TrainRun) and saved.world_size == 2 and saved.ranks == ranks
    assert effective_status(saved) == "died"  # rank 1 is gone: the run cannot go on without it
    elsewhere = [ranks[0], RankProcess(rank=1, pid=gone, host=f"not-{here}")]
    assert effective_status(run.model_copy(update={"ranks": elsewhere})) == "running"  # not ours to check
    assert effective_status(run.model_copy(update={"ranks": ranks[:1]})) == "running"
    assert effective_status(run.model_copy(update={"status": "finished"})) == "finished"


# --- real runs (slow): 2 gloo ranks and `workbench serve` replicas -----------------------------


def _run(workspace: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*args], cwd=workspace, env=workbench_env(), capture_output=True, text=True, timeout=timeout
    )


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    return [m for m in read_metrics(run_dir) if "time/step" in m]


def _training_process(pid: int) -> bool:
    """A live (not zombie) `workbench` process with this pid: a trainer rank or a replica."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return state != "Z" and b"workbench" in cmdline


def _wait_gone(pids: list[int]) -> list[int]:
    """Until none of `pids` runs (bounded by PROCESS_DEATH_S); those still running."""
    deadline = time.monotonic() + PROCESS_DEATH_S
    while (left := [p for p in pids if _training_process(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _start(workspace: Path, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """A 1000-step run of 2 ranks in the background, its output in a file (a full pipe would
    stall rank 0)."""
    out = workspace / f"{name}.out"
    with out.open("wb") as sink:
        launcher = subprocess.Popen(
            [
                *train_command("--set", "max_steps=1000", "--set", f"output_dir='runs/{name}'", *args),
                "--nproc",
                "2",
            ],
            cwd=workspace,
            env=workbench_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    return launcher, workspace / "runs" / name, out


def _wait_for(launcher: subprocess.Popen[bytes], out: Path, what: str, ready: Callable[[], bool]) -> None:
    """Poll `ready` (a file's content: an event the run writes) until true; fail at once if the
    run ended, or after RUN_START_S."""
    deadline = time.monotonic() + RUN_START_S
    while not ready():
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            raise AssertionError(f"no {what} (exit {launcher.wait()}):\n{out.read_text()}")
        time.sleep(0.2)


def _processes(run_dir: Path) -> tuple[list[int], list[int]]:
    """(the trainer ranks' pids from metadata.json, the replicas' pids from replicas.json)."""
    metadata = json.loads((run_dir / "metadata.json").read_text())
    return [r["pid"] for r in metadata["ranks"]], [r["pid"] for r in replica_record(run_dir)["replicas"]]


def _resume_to(workspace: Path, run_dir: Path, max_steps: int) -> subprocess.CompletedProcess[str]:
    return _run(
        workspace,
        sys.executable, "-m", "workbench", "train", "--resume", str(run_dir),
        "--set", f"max_steps={max_steps}", "--nproc", "2",
    )  # fmt: skip


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.slow
def test_two_ranks_and_one_replica_make_the_update_of_one_rank_and_one_replica(tiny_workspace: Path) -> None:
    """Strictly on-policy (max_async_level = 0), so step 1's rollouts come from the base model
    whatever the timing; the replica samples each request with its seed, so both runs train on
    the same batch, and DDP's averaged gradient of the two halves is the one-process gradient."""
    runs = {}
    for nproc in (1, 2):
        runs[nproc] = tiny_workspace / "runs" / f"ranks-{nproc}"
        done = _run(
            tiny_workspace,
            *train_command(
                "--set", "max_steps=1", "--set", "max_async_level=0",
                "--set", "inference.data_parallel_size=1", "--set", f"output_dir='runs/ranks-{nproc}'",
                # answers long enough to earn some reward: a batch of zero advantages trains nothing
                "--set", "batch_size=16", "--set", "rollouts_per_example=8", "--set", "sampling.max_tokens=96",
            ),
            "--nproc", str(nproc),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr

    def rollouts(run_dir: Path) -> list[dict[str, Any]]:
        lines = (run_dir / "rollouts" / "step_1.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k != "timing"} for line in lines]

    one, two = rollouts(runs[1]), rollouts(runs[2])
    assert len(one) == 16 and one == two  # the server's rollouts are deterministic for a seed
    assert len({r["completion"][0]["content"] for r in one}) > 1  # sampled, not one answer 16 times
    [alone], [shared] = _steps(runs[1]), _steps(runs[2])
    assert shared["rollout/trained_samples"] == alone["rollout/trained_samples"] == 16  # both shares trained
    assert alone["train/grad_norm"] > 0  # rewards differ within a group: something to learn
    for key in ("train/loss", "train/grad_norm"):  # the gradient's scale (AdamW's first step hides it)
        assert shared[key] == pytest.approx(alone[key], rel=1e-5), key

    from safetensors.torch import load_file

    def adapter(run_dir: Path) -> dict[str, Any]:
        return load_file(run_dir / "checkpoints" / "step_000001" / "adapter_model.safetensors")

    a, b = adapter(runs[1]), adapter(runs[2])
    lr = alone["train/learning_rate"]
    assert a.keys() == b.keys() and any("lora_B" in name for name in a)
    # AdamW's first step moves each lora_B entry by about lr * sign(gradient): the update is
    # real (B starts at zero), and a rank that trained only on its own half would flip many signs.
    # Entries whose gradient is near AdamW's eps may differ by float noise (measured: 17 of
    # 67,584 by more than 0.1% of lr, none by 0.3%).
    for name in a:
        diff = (a[name] - b[name]).abs()
        assert diff.max().item() <= 0.01 * lr and diff.mean().item() <= 1e-4 * lr, name
        if "lora_B" in name:
            assert a[name].abs().mean().item() > 0.5 * lr, name


@pytest.mark.slow
@pytest.mark.parametrize("rank", by_default([1, 0], [1]))  # rank 0's death: extended (-m '')
def test_kill_9_of_a_rank_stops_every_process_and_resume_continues_the_run(
    tiny_workspace: Path, rank: int
) -> None:
    name = f"kill-rank-{rank}"
    launcher, run_dir, out = _start(
        tiny_workspace,
        name,
        "--set", "inference.data_parallel_size=1", "--set", "checkpointing.save_every_n_steps=1",
    )  # fmt: skip
    try:
        _wait_for(launcher, out, "checkpoint", lambda: bool(list_checkpoints(run_dir)))
        ranks, replicas = _processes(run_dir)
        assert len(ranks) == 2 and len(replicas) == 1 and all(map(_training_process, ranks + replicas))
        os.kill(ranks[rank], signal.SIGKILL)
        code = launcher.wait(RUN_START_S)
    finally:
        launcher.kill()
        launcher.wait()
    output = out.read_text()
    assert code == 1, output
    line = _one_error_line(output)
    assert f"trainer rank {rank} died (exit code -9)" in line and f"--resume runs/{name} --nproc 2" in line
    assert _wait_gone(ranks + replicas) == []  # the other rank, and the replica rank 0 launched
    assert effective_status(read_run_metadata(run_dir, "train")) in ("died", "failed")

    newest = checkpoint_step(list_checkpoints(run_dir)[-1])
    resumed = _resume_to(tiny_workspace, run_dir, newest + 1)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [m["step"] for m in _steps(run_dir)] == list(range(1, newest + 2))  # each step once
    metadata = read_run_metadata(run_dir, "train")
    assert isinstance(metadata, TrainRun) and (metadata.status, metadata.step) == ("finished", newest + 1)
    new_ranks, new_replicas = _processes(run_dir)
    assert len(new_replicas) == 1 and set(new_ranks).isdisjoint(ranks)
    assert [p for p in new_ranks + new_replicas if _training_process(p)] == []


@pytest.mark.extended  # 50 s of the suite's 8-minute budget; `python -m pytest -m ''` runs it
def test_a_replica_dying_mid_run_leaves_its_requests_to_the_other_and_the_last_one_stops_the_run(
    tiny_workspace: Path,
) -> None:
    launcher, run_dir, out = _start(
        tiny_workspace, "replica-dies", "--set", "checkpointing.save_every_n_steps=2"
    )  # two replicas: the config's two base_urls
    log = run_dir / "run.log"
    try:
        _wait_for(launcher, out, "first step", lambda: bool(_steps(run_dir)))
        ranks, replicas = _processes(run_dir)
        assert len(replicas) == 2
        os.kill(replicas[1], signal.SIGKILL)  # rank 0 is rolling out step 2 (max_async_level = 1)
        _wait_for(launcher, out, "dropped replica", lambda: "dropped from the pool" in log.read_text())
        dropped_at = len(_steps(run_dir))
        _wait_for(
            launcher,
            out,
            "steps on the last replica",
            lambda: len(_steps(run_dir)) >= dropped_at + 2 and bool(list_checkpoints(run_dir)),
        )
        os.kill(replicas[0], signal.SIGKILL)  # the last one: the run cannot go on
        code = launcher.wait(RUN_START_S)
    finally:
        launcher.kill()
        launcher.wait()
    output = out.read_text()
    assert code == 1, output
    line = _one_error_line(output)
    assert "the inference server stopped answering" in line or "no inference server took" in line, line
    assert "`workbench train --resume runs/replica-dies --nproc 2` continues from step_" in line, line
    assert line.endswith("; it launches new servers"), line
    steps = _steps(run_dir)
    # every request the dead replica missed was retried on the other: no step trained on less
    assert all(m["rollout/errors"] == 0 and m["rollout/trained_samples"] == 8 for m in steps), steps
    newest = list_checkpoints(run_dir)[-1]
    assert checkpoint_problem(newest, hashes=True) is None  # nothing half-written
    metadata = read_run_metadata(run_dir, "train")
    assert metadata.status == "failed" and metadata.error is not None
    failed_step = len(steps) + 1  # the step the last replica's death interrupted: never checkpointed
    assert f"at step {failed_step}:" in metadata.error and checkpoint_step(newest) < failed_step
    assert _wait_gone(ranks + replicas) == []

    resumed = _resume_to(tiny_workspace, run_dir, checkpoint_step(newest) + 1)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [m["step"] for m in _steps(run_dir)] == list(range(1, checkpoint_step(newest) + 2))
    new_ranks, new_replicas = _processes(run_dir)
    assert len(new_replicas) == 2  # launched again, as many as before
    assert [p for p in new_ranks + new_replicas if _training_process(p)] == []


def test_a_resume_with_another_number_of_ranks_says_so(tmp_path: Path) -> None:
    from workbench.cli.train_cmd import resume_layout_notes

    write_run_metadata(tmp_path, TrainRun(run_id="r", status="failed", world_size=2))
    [note] = resume_layout_notes(tmp_path, 1)
    assert note == (
        f"{tmp_path} trained with 2 trainer process(es) and resumes with 1 (each step still trains "
        "the whole batch); --nproc 2 keeps its layout"
    )
    assert resume_layout_notes(tmp_path, 2) == [] and resume_layout_notes(None, 1) == []
    write_run_metadata(tmp_path, TrainRun(run_id="r", status="failed"))  # one process, as before
    assert resume_layout_notes(tmp_path, 1) == []


def test_replica_counts_launched_on_a_cpu_are_not_called_ignored() -> None:
    from workbench.train.plan import machine_notes
    from workbench.train.schema import TrainConfig

    launched = TrainConfig(
        env=[{"id": "reverse-text"}],
        inference={"mode": "server", "launch": True, "data_parallel_size": 2, "gpu_ids": [0, 1]},
    )
    notes = machine_notes(launched, gpu_count=0)  # what a resumed launch's saved config says, and more
    assert not any("data_parallel_size" in note for note in notes)  # it sizes the replicas here
    assert notes == [
        "inference.gpu_ids = [0, 1]: no CUDA GPU on this machine; the launched `workbench serve` replicas "
        "stand in for them, as processes on the CPU"
    ]
    remote = launched.model_copy(
        update={"inference": launched.inference.model_copy(update={"launch": False})}
    )  # servers started elsewhere: these keys do nothing here
    assert any(n.startswith("inference.data_parallel_size = 2 is ignored") for n in machine_notes(remote, 0))


@pytest.mark.slow
@pytest.mark.parametrize("lora", by_default([True, False], [True]), ids=["lora", "full"])
def test_rank_0_publishes_each_step_s_weights_to_the_replica_the_next_step_samples_from(
    tiny_workspace: Path, lora: bool
) -> None:
    """Strictly on-policy: step 2's rollouts must come from step 1's weights, published by rank 0
    (a LoRA adapter, or the whole model); the trainer's own logprobs of those rollouts then match
    the sampler's. A replica left on older weights gives a mismatch orders of magnitude larger."""
    name = f"publish-{'lora' if lora else 'full'}"
    done = _run(
        tiny_workspace,
        *train_command(
            "--set", "max_steps=2", "--set", "max_async_level=0", "--set", "inference.data_parallel_size=1",
            "--set", f"lora.enabled={str(lora).lower()}", "--set", "learning_rate=1e-4",
            "--set", "batch_size=16", "--set", "rollouts_per_example=8", "--set", "sampling.max_tokens=96",
            "--set", f"output_dir='runs/{name}'",
        ),
        "--nproc", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    first, second = _steps(tiny_workspace / "runs" / name)
    assert first["train/grad_norm"] > 0 and second["policy/lag"] == 0 and second["time/weight_sync"] > 0
    # measured: about 1e-9 with step 1's weights; one step stale, 7e-6 (LoRA) and 5e-4 (full)
    assert abs(second["policy/mismatch_kl"]) < 1e-7, second
