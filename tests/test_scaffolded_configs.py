"""`workbench lab setup` (prime's spelling of `workbench setup`) scaffolds an RL and an eval config
for every bundled environment and a GEPA config; in a fresh workspace, offline, with nothing added
(GSM8K ships with the gsm8k environment), each passes --dry-run and runs on the tiny model."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests import cli
from workbench.bootstrap import BUNDLED_ENVS
from workbench.envs import load_environment
from workbench.evaluate import EvalConfig

ENV_IDS = [name.replace("_", "-") for name in BUNDLED_ENVS]
# One short step: what is checked is that the config runs, not what it learns.
ONE_STEP = [
    "--set",
    "max_steps=1",
    "--set",
    "batch_size=4",
    "--set",
    "rollouts_per_example=2",
    "--set",
    "micro_batch_size=4",
    "--set",
    "eval.interval=0",
    "--set",
    "sampling.max_tokens=24",
    "--set",
    "wandb.mode='disabled'",
]


def workbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBENCH_WORKSPACE", "OPENAI_API_KEY")}
    env |= {"COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """A workspace made by `workbench lab setup`, with the session's tiny model and nothing else."""
    root = tmp_path_factory.mktemp("lab")
    done = workbench("lab", "setup", "ws", "--skip-model", cwd=root)
    assert done.returncode == 0, done.stderr
    ws = root / "ws"
    (ws / "outputs" / "models" / "tiny").symlink_to(tiny_model, target_is_directory=True)
    return ws


def test_lab_setup_is_listed_and_scaffolds_every_config(lab: Path):
    assert "lab" in workbench("--help", cwd=lab).stdout
    for env_id in ENV_IDS:
        assert (lab / "configs" / "rl" / f"{env_id}.toml").is_file(), env_id
        assert (lab / "configs" / "eval" / f"{env_id}.toml").is_file(), env_id
    assert workbench("gepa", "run", "configs/gepa/reverse-text.toml", "--dry-run", cwd=lab).returncode == 0


# Waits for a run of its SFT warm-up (configs/sft/reverse-text-smollm2.toml): its dry run passes and says so.
NEEDS_A_RUN_FIRST = {"configs/rl/reverse-text-smollm2.toml": "outputs/runs/reverse-text-smollm2-sft"}


def test_every_scaffolded_training_config_passes_its_dry_run(lab: Path):
    configs = sorted(
        str(p.relative_to(lab)) for d in ("rl", "sft") for p in (lab / "configs" / d).glob("*.toml")
    )
    assert {"configs/rl/gsm8k.toml", "configs/rl/math-python.toml", *NEEDS_A_RUN_FIRST} <= set(configs)
    for config in configs:
        dry = workbench("train", config, "--dry-run", cwd=lab)
        assert "dry run: config is valid" in dry.stdout, config + dry.stdout + dry.stderr
        assert dry.returncode == 0, config + dry.stderr
        if config in NEEDS_A_RUN_FIRST:  # the next stage of a pipeline: the dry run says what to run first
            said = " ".join((dry.stdout + dry.stderr).split())
            assert (
                f"{NEEDS_A_RUN_FIRST[config]}' is made by `workbench train configs/sft/reverse-text-smollm2.toml`"
                in said
            ), said
    assert not (lab / "data").exists()  # nothing to download or copy in first


def test_every_scaffolded_eval_config_loads_its_environment(lab: Path, monkeypatch: pytest.MonkeyPatch):
    """What a dry run of `workbench eval run CONFIG` would check: the config's keys and its env_args."""
    monkeypatch.chdir(lab)
    monkeypatch.setenv("WORKBENCH_WORKSPACE", str(lab))
    configs = sorted((lab / "configs" / "eval").glob("*.toml"))
    assert {p.stem for p in configs} == set(ENV_IDS)
    for path in configs:
        config = EvalConfig(**tomllib.loads(path.read_text()))
        env = load_environment(config.env_id, **config.env_args)
        assert len(env.get_examples(2)) == 2, path.name


def test_a_missing_data_file_is_named_by_the_dry_run(lab: Path):
    mine = lab / "configs" / "rl" / "gsm8k-mine.toml"
    mine.write_text(
        (lab / "configs" / "rl" / "gsm8k.toml")
        .read_text()
        .replace('id = "gsm8k"\n', 'id = "gsm8k"\nargs = { data_path = "data/mine.jsonl" }\n')
    )
    try:
        dry = workbench("train", str(mine.relative_to(lab)), "--dry-run", cwd=lab)
    finally:
        mine.unlink()
    assert dry.returncode == 1 and "data file not found" in dry.stderr and "data/mine.jsonl" in dry.stderr, (
        dry.stderr
    )
    assert "dry run: config is valid, but a real run cannot start" in dry.stdout  # the plan is still printed


# reverse-text runs by default; the other five (about 40 s each) are `extended`
@pytest.mark.parametrize(
    "env_id", [e if e == "reverse-text" else pytest.param(e, marks=pytest.mark.extended) for e in ENV_IDS]
)
def test_scaffolded_rl_and_eval_configs_run(lab: Path, env_id: str):
    config = f"configs/rl/{env_id}.toml"
    dry = workbench("train", config, "--dry-run", cwd=lab)
    assert dry.returncode == 0 and "dry run: config is valid" in dry.stdout, dry.stdout + dry.stderr
    run = workbench("train", config, *ONE_STEP, "--set", f"run_name='{env_id}-one-step'", cwd=lab)
    assert run.returncode == 0, run.stderr
    assert (lab / "outputs" / "runs" / f"{env_id}-one-step" / "checkpoints" / "step_000001").is_dir()
    evaluated = workbench(
        "eval", "run", f"configs/eval/{env_id}.toml", "-n", "2", "-r", "2", "-t", "24", cwd=lab
    )
    assert evaluated.returncode == 0 and "saved to" in evaluated.stdout, evaluated.stderr


@pytest.mark.extended
def test_scaffolded_gepa_config_runs(lab: Path):
    run = workbench(
        "gepa", "run", "configs/gepa/reverse-text.toml", "-B", "12", "-n", "3", "-N", "2", cwd=lab
    )
    assert run.returncode == 0, run.stderr
