"""Multi-node training, proven on this one machine: the SLURM template of docs/distributed.md, run
as written with stand-ins for `srun` and `scontrol`, starts two torchrun "nodes" (`--nnodes 2
--nproc-per-node 1`, node ranks 0 and 1 from SLURM_NODEID, each its own process group, rendezvous
on 127.0.0.1) of `-m workbench train`. They make the same update as one process on the same global
batch and rank 0 writes the checkpoints; the same script run again (a requeued job) resumes the
run, which reaches the weights an uninterrupted single process reaches.

torchrun's other rendezvous (c10d, `--rdzv-endpoint`) is covered by a plain two-torchrun run."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import wait_until
from tests.test_train import adapter_tensors, train
from tests.test_train_ddp import SFT, child_env, metrics

REPO = Path(__file__).resolve().parents[1]
RUNBOOK = REPO / "docs" / "distributed.md"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # what the `torchrun` script runs
RUN_TIMEOUT_S = 300  # bounds a failure only (a healthy 2-node run takes ~15 s on 2 idle cores)
STOP_TIMEOUT_S = 30  # torchrun's SIGTERM handling stops its workers within this

# Stand-ins for a 2-node allocation. `srun` runs its command once per "node" with SLURM_NODEID set
# (output to node<ID>.log in the current folder); one that fails stops the others, as
# --kill-on-bad-exit does. `scontrol show hostnames` names this machine twice.
SRUN = """#!/bin/bash
while [[ $1 == --* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i "$@" > "node$i.log" 2>&1 & pids+=($!); done
for _ in "${pids[@]}"; do
  if ! wait -n; then kill -TERM "${pids[@]}" 2>/dev/null; wait; exit 1; fi
done
"""
SCONTROL = "#!/bin/bash\nprintf '127.0.0.1\\n127.0.0.1\\n'\n"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def slurm_template() -> str:
    """The runbook's SLURM script, exactly as a user copies it."""
    text = RUNBOOK.read_text()
    found = re.search(r"^## SLURM template\n.*?^```bash\n(.*?)^```", text, re.S | re.M)
    assert found, f"{RUNBOOK}: no ```bash block under '## SLURM template'"
    return found.group(1)


def fake_slurm(folder: Path) -> Path:
    """A bin/ folder with the stand-in srun and scontrol (and a torchrun that is this Python's)."""
    bin_dir = folder / "fake-slurm-bin"
    bin_dir.mkdir(exist_ok=True)
    torchrun = f'#!/bin/bash\nexec {sys.executable} -m torch.distributed.run "$@"\n'
    for name, script in (("srun", SRUN), ("scontrol", SCONTROL), ("torchrun", torchrun)):
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def run_slurm_job(folder: Path, config: Path, run: str, *script_args: str) -> list[str]:
    """The runbook's SLURM script on 2 "nodes" of 1 process each; returns each node's output."""
    script = folder / "workbench-rl.sbatch"
    script.write_text(slurm_template())
    env = {
        name: value for name, value in child_env(folder).items() if name != "WORKBENCH_WORKSPACE"
    }  # the script's cd
    env |= {
        "PATH": f"{fake_slurm(folder)}{os.pathsep}{os.environ['PATH']}",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "loopback[0-1]",
        "WORKSPACE": str(folder),
        "CONFIG": str(config),
        "RUN": run,
        "GPUS_PER_NODE": "1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }  # two nodes share this machine's cores
    job = subprocess.Popen(
        ["bash", str(script), *script_args],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    code = wait_and_stop([job])[0]
    logs = [folder / f"node{i}.log" for i in range(2)]
    outputs = [log.read_text() if log.is_file() else "(no output: srun never started it)" for log in logs]
    assert code == 0, (
        f"the SLURM job exited {code}:\n{job.stdout.read() if job.stdout else ''}\n"
        + "\n".join(f"--- node {i}\n{out[-4000:]}" for i, out in enumerate(outputs))
    )
    return outputs


def run_c10d_nodes(folder: Path, *train_args: str) -> list[str]:
    """`torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT
    -m workbench train TRAIN_ARGS` twice, each in its own session (as on separate machines)."""
    env = {**child_env(folder), "OMP_NUM_THREADS": "1"}
    rendezvous = [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--rdzv-id",
        "test",
    ]
    logs = [folder / f"c10d-node{i}.log" for i in range(2)]
    nodes = []
    for log in logs:
        with log.open("w") as out:
            nodes.append(
                subprocess.Popen(
                    [
                        *TORCHRUN,
                        "--nnodes",
                        "2",
                        "--nproc-per-node",
                        "1",
                        *rendezvous,
                        "-m",
                        "workbench",
                        "train",
                        *train_args,
                    ],
                    cwd=folder,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    codes = wait_and_stop(nodes)
    outputs = [log.read_text() for log in logs]
    for index, (code, output) in enumerate(zip(codes, outputs, strict=True)):
        assert code == 0, f"node {index} exited {code}:\n{output[-4000:]}"
    return outputs


def wait_and_stop(procs: list[subprocess.Popen]) -> list[int | None]:
    """Wait (bounded) until every process has exited, or one has failed; whatever still runs then
    is stopped. Returns the exit codes."""
    try:
        wait_until(
            lambda: all(p.poll() is not None for p in procs) or any(p.poll() for p in procs),
            timeout=RUN_TIMEOUT_S,
            what="every node exits",
        )
    finally:
        for proc in procs:
            stop_tree(proc)
    return [proc.returncode for proc in procs]


def stop_tree(proc: subprocess.Popen) -> None:
    """Stop a process started in its own session and everything below it. torchrun starts its
    workers in sessions of their own and stops them on SIGTERM; what is left after
    STOP_TIMEOUT_S is killed."""
    if proc.poll() is not None:
        return
    below = descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc: Linux; elsewhere none are found)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return [found for child in children for found in (child, *descendants(child))]


def max_difference(a: Path, b: Path) -> float:
    wa, wb = adapter_tensors(a), adapter_tensors(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[name] - wb[name]).abs().max()) for name in wa)


# Breadth (the SLURM template over two "nodes"): 25 s on 2 idle cores, 55 s loaded; runs with -m ''.
# Two-process equivalence runs by default in test_train_ddp and test_train_ranks_replicas.
@pytest.mark.extended
def test_slurm_template_two_nodes_same_update_as_one_then_requeue_resumes(tiny_workspace: Path):
    config = tiny_workspace / "sft.toml"
    config.write_text(SFT)  # batch 5 over 2 ranks: uneven slices, so a per-rank normalization would show
    one = train(config, "output_dir='runs/one'", "max_steps=3")  # the reference: 3 steps, one process

    first = run_slurm_job(tiny_workspace, config, "runs/two")
    assert "finished at step 2" in first[0] and "finished at step 2" not in first[1]  # node 0 holds rank 0
    two = tiny_workspace / "runs" / "two"
    assert [m["step"] for m in metrics(two)] == [1, 2]
    for a, b in zip(one.metrics[:2], metrics(two), strict=True):  # loss and gradient norm of the global batch
        for key in ("train/loss", "train/grad_norm", "policy/entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-5), key
    # the tolerances of test_train_ddp.py (2 processes vs 1); measured here: 1e-8 and 3e-7
    for step, atol in ((1, 1e-6), (2, 1e-4)):
        name = f"step_{step:06d}"
        assert max_difference(one.run_dir / "checkpoints" / name, two / "checkpoints" / name) < atol, step

    # the job again (requeued or resubmitted): the run folder has checkpoints, so the script resumes
    again = run_slurm_job(tiny_workspace, config, "runs/two", "--set", "max_steps=3")
    assert "resuming from step_000002" in again[0] and "finished at step 3" in again[0]
    assert [m["step"] for m in metrics(two)] == [1, 2, 3]
    log = (two / "run.log").read_text()
    assert log.count(" start pid=") == 1 and log.count("resume from step_000002") == 1  # rank 0 alone writes
    name = "step_000003"  # the resumed run reaches the uninterrupted single process's weights
    assert max_difference(one.run_dir / "checkpoints" / name, two / "checkpoints" / name) < 1e-4
    assert metrics(two)[2]["train/loss"] == pytest.approx(one.metrics[2]["train/loss"], rel=1e-5)


@pytest.mark.extended  # 10-18 s; breadth: the c10d form of the rendezvous (the fixed-rank form runs in CI above)
def test_c10d_rendezvous_two_nodes_train_and_checkpoint(tiny_workspace: Path):
    """The same options on both nodes (node ranks given on arrival), as `--rdzv-endpoint` users run it."""
    config = tiny_workspace / "sft.toml"
    config.write_text(SFT)
    outputs = run_c10d_nodes(
        tiny_workspace, str(config), "--set", "output_dir='runs/c10d'", "--set", "max_steps=1"
    )
    assert "\n".join(outputs).count("finished at step 1") == 1  # either node may hold rank 0: one speaks
    run = tiny_workspace / "runs" / "c10d"
    assert [m["step"] for m in metrics(run)] == [1]
    assert (run / "checkpoints" / "step_000001" / "adapter_model.safetensors").is_file()
    assert (run / "run.log").read_text().count(" start pid=") == 1


def test_stopped_run_names_the_command_that_continues_it(monkeypatch: pytest.MonkeyPatch):
    """One process, Workbench's --nproc ranks (the launcher sets RUN_DIR_ENV), or torchrun's."""
    from workbench.train.distributed import RUN_DIR_ENV, resume_hint

    run = Path("outputs/runs/r")
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    assert resume_hint(run, 1) == "`workbench train --resume outputs/runs/r`"
    assert (
        resume_hint(run, 4)
        == "the same torchrun command on every node, with `-m workbench train --resume outputs/runs/r`"
    )
    monkeypatch.setenv(RUN_DIR_ENV, str(run))
    assert resume_hint(run, 2) == "`workbench train --resume outputs/runs/r --nproc 2`"
