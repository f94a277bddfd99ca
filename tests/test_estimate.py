"""Before launch, an estimate (issue 35.6): the workspace's timings file, the estimator's
scaling from measured runs and evals, the dry run's line, and (slow) a real run that records its
estimate against its actual time and becomes the next estimate's basis."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import pytest

from tests.test_eval_run import run_cli
from workbench.engine.timings import count_parameters, identify_model
from workbench.store.runs import TrainRun, read_run_metadata, workspace_runs
from workbench.store.timings import (
    EvalTiming,
    TrainTiming,
    append_timing,
    machine_load,
    read_timings,
    this_machine,
    timings_path,
)
from workbench.train.config import load_train_config
from workbench.train.estimate import (
    Workload,
    describe,
    duration,
    estimate_train,
    prior_seconds_per_token,
    token_count,
)
from workbench.train.estimate_calibration import (
    BETWEEN_STEPS_S,
    GEN_PER_EVAL_TOKEN,
    HELD_OUT_PER_EVAL_TOKEN,
    LOAD_S_PER_PARAM,
    STARTUP_S,
    TRAIN_PER_EVAL_TOKEN,
)
from workbench.train.schema import TrainConfig

CONFIG = """
model = "{model}"
max_steps = 10
batch_size = 128
rollouts_per_example = 8
[sampling]
max_tokens = {max_tokens}
[[env]]
id = "reverse-text"
[eval]
interval = 5
num_examples = 32
rollouts_per_example = 2
"""


def fake_model(folder: Path, params: int = 200) -> Path:
    """A model folder whose safetensors header declares `params` float32 parameters."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    header = json.dumps({"w": {"dtype": "F32", "shape": [params], "data_offsets": [0, 4 * params]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(4 * params))
    return folder


def config(tmp_path: Path, model: Path, max_tokens: int = 96) -> TrainConfig:
    path = tmp_path / "run.toml"
    path.write_text(CONFIG.format(model=model, max_tokens=max_tokens))
    return load_train_config(path, [])[0]


def train_timing(model: Path, **changes: object) -> TrainTiming:
    """A measured run: 64 rollouts of 40 tokens a step (2 s: 1.2 waiting for rollouts, 0.8
    training on 160 tokens a sample), 5 s start-up, 3 s per held-out eval of 128 rollouts."""
    identity = identify_model(str(model))
    values: dict[str, object] = dict(
        run_id="r",
        recorded_at="2026-01-01T00:00:00+00:00",
        machine=this_machine(),
        model=str(model),
        model_key=identity.key,
        model_label="fake",
        params=identity.params,
        env_ids=["reverse-text"],
        mode="rl",
        lora=True,
        inference="colocated",
        steps=20,
        batch_size=64,
        completion_tokens=40.0,
        sample_tokens=160.0,
        step_s=2.0,
        first_step_s=1.5,
        wait_s=1.2,
        startup_s=5.0,
        held_out_evals=3,
        held_out_rollouts=128,
        held_out_s=3.0,
        between_steps_s=0.1,
        total_s=60.0,
    )
    return TrainTiming.model_validate({**values, **changes})


def eval_timing(model: Path, **changes: object) -> EvalTiming:
    identity = identify_model(str(model))
    values: dict[str, object] = dict(
        run_id="e",
        recorded_at="2026-01-01T00:00:00+00:00",
        machine=this_machine(),
        model=str(model),
        model_key=identity.key,
        model_label="fake",
        params=identity.params,
        env_id="reverse-text",
        local=True,
        rollouts=128,
        max_concurrent=32,
        prompt_tokens=120.0,
        completion_tokens=20.0,
        rollouts_s=1.28,  # 0.5 ms a token
    )
    return EvalTiming.model_validate({**values, **changes})


def test_timings_round_trip_and_unreadable_lines_are_skipped(workspace: Path):
    model = fake_model(workspace / "m")
    run, ev = train_timing(model), eval_timing(model)
    append_timing(run)
    with timings_path().open("a") as f:
        f.write('{"kind": "gepa", "run_id": "x"}\n{"kind": "train", "run_id": "torn"\nnot json\n')
    append_timing(ev)
    assert read_timings() == [run, ev]
    assert ev.seconds_per_token == pytest.approx(1.28 / (128 * 20))


def test_the_machines_load_is_at_most_its_load_average():
    """The instant's runnable tasks only ever lower it (a finished burst of work is not load)."""
    before = os.getloadavg()[0]
    load = machine_load()
    if load is not None:  # the average moves every 5 s: either reading bounds it
        assert 0.0 <= load <= max(before, os.getloadavg()[0])


def test_parameters_are_read_from_safetensors_headers_without_torch(tmp_path: Path):
    model = fake_model(tmp_path / "m", params=1234)
    assert count_parameters(model) == 1234
    assert identify_model(str(model)).params == 1234
    assert identify_model("no-such-model").params is None


