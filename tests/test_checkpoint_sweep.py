"""`workbench eval run ENV -m RUN --checkpoints all|STEPS [--no-base]`: the base model and each
chosen checkpoint of a real training run on the same examples and seed; finished points are
never evaluated twice; a table and a bar per step are printed and saved."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cli
from workbench.store.sweeps import BASE, read_sweep

CONFIG = """
model = "tiny"
max_steps = 2
batch_size = 8
rollouts_per_example = 4
micro_batch_size = 8
learning_rate = 3e-3
run_name = "swept"
[sampling]
max_tokens = 48
[[env]]
id = "reverse-text"
[checkpointing]
save_every_n_steps = 1
keep_n_checkpoints = 0
[wandb]
mode = "disabled"
"""


@pytest.fixture
def trained(tiny_workspace: Path) -> Path:
    from workbench.train import load_train_config, run_train

    path = tiny_workspace / "run.toml"
    path.write_text(CONFIG)
    config, _ = load_train_config(path)
    return run_train(config).run_dir


def workbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "WORKBENCH_WORKSPACE": str(cwd)}
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def eval_runs(workspace: Path) -> list[Path]:
    return sorted(workspace.glob("environments/reverse_text/outputs/evals/*/*/metadata.json"))


def test_sweep_evaluates_base_and_every_checkpoint_once(trained: Path, tiny_workspace: Path):
    sweep = ["eval", "run", "reverse-text", "-m", "outputs/runs/latest", "-n", "4", "-r", "2", "-t", "48"]
    first = workbench(*sweep, "--checkpoints", "all", cwd=tiny_workspace)
    assert first.returncode == 0, first.stderr
    points = read_sweep(trained)
    assert [p.step for p in points] == [BASE, 1, 2]
    assert all(p.key == points[0].key for p in points) and len(eval_runs(tiny_workspace)) == 3
    bars = [line for line in first.stdout.splitlines() if line.strip().startswith(("base ", "1 ", "2 "))]
    assert len(bars) >= 3 and all("█" in line or line.rstrip().endswith("0.000") for line in bars[-3:]), (
        first.stdout
    )
    rows = list(csv.DictReader((trained / "checkpoint_evals.csv").open()))
    assert (
        [r["step"] for r in rows] == ["base", "1", "2"]
        and rows[0]["vs_base"] == ""
        and rows[1]["vs_base"] != ""
    )
    # the same examples and seed: the base point is the plain eval of the base model, reproducible
    again = workbench(*sweep, "--checkpoints", "2", "--no-base", cwd=tiny_workspace)
    assert again.returncode == 0 and "already evaluated" in again.stderr, again.stderr
    assert len(eval_runs(tiny_workspace)) == 3 and len(read_sweep(trained)) == 3  # nothing evaluated twice
    other = workbench(
        *sweep[:-4], "-n", "2", "-r", "2", "-t", "48", "--checkpoints", "1", "--no-base", cwd=tiny_workspace
    )
    assert other.returncode == 0 and len(eval_runs(tiny_workspace)) == 4  # other settings: a new point


def test_sweep_mistakes_are_one_line(trained: Path, tiny_workspace: Path):
    for args, needle in (
        (["--checkpoints", "7"], "no checkpoint of step 7"),
        (["--checkpoints", "x"], "--checkpoints takes 'all' or steps"),
        (["--no-base"], "--no-base goes with --checkpoints"),
    ):
        result = workbench("eval", "run", "reverse-text", "-m", str(trained), *args, cwd=tiny_workspace)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 1 and len(lines) == 1 and needle in lines[0], result.stderr
    plain = workbench("eval", "run", "reverse-text", "-m", "tiny", "--checkpoints", "all", cwd=tiny_workspace)
    assert plain.returncode == 1 and "needs a training run folder" in plain.stderr


def test_sweep_through_a_server_loads_each_checkpoint_into_it(
    trained: Path, tiny_workspace: Path, tiny_model: Path
):
    """prime-rl's way: a server started with the base model; each LoRA checkpoint is loaded into
    it (/v1/load_lora_adapter) and evaluated under its own name."""
    import asyncio

    from tests.servers import serve_in_thread
    from workbench.inference.local_client import LocalClient
    from workbench.inference.server import create_app

    client = LocalClient(tiny_model, model_name="tiny")
    try:
        with serve_in_thread(create_app(client, served_model_name="tiny", enable_lora=True)) as url:
            swept = workbench(
                "eval",
                "run",
                "reverse-text",
                "-m",
                str(trained),
                "--checkpoints",
                "all",
                "-b",
                f"{url}/v1",
                "-n",
                "2",
                "-r",
                "2",
                "-t",
                "32",
                cwd=tiny_workspace,
            )
            assert swept.returncode == 0, swept.stderr
            assert client.adapters == {
                "swept-step_2": str((trained / "checkpoints" / "step_000002").resolve())
            }
    finally:
        asyncio.run(client.close())
    points = read_sweep(trained)
    assert [p.step for p in points] == [BASE, 1, 2] and all(p.key.server == f"{url}/v1" for p in points)
    models = sorted(path.parent.parent.name for path in eval_runs(tiny_workspace))
    assert models == ["reverse-text--swept-step_1", "reverse-text--swept-step_2", "reverse-text--tiny"]
