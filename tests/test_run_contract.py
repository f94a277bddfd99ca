"""What eval, training, GEPA and the TUI share below the services: the run folder's metadata
(store.runs), locating runs, the sampling policy and the difficulty rule (engine)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from workbench.engine.difficulty import DEFAULT_RULE, DifficultyRule, difficulty_counts
from workbench.engine.sampling import resolve_sampling, sampling_for
from workbench.errors import UserError
from workbench.evaluate.config import EvalConfig
from workbench.store.runs import (
    SCHEMA_VERSION,
    EvalRun,
    GepaRun,
    TrainRun,
    effective_status,
    locate_run,
    read_run_metadata,
    write_run_metadata,
)
from workbench.train.batches import keep_group
from workbench.train.schema import TrainConfig
from workbench.types import Group, Rollout


def group(example_id: int, *rewards: float) -> Group:
    return Group(
        example_id,
        [
            Rollout(example_id=example_id, rollout_index=i, prompt=[], completion=[], reward=r)
            for i, r in enumerate(rewards)
        ],
    )


# ----- metadata.json -------------------------------------------------------------------------
def test_metadata_round_trip_is_versioned_and_typed(tmp_path: Path):
    run = tmp_path / "run"
    meta = EvalRun(run_id="run", env_id="reverse-text", model="tiny", total_rollouts=8, completed_rollouts=4)
    write_run_metadata(run, meta)
    raw = json.loads((run / "metadata.json").read_text())
    assert raw["schema_version"] == SCHEMA_VERSION and raw["kind"] == "eval" and raw["status"] == "running"
    assert raw["pid"] == os.getpid() and "error" not in raw  # unset optional fields are left out
    back = read_run_metadata(run)
    assert isinstance(back, EvalRun) and back.progress() == (4, 8) and back.env_label == "reverse-text"


def test_each_kind_reports_progress_and_reward_its_own_way(tmp_path: Path):
    train = TrainRun(run_id="t", env_ids=["a", "b"], step=3, max_steps=10, reward_mean=0.2)
    gepa = GepaRun(
        run_id="g", metric_calls_used=40, config={"max_calls": 100}, best_score=0.7, reward_mean=0.1
    )
    assert train.progress() == (3, 10) and train.env_label == "a+b" and train.headline_reward == 0.2
    assert gepa.progress() == (40, 100) and gepa.headline_reward == 0.7


def test_files_from_before_the_schema_and_odd_fields_still_read(tmp_path: Path):
    run = tmp_path / "old"
    run.mkdir()
    (run / "metadata.json").write_text(
        json.dumps({"kind": "train", "status": "weird", "step": "three", "max_steps": 5, "future_key": 1})
    )
    meta = read_run_metadata(run)
    assert isinstance(meta, TrainRun) and meta.run_id == "old" and meta.status == "unknown"
    assert meta.step is None and meta.max_steps == 5  # a field of the wrong shape reads as missing
    assert meta.pid is None and meta.created_at is None  # not the reader's own pid or clock
    (run / "metadata.json").write_text("[1, 2]")
    with pytest.raises(ValueError):
        read_run_metadata(run)


def test_a_running_run_whose_process_is_gone_has_died():
    assert effective_status(EvalRun(run_id="x", pid=os.getpid())) == "running"
    assert effective_status(EvalRun(run_id="x", pid=2**22 + 12345)) == "died"
    assert effective_status(EvalRun(run_id="x", status="finished", pid=2**22 + 12345)) == "finished"


# ----- locating runs --------------------------------------------------------------------------
def test_locate_run_by_latest_path_and_id(tmp_path: Path):
    parent = tmp_path / "environments" / "reverse_text" / "outputs" / "evals" / "reverse-text--tiny"
    for run_id in ("20260101-000000-aaaa", "20260102-000000-bbbb"):
        write_run_metadata(parent / run_id, EvalRun(run_id=run_id))
    write_run_metadata(tmp_path / "outputs" / "runs" / "train-run", TrainRun(run_id="train-run"))
    newest = parent / "20260102-000000-bbbb"
    assert locate_run("latest", "eval", latest_in=parent) == newest
    assert locate_run("latest", "eval", root=tmp_path) == newest
    assert locate_run(str(parent / "20260101-000000-aaaa"), "eval") == parent / "20260101-000000-aaaa"
    assert locate_run("20260101-000000-aaaa", "eval", root=tmp_path) == parent / "20260101-000000-aaaa"
    assert locate_run("train-run", "train", root=tmp_path) == tmp_path / "outputs" / "runs" / "train-run"
    with pytest.raises(UserError, match="not a GEPA run folder .*kind is not 'gepa'"):
        locate_run(str(newest), "gepa")
    with pytest.raises(UserError, match="not an eval run folder"):
        locate_run(str(tmp_path / "nothing"), "eval")
    with pytest.raises(UserError, match="no earlier run to resume"):
        locate_run("latest", "eval", latest_in=tmp_path / "empty")
    with pytest.raises(UserError, match="no gepa runs under"):
        locate_run("latest", "gepa", root=tmp_path)


# ----- the sampling policy --------------------------------------------------------------------
def test_sampling_layers_env_then_config_then_flags():
    env = {"max_tokens": 512, "temperature": 0.3}
    flags = EvalConfig(env_id="x", max_tokens=64, sampling_args={"temperature": 0.9, "min_p": 0.1})
    assert sampling_for(EvalConfig(env_id="x"), env).max_tokens == 512  # unset flags leave the env's value
    sampling = sampling_for(flags, env)
    assert (sampling.max_tokens, sampling.temperature, sampling.extra) == (64, 0.9, {"min_p": 0.1})
    layered = resolve_sampling({"max_tokens": 128, "top_p": 1.0}, env, {"top_p": 0.5}, seed=7)
    assert (layered.max_tokens, layered.temperature, layered.top_p, layered.seed) == (512, 0.3, 0.5, 7)


def test_training_honours_the_environments_sampling_args():
    from workbench.envs.loader import load_environment
    from workbench.train.setup import training_sampling

    gsm8k = load_environment("gsm8k")  # the GSM8K copy shipped with it
    assert gsm8k.sampling_args["max_tokens"] == 512
    plain = TrainConfig(env=[{"id": "gsm8k"}])
    assert training_sampling(plain, gsm8k).max_tokens == 512  # the env's, not the built-in 128
    assert training_sampling(plain, None).max_tokens == 128
    given = TrainConfig(env=[{"id": "gsm8k"}], sampling={"max_tokens": 64, "temperature": 0.7})
    sampling = training_sampling(given, gsm8k)
    assert (sampling.max_tokens, sampling.temperature, sampling.seed) == (64, 0.7, 0)


def test_max_concurrent_is_a_training_key():
    assert TrainConfig(env=[{"id": "x"}], batch_size=128).step_concurrency() == 128
    assert TrainConfig(env=[{"id": "x"}], batch_size=128).eval_concurrency() == 64
    capped = TrainConfig(env=[{"id": "x"}], max_concurrent=4)
    assert (capped.step_concurrency(), capped.eval_concurrency()) == (4, 4)


# ----- the difficulty rule --------------------------------------------------------------------
def test_one_difficulty_rule_for_eval_tui_and_training():
    flat_good, flat_bad, varied, barely = (
        group(0, 1, 1, 1),
        group(1, 0, 0, 0),
        group(2, 0, 1, 0, 1),
        group(3, 0, 0, 0, 0.05),
    )
    assert [DEFAULT_RULE.classify(g) for g in (flat_good, flat_bad, varied, barely)] == [
        "too easy",
        "too hard",
        "in range",
        "too hard",
    ]  # std 0.02 < 0.05: hardly any signal
    assert difficulty_counts([flat_good, flat_bad, varied, barely]) == {
        "too easy": 1,
        "in range": 1,
        "no signal": 0,  # a flat group at a middling mean (issue 35): tests/test_tui_eval_views.py
        "too hard": 2,
    }
    # training's filter is the same rule with the config's thresholds
    config = TrainConfig(
        env=[{"id": "x"}], difficulty_filter={"enabled": True, "min_reward_variance": 0.0, "max_reward": 0.4}
    )
    assert [keep_group(g, config) for g in (flat_good, flat_bad, varied, barely)] == [
        False,
        False,
        False,
        True,
    ]
    rule = DifficultyRule.from_variance(0.0, 0.0, 0.4)
    assert [rule.teaches(g) for g in (flat_good, flat_bad, varied, barely)] == [False, False, False, True]
    assert TrainConfig(env=[{"id": "x"}]).difficulty_filter.enabled is False and keep_group(
        flat_good, TrainConfig(env=[{"id": "x"}])
    )
    # a distillation that ignores the reward learns from every group: the filter (an RL config's,
    # reused) would drop a prose-answering student's all-zero groups and leave it nothing to learn
    distill = {
        "mode": "distill",
        "distill": {"teacher_model": "tiny"},
        "difficulty_filter": {"enabled": True},
    }
    groups = (flat_good, flat_bad, varied, barely)
    assert all(keep_group(g, TrainConfig(env=[{"id": "x"}], **distill)) for g in groups)
    weighted = {**distill, "distill": {"teacher_model": "tiny", "reward_weight": 0.5}}
    kept = [keep_group(g, TrainConfig(env=[{"id": "x"}], **weighted)) for g in groups]
    assert kept == [False, False, True, True]  # the reward counts: filtered as in RL
