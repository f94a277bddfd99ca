"""Run identity below the TUI (issue 35.2, 35.5): `-m outputs/runs/latest` is resolved once at
launch and its run and checkpoint step kept in the eval's metadata (a resume evaluates that same
checkpoint), a checkpoint's manifest says when it was saved, and a training run stopped before
its first checkpoint does not claim to have one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.test_eval_run import run_cli
from tests.tui_data import install_test_envs, make_train_run, write_checkpoint
from workbench.cli.train_cmd import stopped_line
from workbench.evaluate import EvalConfig, run_eval
from workbench.inference.echo import EchoClient
from workbench.inference.resolve import describe_model
from workbench.store.checkpoints import MANIFEST, list_checkpoint_infos, saved_time, write_manifest
from workbench.store.runs import read_run_metadata


def newer(path: Path, seconds: int) -> None:
    """Move a checkpoint's folder time `seconds` into the future (resolve_latest_run orders by it)."""
    stamp = path.stat().st_mtime + seconds
    os.utime(path, (stamp, stamp))


def test_describe_model_names_the_run_and_step_a_path_means_now(workspace: Path):
    first = make_train_run(workspace, "first", steps=6, status="finished")  # checkpoints 3 and 6
    resolved = describe_model("outputs/runs/latest")
    assert resolved is not None and (resolved.run, resolved.step) == ("first", 6)
    assert resolved.label == "first step 6" and Path(resolved.path).is_absolute()
    assert describe_model(str(first)).label == "first step 6"  # a run folder: its newest checkpoint
    step3 = first / "checkpoints" / "step_000003"
    assert describe_model(str(step3)).label == "first step 3"
    second = make_train_run(workspace, "second", steps=3, status="finished")
    newer(second / "checkpoints" / "step_000003", 60)
    assert describe_model("outputs/runs/latest").label == "second step 3"
    for name in ("tiny", "Qwen/Qwen3-0.6B", "outputs/runs/none-yet"):
        assert describe_model(name) is None


def test_an_eval_of_latest_keeps_what_latest_meant_and_a_resume_evaluates_it(workspace: Path):
    install_test_envs(workspace)
    make_train_run(workspace, "first", steps=6, status="finished")
    config = EvalConfig(
        env_id="reverse-words", model="outputs/runs/latest", num_examples=2, rollouts_per_example=1
    )
    result = run_eval(config, client=EchoClient())
    meta = read_run_metadata(result.run_dir, "eval")
    assert meta.model == "outputs/runs/latest"  # as typed, and what it meant then:
    assert meta.resolved_model is not None and meta.resolved_model.label == "first step 6"
    assert "(first step 6)" in (result.run_dir / "run.log").read_text()

    second = make_train_run(workspace, "second", steps=3, status="finished")
    newer(second / "checkpoints" / "step_000003", 60)  # `latest` means another run now
    resumed = run_eval(config, client=EchoClient(), resume=str(result.run_dir))
    assert read_run_metadata(resumed.run_dir, "eval").resolved_model == meta.resolved_model


def test_a_server_model_name_is_not_resolved(workspace: Path):
    install_test_envs(workspace)
    make_train_run(workspace, "first", steps=3, status="finished")
    config = EvalConfig(
        env_id="reverse-words",
        model="outputs/runs/latest",
        num_examples=1,
        rollouts_per_example=1,
        api_base_url="http://127.0.0.1:9/v1",
    )
    result = run_eval(config, client=EchoClient())
    assert read_run_metadata(result.run_dir, "eval").resolved_model is None


def test_a_checkpoint_says_when_it_was_saved_not_when_its_files_were_touched(workspace: Path):
    run = make_train_run(workspace, "saved", steps=3, status="finished")
    checkpoint = run / "checkpoints" / "step_000003"
    legacy = saved_time(checkpoint)  # no manifest: trainer_state.json's mtime is all there is
    assert legacy is not None and legacy.timestamp() == 1767323045 + 3
    write_manifest(checkpoint)
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    assert "trainer_state.json" in manifest["files"]
    manifest["saved_at"] = "2026-03-04T05:06:07+00:00"
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))
    os.utime(checkpoint / "trainer_state.json")  # copied, restored: the mtime is now
    [info] = list_checkpoint_infos(run)
    assert info.saved_at is not None and info.saved_at.isoformat().startswith("2026-03-04T05:06:07")


def test_a_run_stopped_before_its_first_checkpoint_does_not_claim_one(workspace: Path):
    run = make_train_run(workspace, "early", steps=2, status="stopped")  # checkpoints every 3 steps
    assert not any((run / "checkpoints").iterdir())
    line = stopped_line(run, 0, 1)
    assert "with a checkpoint" not in line
    assert line.startswith("stopped at step 0 before any checkpoint was written")
    assert f"--resume {run}" in line
    write_checkpoint(run, 3, 0.4)
    assert stopped_line(run, 3, 1).startswith("stopped with a checkpoint (step 3); continue with")


TINY_RL = """model = "{model}"
max_steps = 1
batch_size = 4
rollouts_per_example = 2
micro_batch_size = 4
seed = 1
[sampling]
max_tokens = 16
[[env]]
id = "reverse-text"
[lora]
r = 4
alpha = 8
[checkpointing]
save_every_n_steps = 1
[eval]
interval = 0
[wandb]
mode = "disabled"
"""


@pytest.mark.slow
def test_training_from_a_run_keeps_the_checkpoint_it_started_from(tiny_workspace: Path):
    """`model = <a run folder>` means its newest checkpoint when the run starts; a resume starts from
    that same checkpoint after the source run has trained on."""

    def train(name: str, model: str, *extra: str) -> None:
        config = tiny_workspace / f"{name}.toml"
        config.write_text(TINY_RL.format(model=model))
        args = ["--resume", f"runs/{name}"] if extra else [str(config), "--set", f"output_dir='runs/{name}'"]
        done = run_cli("train", *args, *extra, cwd=tiny_workspace)
        assert done.returncode == 0, done.stdout + done.stderr

    train("first", "tiny")
    train("second", "runs/first")
    meta = read_run_metadata(tiny_workspace / "runs" / "second", "train")
    assert meta.resolved_model is not None and meta.resolved_model.label == "first step 1"
    train("first", "tiny", "--set", "max_steps=2")  # the source run trains on: step 2 is its newest
    train("second", "runs/first", "--set", "max_steps=2")
    resumed = read_run_metadata(tiny_workspace / "runs" / "second", "train")
    assert resumed.step == 2 and resumed.resolved_model == meta.resolved_model


def test_a_gepa_run_keeps_the_checkpoint_its_model_meant_at_launch(workspace: Path):
    from workbench.gepa.config import GepaConfig
    from workbench.gepa.service import launch_model
    from workbench.store.runs import GepaRun

    make_train_run(workspace, "first", steps=6, status="finished")
    config = GepaConfig(env_id="reverse-words", model="outputs/runs/latest")
    resolved = launch_model(config, None)
    assert resolved is not None and resolved.label == "first step 6"
    second = make_train_run(workspace, "second", steps=3, status="finished")
    newer(second / "checkpoints" / "step_000003", 60)  # `latest` means another run now
    saved = GepaRun(run_id="g", model=config.model, resolved_model=resolved)
    assert launch_model(config, saved) == resolved  # a resume loads what the run started on
    assert launch_model(config, None) is not None and launch_model(config, None).label == "second step 3"
    served = config.model_copy(update={"api_base_url": "http://127.0.0.1:9/v1"})
    assert launch_model(served, None) is None  # a server's model name is not a folder here
