"""Multi-process training (`workbench train CONFIG --nproc 2`, gloo on this CPU): 2 processes
make the same update as 1 on the same global batch (DDP and FSDP), rank 0 alone writes the run
folder, and a dying rank stops the run with one line and a resumable run folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cli
from tests.held_env import held_env_toml
from tests.marks import by_default
from tests.servers import wait_until
from tests.test_train import adapter_tensors, train

# batch_size 5 over 2 ranks: slices of 3 and 2 samples, so rank 1 runs an empty micro-batch and
# the ranks' token counts differ (a per-rank normalization would give a different update)
SFT = """
model = "tiny"
mode = "sft"
max_steps = 2
batch_size = 5
micro_batch_size = 1
learning_rate = 5e-3
seed = 3
[[env]]
id = "reverse-text"
args = { num_train_examples = 8 }
[sft]
from_env = true
[lora]
r = 4
alpha = 8
[checkpointing]
save_every_n_steps = 1
[wandb]
mode = "disabled"
"""

RL = """
model = "tiny"
max_steps = {steps}
batch_size = 8
rollouts_per_example = 4
micro_batch_size = 2
learning_rate = 3e-3
seed = 3
[sampling]
max_tokens = 40
[[env]]
id = "reverse-text"
[lora]
r = 4
alpha = 8
[checkpointing]
save_every_n_steps = 1
keep_n_checkpoints = 10
[eval]
interval = 2
num_examples = 4
[wandb]
mode = "offline"
"""


def child_env(folder: Path, **extra: str) -> dict[str, str]:
    """The workspace; PYTHONPATH (conftest) points the child and its ranks at this checkout."""
    return {**os.environ, "WORKBENCH_WORKSPACE": str(folder), **extra}


def workbench(folder: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`workbench ARGS` as a real process: with --nproc its ranks are its children, and rank 0
    prints to the launcher's own stdout (a file descriptor, which no in-process capture sees)."""
    env = child_env(folder)
    return subprocess.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# DDP's equivalence runs by default in test_train_ranks_replicas (server mode): fsdp here.
