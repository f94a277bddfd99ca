"""avg@k and pass@k (issue 34): avg@k is the mean over examples of the mean reward of their k
rollouts; pass@k the chance that at least one of k rollouts of an example is correct (reward >=
the environment's pass_threshold, verifiers' rule; 0.5 by default): for k = n, the share of
examples with a correct rollout. In `eval run`'s summary and printed table, and in training's
held-out evaluation (eval/avg@k, eval/pass@k, eval/<env>/...)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import cli
from tests.test_eval_run import cli_env
from tests.test_train_online_eval import POLICY, config, context
from workbench.engine.summary import at_k_totals, pass_at_k, summarize
from workbench.envs import Parser, load_environment
from workbench.train.held_out import held_out_eval
from workbench.train.setup import load_eval_envs
from workbench.types import Group, Rollout


def group(example_id: int, *rewards: float) -> Group:
    return Group(
        example_id,
        [
            Rollout(example_id=example_id, rollout_index=i, prompt=[], completion=[], reward=reward)
            for i, reward in enumerate(rewards)
        ],
    )


GROUPS = [
    group(0, 1.0, 0.0, 0.0, 0.0),  # one correct of 4
    group(1, 0.0, 0.0, 0.0, 0.0),  # none
    group(2, 0.6, 0.5, 0.9, 0.7),  # all correct (>= 0.5), none of them 1
    group(3, 0.49, 0.2, 0.0, 0.3),  # close, but none correct
]


def test_avg_and_pass_at_k_by_hand():
    summary = summarize(GROUPS)
    assert summary["avg_at_k"] == {"avg@4": pytest.approx((0.25 + 0.0 + 0.675 + 0.2475) / 4)}
    assert summary["pass_threshold"] == 0.5
    # pass@1: the share of correct rollouts (5 of 16); pass@4: examples with a correct rollout (2 of 4)
    assert summary["pass_at_k"]["pass@1"] == pytest.approx(5 / 16)
    assert summary["pass_at_k"]["pass@4"] == pytest.approx(2 / 4)
    # pass@2 of one correct in 4: 1 - C(3,2)/C(4,2) = 1/2
    assert summary["pass_at_k"]["pass@2"] == pytest.approx((0.5 + 0 + 1 + 0) / 4)
    strict = summarize(GROUPS, pass_threshold=1.0)  # an environment that only counts full marks
    assert strict["pass_at_k"]["pass@4"] == pytest.approx(1 / 4) and strict["pass_threshold"] == 1.0
    assert at_k_totals(GROUPS, 4, 0.5) == pytest.approx([1.1725, 4, 2.0, 4])


def test_k_is_every_power_of_two_and_the_group_size_and_short_groups_are_left_out():
    groups = [group(0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0), group(1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), group(2, 0.0)]
    summary = summarize(groups)
    assert list(summary["pass_at_k"]) == ["pass@1", "pass@2", "pass@4", "pass@6"]
    # the 1-rollout group counts for pass@1 only: 6 tries of it would not all fail for sure
    assert summary["pass_at_k"]["pass@6"] == pytest.approx(1 / 2)
    assert summary["pass_at_k"]["pass@1"] == pytest.approx((1 / 6 + 0 + 0) / 3)
    with pytest.raises(ValueError, match="pass@4 needs at least 4 samples"):
        pass_at_k(1, 0, 4)


# An environment whose reward spreads over [0, 1) with the sampled text (a checksum of it), and
# whose pass_threshold is 0.7 rather than the default 0.5: the summary must cut where it says.
GRADED_ENV = """
import zlib

from workbench.envs import Rubric, SingleTurnEnv


def spread(completion) -> float:
    return zlib.crc32(str(completion).encode()) % 1000 / 1000


def load_environment() -> SingleTurnEnv:
    rows = [{"question": f"say something about {i}", "answer": ""} for i in range(8)]
    return SingleTurnEnv(dataset=rows, eval_dataset=rows, rubric=Rubric([spread]), pass_threshold=0.7)
"""


def test_eval_run_prints_and_saves_avg_and_pass_at_k_at_the_envs_threshold(tiny_workspace: Path):
    package = tiny_workspace / "environments" / "graded"
    package.mkdir(parents=True)
    (package / "graded.py").write_text(GRADED_ENV)
    args = ["eval", "run", "graded", "-m", "tiny", "-n", "6", "-r", "4", "-t", "12", "--seed", "3"]
    done = workbench(*args, cwd=tiny_workspace)
    assert done.returncode == 0, done.stderr
    (run_dir,) = (package / "outputs" / "evals").glob("*/*")
    summary = json.loads((run_dir / "metadata.json").read_text())["summary"]
    rewards: dict[int, list[float]] = {}
    for line in (run_dir / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        rewards.setdefault(record["example_id"], []).append(record["reward"])
    assert len(rewards) == 6 and all(len(r) == 4 for r in rewards.values())
    assert summary["pass_threshold"] == 0.7
    assert summary["avg_at_k"]["avg@4"] == pytest.approx(sum(sum(r) / 4 for r in rewards.values()) / 6)
    shares = {
        "pass@1": sum(x >= 0.7 for r in rewards.values() for x in r) / 24,
        "pass@4": sum(any(x >= 0.7 for x in r) for r in rewards.values()) / 6,
    }
    for name, share in shares.items():
        assert summary["pass_at_k"][name] == pytest.approx(share), name
    assert 0 < shares["pass@1"] < shares["pass@4"] < 1  # the rewards straddle the cut
    out = " ".join(done.stdout.split())
    assert f"avg@4 {summary['avg_at_k']['avg@4']:.4f}" in out
    assert f"pass@1 {shares['pass@1']:.4f} (correct: reward >= 0.7)" in out
    shown = " ".join(workbench("eval", "show", str(run_dir), cwd=tiny_workspace).stdout.split())
    assert f"pass@4 {shares['pass@4']:.4f}" in shown


def workbench(*args: str, cwd: Path):
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


async def test_held_out_eval_logs_avg_and_pass_at_k_with_the_envs_threshold():
    """The EchoClient's bare reversal scores 1.0 on reverse-text with a plain parser: avg@2 = 1.
    With a pass_threshold above 1 no rollout is correct: pass@2 = 0 — the environment's cut counts."""
    cfg = config(env=[{"id": "reverse-text"}, {"id": "alphabet-sort"}])
    targets = load_eval_envs(cfg)
    targets[0].env.rubric.parser = Parser()
    targets[1].env.pass_threshold = -1.0  # every rollout counts as correct, whatever it scored
    metrics = await held_out_eval(context(cfg, targets), POLICY)
    assert metrics["eval/reverse-text/avg@2"] == 1.0 and metrics["eval/reverse-text/pass@2"] == 1.0
    assert metrics["eval/alphabet-sort/avg@2"] == pytest.approx(metrics["eval/alphabet-sort/reward_mean"])
    assert metrics["eval/alphabet-sort/pass@2"] == 1.0
    assert metrics["eval/avg@2"] == pytest.approx((1.0 + metrics["eval/alphabet-sort/avg@2"]) / 2)
    assert metrics["eval/pass@2"] == 1.0
    env = load_environment("reverse-text")
    env.rubric.parser = Parser()
    env.pass_threshold = 1.5
    plain = await held_out_eval(context(config(), [], env=env), POLICY)
    assert plain == {"eval/reward_mean": 1.0, "eval/avg@2": 1.0, "eval/pass@2": 0.0}
