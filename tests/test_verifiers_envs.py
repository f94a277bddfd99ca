"""Environments written for `verifiers` run unchanged (issue 13): real environments from the
verifiers repository (tests/fixtures/verifiers_envs/, see its ORIGIN.md: only hub datasets
swapped for in-memory tables) go through `workbench eval run NAME -m tiny`, their rollouts run by
verifiers' own code against the tiny model, and come back as ordinary Workbench rollouts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers", reason="the verifiers extra is not installed")

from tests import cli
from tests.marks import by_default
from tests.servers import EchoBackend, make_app, serve_in_thread  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "verifiers_envs"

# env -> (a reward or metric name verifiers' rubric reports, whether the model is offered tools)
ENVS = {
    "reverse_text": "lcs_reward_func",
    "gsm8k": "correct_answer",
    "alphabet_sort": "weighted_reward",
    "doublecheck": "correct_answer",
    "tool_test": "tool_call_reward_func",
    "continuation_quality": "grade_reward",
    "math_group": "format_reward_func",
    "example_stateful_tool_env": "offset_tool_calls",
}


def workspace_with(tmp_path: Path, tiny_model: Path, name: str) -> Path:
    """A workspace holding the vendored env (it wins over a bundled env of the same name)."""
    shutil.copytree(FIXTURES / name, tmp_path / "environments" / name)
    (tmp_path / "outputs" / "models").mkdir(parents=True)
    (tmp_path / "outputs" / "models" / "tiny").symlink_to(tiny_model)
    return tmp_path


def workbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_WORKSPACE"}
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def runs(workspace: Path, name: str) -> list[Path]:
    return sorted((workspace / "environments" / name / "outputs" / "evals").glob("*/*"))


@pytest.mark.parametrize("name", by_default(sorted(ENVS), ["reverse_text", "alphabet_sort", "tool_test"]))
def test_a_verifiers_environment_runs_unchanged(name: str, tmp_path: Path, tiny_model: Path):
    workspace = workspace_with(tmp_path, tiny_model, name)
    env_id = name.replace("_", "-")
    with serve_in_thread(make_app(EchoBackend("judge"))) as judge:  # continuation_quality's judge, over HTTP
        args = ["eval", "run", env_id, "-m", "tiny", "-n", "2", "-r", "2", "-t", "24"]
        if name == "continuation_quality":
            os.environ.setdefault("WB_TEST_JUDGE_KEY", "not-a-secret")
            args += [
                "-a",
                json.dumps(
                    {
                        "judge_base_url": f"{judge}/v1",
                        "judge_model": "judge",
                        "judge_api_key_var": "WB_TEST_JUDGE_KEY",
                    }
                ),
            ]
        result = workbench(*args, cwd=workspace)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "may cause unexpected behavior" not in result.stderr  # verifiers' disabled logging stays silent
    (run_dir,) = runs(workspace, name)
    lines = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted((r["example_id"], r["rollout_index"]) for r in lines) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for record in lines:
        assert record["error"] is None, record["error"]
        assert record["completion"] and record["completion"][0]["role"] == "assistant"
        assert isinstance(record["completion"][0]["content"], str)
        assert ENVS[name] in {**record["rewards"], **record["metrics"]}, (
            record["rewards"],
            record["metrics"],
        )
        assert record["num_turns"] >= 1 and record["stop_condition"]
        assert record["usage"]["completion_tokens"] > 0
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "finished" and meta["summary"]["num_groups"] == 2


def test_rollouts_carry_token_ids_and_logprobs_for_training(tiny_model: Path, tmp_path: Path, monkeypatch):
    """What RL needs: the ids and sampled logprobs verifiers read back from the server."""
    import asyncio

    from workbench.envs.loader import load_environment
    from workbench.inference.resolve import make_client
    from workbench.types import SamplingParams

    workspace = workspace_with(tmp_path, tiny_model, "alphabet_sort")  # multi-turn: env turns are masked
    monkeypatch.setenv("WORKBENCH_WORKSPACE", str(workspace))
    monkeypatch.chdir(workspace)
    env = load_environment("alphabet-sort")
    example = env.get_examples(1, split="train")[0]

    async def one() -> object:
        client = make_client("tiny")
        try:
            return await env.rollout(client, example, SamplingParams(max_tokens=16, seed=1))
        finally:
            await client.close()

    output = asyncio.run(one())
    tokens = output.tokens  # type: ignore[attr-defined]
    assert tokens is not None and tokens.prompt_ids and tokens.completion_ids
    assert len(tokens.completion_logprobs) == len(tokens.completion_ids)
    assert tokens.completion_mask is not None and 0 < sum(tokens.completion_mask) <= len(
        tokens.completion_ids
    )


BROKEN = """
import verifiers as vf
from datasets import Dataset