def test_a_measured_run_is_scaled_by_rollouts_and_tokens(workspace: Path):
    model = fake_model(workspace / "m")
    append_timing(train_timing(model))
    c = config(workspace, model)
    w = Workload.of(c)
    assert (w.steps, w.held_out_evals, w.held_out_rollouts) == (10, 3, 64)  # before, at 5, at 10
    estimate = estimate_train(c, load=0.0)
    # twice the rollouts: waiting 1.2 -> 2.4 s and training 0.8 -> 1.6 s a step; held-out evals of
    # half the rollouts: 1.5 s each
    assert estimate.seconds == pytest.approx(5.0 + 3 * 1.5 + 10 * (2.4 + 1.6 + 0.1))
    assert estimate.tokens == 10 * 128 * 40
    assert estimate.basis == "from your earlier run of m on reverse-text" and not estimate.rough
    # a lower max_tokens caps the completions: 20 tokens, so half the rollout time, and 140 of 160
    # tokens a sample to train on
    capped = estimate_train(config(workspace, model, max_tokens=20), load=0.0)
    assert capped.seconds == pytest.approx(5.0 + 3 * 1.5 + 10 * (1.2 + 0.8 * 2 * 140 / 160 + 0.1))
    # resumed at step 6: four steps left and one held-out eval (step 10), no baseline
    resumed = estimate_train(c, start_step=6, load=0.0)
    assert resumed.steps == 4 and resumed.seconds == pytest.approx(5.0 + 1.5 + 4 * 4.1)


def test_the_newest_matching_runs_count_and_the_median_is_taken(workspace: Path):
    model = fake_model(workspace / "m")
    for step_s in (100.0, 3.0, 2.0, 4.0):  # the oldest is beyond the newest three
        append_timing(train_timing(model, step_s=step_s, wait_s=0.0, held_out_s=0.0, startup_s=0.0))
    append_timing(train_timing(model, step_s=50.0, machine="another machine"))
    append_timing(train_timing(model, step_s=50.0, env_ids=["alphabet-sort"]))
    append_timing(train_timing(model, step_s=50.0, lora=False))
    estimate = estimate_train(config(workspace, model), load=0.0)
    assert estimate.seconds == pytest.approx(10 * (3.0 * 2 + 0.1))  # median of 3, 2, 4; batch x2
    assert estimate.basis == "from your 3 earlier runs of m on reverse-text"


def test_without_runs_an_eval_of_the_model_gives_the_speed(workspace: Path):
    model = fake_model(workspace / "m")
    append_timing(eval_timing(model))
    append_timing(eval_timing(model, local=False, rollouts_s=999.0))  # a server's speed is not ours
    estimate = estimate_train(config(workspace, model), load=0.0)
    s = 1.28 / (128 * 20)  # 0.5 ms a token; 20 completion and 120 prompt tokens
    step = GEN_PER_EVAL_TOKEN[True] * 128 * 20 * s + TRAIN_PER_EVAL_TOKEN[True] * 128 * 140 * s
    held_out = HELD_OUT_PER_EVAL_TOKEN * 64 * 20 * s
    startup = STARTUP_S + LOAD_S_PER_PARAM * 200
    expected = startup + 3 * held_out + 10 * (step + BETWEEN_STEPS_S)
    assert estimate.seconds == pytest.approx(expected)
    assert estimate.tokens == 10 * 128 * 20
    assert estimate.basis == "from your eval of m on reverse-text" and not estimate.rough
    append_timing(eval_timing(model, rollouts_s=0.64, env_id="alphabet-sort"))  # twice as fast
    faster = estimate_train(config(workspace, model), load=0.0)
    assert faster.seconds < estimate.seconds and faster.tokens == estimate.tokens  # lengths: reverse-text's
    assert faster.basis == "from your 2 evals of m on alphabet-sort+reverse-text"


def test_an_eval_far_slower_than_its_models_size_says_is_taken_for_a_busy_machine(workspace: Path):
    model = fake_model(workspace / "m")
    slow = eval_timing(model, rollouts_s=128 * 20 * 10 * prior_seconds_per_token(200))
    append_timing(slow)
    estimate = estimate_train(config(workspace, model), load=0.0)
    assert estimate.basis == (
        "lengths from your eval of m on reverse-text; speed from the model's size: that eval ran 10x "
        "slower, slowed by other work"
    )
    at_prior = estimate_train(config(workspace, model), load=0.0, root=workspace / "elsewhere")
    assert at_prior.rough and estimate.seconds < at_prior.seconds  # same speed, shorter measured lengths


