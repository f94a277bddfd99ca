"""Held-out evaluation during training on `[[eval.env]]` environments: loaded like the training
environments, each evaluated on its own eval split and logged as eval/<env>/reward_mean besides
the pooled eval/reward_mean. Runs the real evaluation function with the instant EchoClient (no model)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from workbench.envs import Parser, load_environment
from workbench.errors import UserError
from workbench.inference.echo import EchoClient
from workbench.train.distributed import SINGLE
from workbench.train.held_out import held_out_eval
from workbench.train.schema import EnvConfig, SamplingConfig, TrainConfig
from workbench.train.setup import env_names, load_eval_envs
from workbench.types import SamplingParams


class _Model:
    def eval(self) -> _Model:
        return self


POLICY = SimpleNamespace(model=_Model(), wrapped=None)  # what `held_out_eval` reads of the policy


def context(
    cfg: TrainConfig, eval_envs: list, env=None, sampling: SamplingParams | None = None
) -> SimpleNamespace:
    """What `held_out_eval` reads from a TrainContext; the EchoClient answers with the reversed prompt."""
    return SimpleNamespace(
        config=cfg,
        inference=SimpleNamespace(client=EchoClient(), server_mode=False),
        dist=SINGLE,
        eval_envs=eval_envs,
        env=env,
        sampling=sampling or SamplingParams(max_tokens=64),
    )


def config(**eval_table: object) -> TrainConfig:
    return TrainConfig(
        env=[{"id": "reverse-text"}],
        eval={"interval": 2, "num_examples": 4, "rollouts_per_example": 2, **eval_table},
    )


async def test_each_eval_env_is_logged_under_its_own_name():
    cfg = config(env=[{"id": "reverse-text", "args": {"num_eval_examples": 6}}, {"id": "alphabet-sort"}])
    targets = load_eval_envs(cfg)
    assert [t.name for t in targets] == ["reverse-text", "alphabet-sort"]
    assert len(targets[0].env.get_examples(-1, split="eval")) == 6  # the args reached load_environment
    targets[0].env.rubric.parser = Parser()  # the echo's bare reversal scores 1.0 on reverse-text
    metrics = await held_out_eval(context(cfg, targets), POLICY)
    assert set(metrics) == {
        f"eval/{env}{name}"
        for env in ("", "reverse-text/", "alphabet-sort/")
        for name in ("reward_mean", "avg@2", "pass@2")  # avg@k, pass@k: issue 34, k = rollouts_per_example
    }
    assert metrics["eval/reverse-text/reward_mean"] == 1.0
    assert metrics["eval/alphabet-sort/reward_mean"] < 1.0  # echoing is no sorting
    # the same number of rollouts from each: the pooled mean is the mean of the two
    pooled = (metrics["eval/reverse-text/reward_mean"] + metrics["eval/alphabet-sort/reward_mean"]) / 2
    assert metrics["eval/reward_mean"] == pytest.approx(pooled)


async def test_without_eval_env_the_training_envs_are_evaluated():
    cfg = config()
    assert load_eval_envs(cfg) == []
    env = load_environment("reverse-text")
    env.rubric.parser = Parser()
    assert await held_out_eval(context(cfg, [], env=env), POLICY) == {
        "eval/reward_mean": 1.0,
        "eval/avg@2": 1.0,
        "eval/pass@2": 1.0,
    }


def test_each_eval_env_samples_with_its_own_sampling_args():
    gsm8k = {"id": "gsm8k"}  # reads the GSM8K copy shipped with it
    targets = load_eval_envs(config(env=[gsm8k, {"id": "reverse-text"}]))
    assert [t.sampling.max_tokens for t in targets] == [512, 128]  # gsm8k's own, then the built-in default
    given = load_eval_envs(config(env=[gsm8k]).model_copy(update={"sampling": SamplingConfig(max_tokens=64)}))
    assert given[0].sampling.max_tokens == 64  # [sampling] over the environment's


def test_eval_envs_load_only_when_evaluating_and_fail_like_training_envs():
    assert load_eval_envs(config(interval=0, env=[{"id": "no-such-env"}])) == []  # eval off: nothing to load
    with pytest.raises(UserError, match="unknown environment 'no-such-env'"):
        load_eval_envs(config(env=[{"id": "no-such-env"}]))
    ids = [EnvConfig(id="primeintellect/alphabet-sort"), EnvConfig(id="alphabet-sort")]
    assert env_names(ids) == ["alphabet-sort-0", "alphabet-sort-1"]
    assert env_names([EnvConfig(id="primeintellect/wiki-search")]) == ["wiki-search"]