class Broken(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        raise RuntimeError("the env's own bug")


def load_environment(fail_on_load: bool = False):
    if fail_on_load:
        raise ValueError("cannot build")
    rows = [{"question": f"q{i}", "answer": "a"} for i in range(3)]
    return Broken(dataset=Dataset.from_list(rows), max_turns=3, rubric=vf.Rubric(funcs=[lambda completion: 1.0]))
"""


def test_env_faults_are_one_line_or_recorded_on_the_rollout(tmp_path: Path, tiny_model: Path):
    (tmp_path / "environments" / "broken").mkdir(parents=True)
    (tmp_path / "environments" / "broken" / "broken.py").write_text(BROKEN)
    (tmp_path / "outputs" / "models").mkdir(parents=True)
    (tmp_path / "outputs" / "models" / "tiny").symlink_to(tiny_model)
    loading = workbench("eval", "run", "broken", "-m", "tiny", "-a", '{"fail_on_load": true}', cwd=tmp_path)
    lines = [line for line in loading.stderr.splitlines() if line.strip()]
    assert (
        loading.returncode == 1
        and lines == [lines[0]]
        and "failed to load: ValueError: cannot build" in lines[0]
    )

    result = workbench("eval", "run", "broken", "-m", "tiny", "-n", "2", "-r", "2", "-t", "8", cwd=tmp_path)
    assert result.returncode == 0, result.stderr  # the env's bug is data: the run goes on
    (run_dir,) = runs(tmp_path, "broken")
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert len(records) == 4
    assert all(r["error"]["where"] == "env" and "the env's own bug" in r["error"]["message"] for r in records)
    assert not any(r["error"]["infrastructure"] for r in records)


CRASHING_REWARD = """
import verifiers as vf
from datasets import Dataset


def exact(completion, answer) -> float:
    return 1.0


def crashes_on_second(completion, info) -> float:
    if info["i"] == 1:
        raise ZeroDivisionError("the reward's own bug")
    return 1.0


def load_environment():
    rows = [{"question": f"q{i}", "answer": "a", "info": {"i": i}} for i in range(2)]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[exact, crashes_on_second]))
"""


def test_a_crashing_reward_function_is_recorded_on_its_rollout(tmp_path: Path, tiny_model: Path):
    """verifiers logs a raising reward function and scores it 0; Workbench keeps the error."""
    (tmp_path / "environments" / "crashing").mkdir(parents=True)
    (tmp_path / "environments" / "crashing" / "crashing.py").write_text(CRASHING_REWARD)
    (tmp_path / "outputs" / "models").mkdir(parents=True)
    (tmp_path / "outputs" / "models" / "tiny").symlink_to(tiny_model)
    result = workbench("eval", "run", "crashing", "-m", "tiny", "-n", "2", "-r", "2", "-t", "8", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (run_dir,) = runs(tmp_path, "crashing")
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    by_example = {i: [r for r in records if r["example_id"] == i] for i in (0, 1)}
    assert all(r["error"] is None and r["reward"] == 2.0 for r in by_example[0])
    for record in by_example[1]:
        assert record["error"]["where"] == "reward" and "the reward's own bug" in record["error"]["message"]
        assert "crashes_on_second" in record["error"]["message"] and record["reward"] == 0.0
        assert record["rewards"]["exact"] == 1.0


def test_without_verifiers_installed_one_line_says_how(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from workbench.envs.loader import load_environment
    from workbench.errors import UserError

    shutil.copytree(FIXTURES / "tool_test", tmp_path / "environments" / "tool_test")
    monkeypatch.setenv("WORKBENCH_WORKSPACE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "verifiers", None)  # as if it were not installed
    with pytest.raises(
        UserError,
        match=r"written for verifiers, which is not installed: pip install 'workbench\[verifiers\]'",
    ):
        load_environment("tool-test")
