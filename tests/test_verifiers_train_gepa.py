"""A verifiers environment, unchanged, trains with `workbench train` and optimizes with
`workbench gepa run` (issue 13): the same front doors as Workbench's own environments."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("verifiers", reason="the verifiers extra is not installed")

from tests.servers import ScriptedBackend, make_app, serve_in_thread  # noqa: E402
from tests.test_gepa import Policy, Reflection, finish, gepa_args  # noqa: E402
from tests.test_gepa import workbench as workbench_popen  # noqa: E402
from tests.test_verifiers_envs import FIXTURES, workspace_with  # noqa: E402

pytestmark = pytest.mark.slow

CONFIG = """
model = "tiny"
max_steps = 3
batch_size = 8
rollouts_per_example = 4
micro_batch_size = 4
learning_rate = 3e-3
seed = 3
[sampling]
max_tokens = 24
temperature = 1.0
[[env]]
id = "{env}"
[lora]
r = 4
alpha = 8
[checkpointing]
save_every_n_steps = 3
[wandb]
mode = "disabled"
"""

# A classic verifiers env whose reward the tiny model's answers vary on (their length), so the
# policy gradient is not zero: what proves the adapter's token ids and logprobs train the model.
LENGTHY = """
import verifiers as vf
from datasets import Dataset


def short_answer(completion) -> float:
    text = completion[-1]["content"]
    return 1.0 / (1.0 + len(text))


def load_environment():
    rows = [{"question": f"Say something about the number {i}.", "answer": ""} for i in range(8)]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[short_answer]))
"""


def train(workspace: Path, env_id: str) -> list[dict]:
    from workbench.train import run_train
    from workbench.train.config import load_train_config

    path = workspace / f"{env_id}.toml"
    path.write_text(CONFIG.format(env=env_id))
    config, _ = load_train_config(path, [])
    run_dir = run_train(config).run_dir
    assert (run_dir / "checkpoints" / "step_000003" / "adapter_model.safetensors").is_file()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_verifiers_environment_rl_trains_on_server_tokens(tmp_path: Path, tiny_model: Path, monkeypatch):
    workspace = workspace_with(tmp_path, tiny_model, "reverse_text")
    (workspace / "environments" / "lengthy").mkdir()
    (workspace / "environments" / "lengthy" / "lengthy.py").write_text(LENGTHY)
    monkeypatch.setenv("WORKBENCH_WORKSPACE", str(workspace))
    monkeypatch.chdir(workspace)

    # the vendored env, unchanged: three steps, every rollout trainable (ids + logprobs came back)
    steps = train(workspace, "reverse-text")
    assert [m["step"] for m in steps] == [1, 2, 3]
    for metrics in steps:
        assert metrics["rollout/errors"] == 0 and metrics["rollout/trained_samples"] == 8
        assert "reward/lcs_reward_func" in metrics

    # a reward the model's answers differ on: the loss and the gradient are real
    steps = train(workspace, "lengthy")
    assert all(m["rollout/trained_samples"] == 8 for m in steps)
    assert any(m["train/loss"] != 0.0 and m["train/grad_norm"] > 0.0 for m in steps), steps


def test_gepa_optimizes_a_verifiers_environment(tmp_path: Path):
    shutil.copytree(FIXTURES / "reverse_text", tmp_path / "environments" / "reverse_text")
    policy, reflection = Policy(), Reflection()
    with (
        serve_in_thread(make_app(ScriptedBackend(policy, model="policy"))) as p_url,
        serve_in_thread(make_app(ScriptedBackend(reflection, model="reflect"))) as r_url,
    ):
        args = gepa_args(p_url, r_url, "-B", "120", "--seed", "3")
        args[args.index("-n") + 1] = "10"  # the vendored table has 10 rows (train and validation overlap)
        proc = workbench_popen(*args, cwd=tmp_path)
        out, err = finish(proc)
    assert proc.returncode == 0, err
    (run_dir,) = (
        tmp_path / "environments" / "reverse_text" / "outputs" / "gepa" / "reverse-text--policy"
    ).iterdir()
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "finished" and meta["best_score"] > meta["seed_score"]
    assert (run_dir / "best_prompt.txt").read_text().count("BACKWARDS") >= 1
    assert "### lcs_reward_func" in reflection.prompts[0]  # verifiers' own reward name reached the reflection
    assert policy.requests == meta["metric_calls_used"] <= 120
