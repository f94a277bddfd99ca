"""`policy/mismatch_kl` (mean), `policy/mismatch_kl_max` and `policy/mismatch_kl_std`: how far the
trainer's logprobs are from the sampler's, over every loss token of a step (all micro-batches,
all ranks), in the metrics file the TUI reads and under prime-rl's names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_train_ddp import child_env
from workbench.train.schema import TrainConfig

KEYS = ("policy/mismatch_kl", "policy/mismatch_kl_max", "policy/mismatch_kl_std")


def check_step(m: dict[str, float]) -> None:
    """The trainer and the sampler are the same float32 model: only arithmetic separates them
    (different batch shapes in generation and training): measured ~1e-9 mean, 6e-8 max. A wrong
    token id or stale weights show as 0.1 and more."""
    mean, top, std = (m[key] for key in KEYS)
    assert 0.0 <= mean <= top < 1e-3, m
    assert 0.0 <= std <= top, m
    # prime-rl's names, the same numbers
    assert (m["mismatch_kl/all/mean"], m["mismatch_kl/all/max"], m["mismatch_kl/all/std"]) == (mean, top, std)


def test_colocated_float32_mismatch_mean_and_max_stay_at_arithmetic_noise(tiny_workspace: Path):
    from workbench.store.runs import read_metrics
    from workbench.train import run_train

    config = TrainConfig(
        model="tiny",
        env=[{"id": "reverse-text"}],
        max_steps=2,
        batch_size=16,
        rollouts_per_example=4,
        micro_batch_size=4,  # four micro-batches: the max and the spread are over all of them
        pack_samples=False,
        sampling={"max_tokens": 48},
        eval={"interval": 0},
        wandb={"mode": "disabled"},
        output_dir=str(tiny_workspace / "mismatch"),
    )
    result = run_train(config)
    steps = [m for m in read_metrics(result.run_dir) if "policy/mismatch_kl" in m]
    assert result.status == "finished" and len(steps) == 2
    for m in steps:
        check_step(m)
    assert any(m["policy/mismatch_kl_max"] > m["policy/mismatch_kl"] for m in steps)  # a max, not a copy


@pytest.mark.extended  # two trainer processes, ~15-40 s; `python -m pytest -m ''` runs it
def test_two_ranks_log_the_step_wide_mismatch_once(tiny_workspace: Path):
    config = tiny_workspace / "rl.toml"
    config.write_text(
        'model = "tiny"\nmax_steps = 2\nbatch_size = 8\nrollouts_per_example = 4\nmicro_batch_size = 2\nseed = 3\n'
        '[sampling]\nmax_tokens = 40\n[[env]]\nid = "reverse-text"\n[wandb]\nmode = "disabled"\n'
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "workbench",
            "train",
            str(config),
            "--set",
            "output_dir='runs/two'",
            "--nproc",
            "2",
        ],
        cwd=tiny_workspace,
        env=child_env(tiny_workspace),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [
        json.loads(line)
        for line in (tiny_workspace / "runs" / "two" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [m for m in lines if "policy/mismatch_kl" in m]
    # (seed 3: both steps have groups whose rewards differ, so both train)
    assert len(steps) == 2  # rank 0 alone logs, after the all-reduce and the gather of the maxima
    for m in steps:
        check_step(m)