@pytest.mark.parametrize("strategy", by_default(["ddp", "fsdp"], ["fsdp"]))
def test_two_processes_make_the_same_update_as_one(tiny_workspace: Path, strategy: str):
    config = tiny_workspace / "sft.toml"
    config.write_text(SFT)
    one = train(config, "output_dir='runs/one'")
    done = workbench(
        tiny_workspace,
        "train",
        str(config),
        "--set",
        "output_dir='runs/two'",
        "--set",
        f"data_parallel='{strategy}'",
        "--nproc",
        "2",
    )
    assert done.returncode == 0, done.stderr
    two = tiny_workspace / "runs" / "two"
    for a, b in zip(one.metrics, metrics(two), strict=True):  # loss and gradient norm of the global batch
        for key in ("train/loss", "train/grad_norm", "policy/entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-5), key
    # Measured (DDP and FSDP): 5e-8 after step 1, 1.2e-5 after step 2 (AdamW amplifies float noise
    # on the few weights whose gradient is near its eps); a per-rank token normalization: 1e-2, 2e-2.
    # FSDP's ranks take the full-vocabulary logprob path (their head is sharded, so
    # train/selected_logprobs does not apply) and one process the chunked one: the same logprobs
    # to ~1e-7, which AdamW's first step turns into 3.4e-6 (measured) on those near-eps weights.
    for step, atol in ((1, 1e-6 if strategy == "ddp" else 1e-5), (2, 1e-4)):
        wa = adapter_tensors(one.run_dir / "checkpoints" / f"step_{step:06d}")
        wb = adapter_tensors(two / "checkpoints" / f"step_{step:06d}")
        assert wa.keys() == wb.keys()
        largest = max(float((wa[name] - wb[name]).abs().max()) for name in wa)
        assert largest < atol, f"step {step}: max weight difference 1 vs 2 processes {largest}"
    assert any(float(wa[name].abs().max()) > 1e-3 for name in wa if "lora_B" in name)  # it did train


# both by default: FSDP's RL path differs from DDP's (no shared-prompt passes: optimize.py)
@pytest.mark.parametrize("strategy", by_default(["ddp", "fsdp"], ["ddp"]))
def test_rl_two_processes_global_batch_and_rank0_writes(tiny_workspace: Path, strategy: str):
    """RL: each rank generates its groups (FSDP: with gathered weights); rank 0 writes them all."""
    config = tiny_workspace / "rl.toml"
    config.write_text(RL.format(steps=2))
    done = workbench(
        tiny_workspace,
        "train",
        str(config),
        "--set",
        "output_dir='runs/rl'",
        "--set",
        f"data_parallel='{strategy}'",
        "--nproc",
        "2",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("finished at step 2") == 1  # only rank 0 talks
    run = tiny_workspace / "runs" / "rl"
    lines = metrics(run)
    assert [m["step"] for m in lines] == [0, 1, 2]  # one line per step: rank 1 logged nothing
    assert all(m["rollout/trained_samples"] == 8 for m in lines[1:])  # the global batch
    assert "eval/reward_mean" in lines[0] and "eval/reward_mean" in lines[2]
    for step in (1, 2):  # both ranks' groups, written once
        records = [json.loads(l) for l in (run / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
        assert len(records) == 8 and sorted({r["example_id"] for r in records}) == [0, 1]
    log = (run / "run.log").read_text()
    assert log.count(" start pid=") == 1 and log.count("checkpoint step_000002") == 1
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1
    assert sorted(p.name for p in run.iterdir()) == [
        ".wandb_id",
        "checkpoints",
        "config.toml",
        "metadata.json",
        "metrics.jsonl",
        "rollouts",
        "run.lock",
        "run.log",
        "wandb",
    ]
    meta = json.loads((run / "metadata.json").read_text())
    assert meta["status"] == "finished" and meta["step"] == 2
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_workspace / "outputs" / "models" / "tiny")
    model = PeftModel.from_pretrained(base, str(run / "checkpoints" / "step_000002"))
    assert sum(p.numel() for n, p in model.named_parameters() if "lora_" in n) > 0


@pytest.mark.slow  # ~30 s
@pytest.mark.extended  # the same stop-and-resume as test_train_ranks_replicas' kill -9 of a rank (run by default)
def test_dead_rank_stops_the_run_with_one_line_and_resume_finishes(tiny_workspace: Path):
    run = tiny_workspace / "runs" / "die"
    held = tiny_workspace / "held"
    # Rank 1 stops at its first rollout once step 1's checkpoint is complete (tests/held_env.py)
    # and waits there to be killed: it dies mid-run, in step 2 at the latest, wherever the
    # machine's load puts the test. (The resume finds `held` and is never held.)
    table = held_env_toml(
        tiny_workspace,
        hold_after=run / "checkpoints" / "step_000001" / "trainer_state.json",
        held=held,
        rank=1,
    )
    config = tiny_workspace / "rl.toml"
    config.write_text(RL.format(steps=50).replace('[[env]]\nid = "reverse-text"\n', table))
    assert table in config.read_text()
    env = child_env(tiny_workspace)
    parent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workbench",
            "train",
            str(config),
            "--set",
            "output_dir='runs/die'",
            "--nproc",
            "2",
        ],
        cwd=tiny_workspace,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: held.exists() or parent.poll() is not None, timeout=240, what="rank 1 held")
        assert held.exists() and parent.poll() is None, parent.communicate()
        rank1 = int(held.read_text())  # only rank 1 holds (held_env's rank = 1): the pid it wrote
        assert (
            str(rank1) in Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
        )  # one of its ranks
        os.kill(rank1, signal.SIGKILL)
        _, err = parent.communicate(timeout=120)
    finally:
        if parent.poll() is None:  # a failed check: the launcher and its held ranks (they die with it) go
            parent.kill()
            parent.communicate()
    assert parent.returncode == 1, err
    assert (
        "error: trainer rank 1 died (exit code -9); the run can be resumed with --resume runs/die --nproc 2"
        in err
    )
    assert "Traceback" not in err
    # what the killed rank had printed is kept in run.log, not shown on the terminal
    assert (
        f"rank 1's last output is in {run / 'run.log'}" in err
        or "rank 1's last output is in runs/die/run.log" in err
    )
    assert f"[rank 1] held-reverse: holding in pid {rank1}" in (run / "run.log").read_text()
    done = workbench(tiny_workspace, "train", "--resume", "runs/die", "--set", "max_steps=3", "--nproc", "2")
    assert done.returncode == 0, done.stderr
    assert "resuming from step_" in done.stdout + done.stderr
    assert [m["step"] for m in metrics(run)] == [0, 1, 2, 3]  # steps after the checkpoint were redone, once
    assert json.loads((run / "metadata.json").read_text())["status"] == "finished"


def test_nproc_under_torchrun_is_one_line(tiny_workspace: Path):
    config = tiny_workspace / "rl.toml"
    config.write_text(RL.format(steps=1))
    env = child_env(tiny_workspace, WORLD_SIZE="2", RANK="0")
    done = cli.run(
        [sys.executable, "-m", "workbench", "train", str(config), "--nproc", "2"],
        cwd=tiny_workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == "error: --nproc starts the processes itself: leave it out under torchrun"