def test_estimates_scale_with_the_machines_load(workspace: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    model = fake_model(workspace / "m")
    append_timing(train_timing(model, load=1.0))  # one other task: a core each, no slowdown
    idle = estimate_train(config(workspace, model), load=0.0)
    busy = estimate_train(config(workspace, model), load=5.0)  # 5 other tasks on 2 cores: a third
    assert busy.seconds == pytest.approx(3 * idle.seconds) and busy.tokens == idle.tokens
    assert busy.basis == "from your earlier run of m on reverse-text; x3.0 for the machine's load now"
    assert estimate_train(config(workspace, model), load=0.5).seconds == pytest.approx(idle.seconds)


def test_with_no_measurement_the_model_size_gives_a_rough_estimate(workspace: Path):
    small, big = fake_model(workspace / "small", 1000), fake_model(workspace / "big", 10_000_000)
    estimate = estimate_train(config(workspace, small), load=0.0)
    assert estimate.rough and estimate.basis.startswith("no measurements yet, rough: from the model's size")
    assert estimate.tokens == 10 * 128 * 48  # half of max_tokens
    assert estimate_train(config(workspace, big), load=0.0).seconds > estimate.seconds
    assert describe(estimate).startswith("roughly ")


def test_words():
    assert [duration(s) for s in (3, 42, 100, 3000, 7200)] == [
        "5 seconds",
        "40 seconds",
        "2 minutes",
        "50 minutes",
        "2.0 hours",
    ]
    assert [token_count(n) for n in (950, 1500, 92160, 2_500_000)] == ["950", "1.5k", "92k", "2.5M"]


def test_the_dry_run_says_the_estimate_and_its_basis(tiny_workspace: Path):
    path = tiny_workspace / "run.toml"
    path.write_text(CONFIG.format(model="tiny", max_tokens=96))
    append_timing(train_timing(Path("tiny"), model_label="tiny"))
    result = run_cli("train", str(path), "--dry-run", cwd=tiny_workspace)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.strip().startswith("estimate"))
    # 50 seconds on an idle machine (as the scaling test computes), more on a busy one
    assert re.search(
        r"about \d+ (seconds|minutes?), 51k tokens \(from your earlier run of tiny on reverse-text", line
    )


@pytest.mark.slow
def test_a_real_run_records_estimate_and_actual_and_the_next_estimate_uses_it(tiny_workspace: Path):
    ws = tiny_workspace
    evaluated = run_cli("eval", "run", "reverse-text", "-m", "tiny", "-n", "4", "-r", "2", cwd=ws)
    assert evaluated.returncode == 0, evaluated.stderr
    (measured,) = read_timings()
    assert isinstance(measured, EvalTiming) and measured.rollouts == 8 and measured.local
    path = ws / "run.toml"
    path.write_text(CONFIG.format(model="tiny", max_tokens=48).replace("max_steps = 10", "max_steps = 3"))
    overrides = ["--set", "batch_size=16", "--set", "eval.interval=0", "--set", "wandb.mode='disabled'"]
    planned = run_cli("train", str(path), *overrides, "--dry-run", cwd=ws)
    assert "your eval of tiny on reverse-text" in planned.stdout  # its speed, or (busy machine) its lengths
    trained = run_cli("train", str(path), *overrides, cwd=ws)
    assert trained.returncode == 0, trained.stderr
    assert "took " in trained.stdout and "estimated " in trained.stdout
    (run,) = workspace_runs("train", ws)
    meta = read_run_metadata(run, "train")
    assert isinstance(meta, TrainRun) and meta.estimate is not None
    assert "your eval of tiny on reverse-text" in meta.estimate.basis and meta.estimate.steps == 3
    assert meta.estimate.seconds > 0 and meta.estimate.actual_s is not None and meta.estimate.actual_s > 0
    timing = read_timings()[-1]
    assert isinstance(timing, TrainTiming) and timing.steps == 3 and timing.run_id == run.name
    assert timing.model_label == "tiny" and timing.step_s > 0 and timing.startup_s > 0
    again = run_cli("train", str(path), *overrides, "--dry-run", cwd=ws)
    assert "(from your earlier run of tiny on reverse-text" in again.stdout


def test_the_estimate_row_is_read_from_a_dry_run():
    from workbench.tui.screens.launch import estimate_row

    plan = (
        "Steps\n  total       2,560 rollouts\n  estimate    about 45 seconds, 92k tokens (from your eval)  \n"
    )
    assert estimate_row(plan) == "about 45 seconds, 92k tokens (from your eval)"
    assert estimate_row("error: no such config") is None


async def test_the_launcher_shows_a_training_configs_estimate(tiny_workspace: Path):
    from tests.tui_data import text_of, wait_for
    from workbench.tui.app import WorkbenchApp

    config_file = tiny_workspace / "configs" / "rl" / "est.toml"
    config_file.parent.mkdir(parents=True)
    config_file.write_text(
        "# workbench train configs/rl/est.toml\n" + CONFIG.format(model="tiny", max_tokens=96)
    )
    append_timing(train_timing(Path("tiny"), model_label="tiny"))
    app = WorkbenchApp(tiny_workspace, poll_s=0.3)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("l", "ctrl+t")
        shown = app.screen.query_one("#launch-estimate")
        await wait_for(pilot, lambda: "from your" in text_of(shown))
        assert re.search(
            r"estimate: about .+, 51k tokens \(from your earlier run of tiny on reverse-text", text_of(shown)
        )
