"""Environments written for `verifiers.v1` run unchanged: real v1 packages from the verifiers
repository (tests/fixtures/verifiers_envs/v1/, see ORIGIN.md: only a hub dataset swapped for an
in-memory table) go through `workbench eval run NAME -m tiny`, each rollout one v1 episode run by
verifiers' own code (its harness program, interception server and scoring) against the tiny
model, and come back as ordinary Workbench rollouts."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1", reason="the verifiers extra (with verifiers.v1) is not installed")

from tests.marks import by_default  # noqa: E402
from tests.test_verifiers_envs import workbench  # noqa: E402 - the same CLI runner

FIXTURES = Path(__file__).parent / "fixtures" / "verifiers_envs" / "v1"

# env -> the reward function its task declares (weight 1)
ENVS = {"reverse_text": "lcs", "glossary": "looked_up"}


def workspace_with(tmp_path: Path, tiny_model: Path, name: str | None = None) -> Path:
    """A workspace with the tiny model and, when named, the vendored package (upstream layout)."""
    (tmp_path / "environments").mkdir(parents=True)
    if name is not None:
        shutil.copytree(FIXTURES / name, tmp_path / "environments" / name)
    (tmp_path / "outputs" / "models").mkdir(parents=True)
    (tmp_path / "outputs" / "models" / "tiny").symlink_to(tiny_model)
    return tmp_path


def records(workspace: Path, name: str) -> list[dict]:
    (run_dir,) = sorted((workspace / "environments" / name / "outputs" / "evals").glob("*/*"))
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "finished"
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", by_default(sorted(ENVS), ["glossary"]))  # reverse_text: -m ''
def test_a_v1_environment_runs_unchanged(name: str, tmp_path: Path, tiny_model: Path):
    workspace = workspace_with(tmp_path, tiny_model, name)
    result = workbench(
        "eval", "run", name.replace("_", "-"), "-m", "tiny", "-n", "2", "-r", "2", "-t", "24", cwd=workspace
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = records(workspace, name)
    assert sorted((r["example_id"], r["rollout_index"]) for r in lines) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for record in lines:
        assert record["error"] is None, record["error"]
        assert record["prompt"][-1]["role"] == "user"  # the task's own prompt
        assert record["completion"] and record["completion"][0]["role"] == "assistant"
        assert ENVS[name] in record["rewards"], (record["rewards"], record["metrics"])
        assert 0.0 <= record["rewards"][ENVS[name]] <= 1.0
        assert record["reward"] == pytest.approx(record["rewards"][ENVS[name]])
        assert record["num_turns"] >= 1 and record["stop_condition"]
        assert record["usage"]["completion_tokens"] > 0
    assert {r["answer"] for r in lines if r["example_id"] == 0}  # the task's answer field


@pytest.fixture
def forget_env_packages() -> Iterator[None]:
    """The vendored packages a test imports in this process leave `sys.modules` with it: a later
    test in this worker that loads an env of the same name (the bundled reverse-text) must find
    its own, not this v1 package cached under that name."""
    yield
    for name in [m for m in sys.modules if m.split(".")[0] in ENVS]:
        del sys.modules[name]


def test_v1_rollouts_carry_token_ids_and_logprobs_for_training(
    tiny_model: Path, tmp_path: Path, monkeypatch, forget_env_packages: None
):
    """What RL needs: the ids and sampled logprobs of each model call of the episode."""
    import asyncio

    from workbench.envs.loader import load_environment
    from workbench.inference.resolve import make_client
    from workbench.types import SamplingParams

    workspace = workspace_with(tmp_path, tiny_model, "reverse_text")
    monkeypatch.setenv("WORKBENCH_WORKSPACE", str(workspace))
    # Loading a v1 package puts its folder on PYTHONPATH (for its tool servers): restored after
    # this test, or every later CLI test in this process would find this package's reverse_text.
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.chdir(workspace)
    env = load_environment("reverse-text")
    example = env.get_examples(1, split="train")[0]

    async def one() -> object:
        client = make_client("tiny")
        try:
            return await env.rollout(client, example, SamplingParams(max_tokens=16, seed=1))
        finally:
            await client.close()

    output = asyncio.run(one())
    assert output.error is None, output.error  # type: ignore[attr-defined]
    tokens = output.tokens  # type: ignore[attr-defined]
    assert tokens is not None and tokens.prompt_ids and tokens.completion_ids
    assert len(tokens.completion_logprobs) == len(tokens.completion_ids)
    assert output.usage["completion_tokens"] == len(tokens.completion_ids)  # type: ignore[attr-defined]


# A v1 package written here (verifiers' layout: <name>/<name>/__init__.py exporting the Taskset):
# task 0's reward function raises, task 1's setup hook raises, task 2 is sound.
BROKEN = """
import verifiers.v1 as vf


class Data(vf.TaskData):
    answer: str


class FragileTask(vf.Task[Data]):
    async def setup(self, trace, runtime) -> None:
        if self.data.idx == 1:
            raise RuntimeError("the setup's own bug")

    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def fragile(self, trace: vf.Trace) -> float:
        if self.data.idx == 0:
            raise ZeroDivisionError("the reward's own bug")
        return 1.0


class FragileTaskset(vf.Taskset[FragileTask, vf.TasksetConfig]):
    def load(self) -> list[FragileTask]:
        return [FragileTask(Data(idx=i, prompt=f"say {i}", answer=str(i)), self.config.task) for i in range(3)]


__all__ = ["FragileTaskset"]
"""


def test_v1_faults_are_recorded_on_their_rollouts_and_the_run_goes_on(tmp_path: Path, tiny_model: Path):
    workspace = workspace_with(tmp_path, tiny_model)
    package = workspace / "environments" / "fragile" / "fragile"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(BROKEN)
    result = workbench("eval", "run", "fragile", "-m", "tiny", "-n", "3", "-r", "1", "-t", "8", cwd=workspace)
    assert result.returncode == 0, result.stdout + result.stderr  # the env's bugs are data: the run goes on
    by_example = {r["example_id"]: r for r in records(workspace, "fragile")}
    assert sorted(by_example) == [0, 1, 2]

    reward_bug = by_example[0]["error"]
    assert reward_bug["where"] == "reward" and "the reward's own bug" in reward_bug["message"]
    assert by_example[0]["reward"] == 0.0 and by_example[0]["completion"]  # the episode itself ran

    setup_bug = by_example[1]["error"]
    assert setup_bug["where"] == "env" and "the setup's own bug" in setup_bug["message"]
    assert not reward_bug["infrastructure"] and not setup_bug["infrastructure"]

    assert by_example[2]["error"] is None and by_example[2]["reward"] == 1.0
    assert by_example[2]["rewards"] == {"fragile": 1.0}
