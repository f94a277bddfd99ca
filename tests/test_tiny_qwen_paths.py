"""Every path on the real-vocabulary model (`tiny-qwen`: Qwen's BPE vocabulary, a Qwen3-style
chat template with tools and thinking): eval of a single-turn, a multi-turn and a tool env, RL
with LoRA and full fine-tuning, tokens in for multi-turn RL, branching for thinking models,
serve over HTTP = in-process, and a merged export that plain transformers loads."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import cli
from tests.marks import by_default
from tests.servers import start_process
from workbench.engine.rollouts import run_rollouts
from workbench.envs.multiturn import MultiTurnEnv
from workbench.inference.local_client import LocalClient
from workbench.inference.openai_client import OpenAIClient
from workbench.train.config import load_train_config
from workbench.train.samples import rollout_sequences
from workbench.types import Group, Messages, SamplingParams, State

pytestmark = pytest.mark.slow


def workbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WORKBENCH_WORKSPACE": str(cwd)}
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def results(workspace: Path, env_folder: str) -> list[dict[str, Any]]:
    (path,) = (workspace / "environments" / env_folder / "outputs" / "evals").glob("*/*/results.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("env_id", "folder", "args"),
    by_default(
        [
            ("reverse-text", "reverse_text", []),
            ("alphabet-sort", "alphabet_sort", ["-a", '{"min_turns": 2, "max_turns": 2}']),
            ("math-python", "math_python", ["-a", '{"max_turns": 3}']),
        ],
        ["math-python"],
        key=0,
    ),
)
def test_eval_runs_single_multi_turn_and_tool_envs(
    tiny_qwen_workspace: Path, env_id: str, folder: str, args: list[str]
) -> None:
    run = workbench(
        "eval",
        "run",
        env_id,
        "-m",
        "tiny-qwen",
        "-n",
        "2",
        "-r",
        "2",
        "-t",
        "96",
        *args,
        cwd=tiny_qwen_workspace,
    )
    assert run.returncode == 0, run.stderr + run.stdout
    assert "building" not in run.stderr  # built already (the fixture): no first-use build
    rollouts = results(tiny_qwen_workspace, folder)
    assert len(rollouts) == 4
    assert not [r["error"] for r in rollouts if r["error"] and r["error"]["where"] != "env"]
    if env_id == "alphabet-sort":
        assert max(r["num_turns"] for r in rollouts) == 2


class ToolTurns(MultiTurnEnv):
    """Three model turns; after each the environment answers as a tool would (with a tool call
    in the conversation when the model made one)."""

    def __init__(self) -> None:
        super().__init__(
            max_turns=3,
            dataset=[{"question": "Look up the capital of France.", "answer": "Paris"}],
            tool_defs=[
                {
                    "name": "lookup",
                    "description": "Look a fact up.",
                    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
                }
            ],
        )

    async def env_response(self, messages: Messages, state: State, **kwargs: Any) -> Messages:
        calls = messages[-1].get("tool_calls") or []
        if calls:
            return [{"role": "tool", "tool_call_id": c["id"], "content": lookup("Paris")} for c in calls]
        return [{"role": "user", "content": "Use the lookup tool, please."}]


def lookup(query: str) -> str:
    """Look a fact up."""
    return f"{query}: capital of France"


async def test_a_three_turn_tool_rollout_trains_on_exactly_the_sampled_tokens(tiny_qwen_model: Path) -> None:
    """Tokens in on the real vocabulary: the masked tokens are the model's turns and the rest the
    environment's, and no turn was re-tokenized (each turn's prompt extends the previous one)."""
    client = LocalClient(tiny_qwen_model, model_name="tiny-qwen")
    client.tokens_in = True
    env = ToolTurns()
    groups: list[Group] = []
    try:
        await run_rollouts(
            env,
            client,
            env.get_examples(1, split="train"),
            rollouts_per_example=4,
            on_group=groups.append,
            sampling=SamplingParams(temperature=0.7, max_tokens=256, seed=5),
        )
    finally:
        await client.close()
    tokenizer = client.tokenizer
    three = [r for r in groups[0].rollouts if len(r.turn_tokens) == 3]
    assert three, [r.stop_condition for r in groups[0].rollouts]
    for rollout in three:
        (sample,) = rollout_sequences(rollout, "interleaved")
        assert sample.completion_mask is not None
        model_ids = [t for t, m in zip(sample.completion_ids, sample.completion_mask) if m]
        env_ids = [t for t, m in zip(sample.completion_ids, sample.completion_mask) if not m]
        assert model_ids == [t for turn in rollout.turn_tokens for t in turn.completion_ids]
        env_text = tokenizer.decode(env_ids)
        assert env_text.count("<|im_start|>assistant\n") == 2 and "<|im_start|>user" in env_text
        assert "<|im_start|>" not in tokenizer.decode(model_ids)  # the model's tokens hold no env header
        for before, after in zip(rollout.turn_tokens, rollout.turn_tokens[1:]):
            assert (
                after.prompt_ids[: len(before.prompt_ids) + len(before.completion_ids)]
                == before.prompt_ids + before.completion_ids
            )


TRAIN = """
model = "tiny-qwen"
max_steps = {steps}
batch_size = 4
rollouts_per_example = 2
micro_batch_size = 2
learning_rate = 1e-3
seed = 1
{extra}
[sampling]
max_tokens = 48
[[env]]
id = "alphabet-sort"
args = {{ min_turns = 2, max_turns = 2 }}
[wandb]
mode = "disabled"
"""


def train(workspace: Path, name: str, steps: int, extra: str = "", *overrides: str):
    from workbench.train import run_train

    path = workspace / f"{name}.toml"
    path.write_text(TRAIN.format(steps=steps, extra=extra))
    config, _ = load_train_config(path, [f"output_dir='runs/{name}'", *overrides])
    return run_train(config)


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("lora", by_default([True, False], [True]), ids=["lora", "full"])
def test_three_rl_steps_on_a_multi_turn_env(tiny_qwen_workspace: Path, lora: bool) -> None:
    result = train(tiny_qwen_workspace, f"mt-{lora}", 3, "", f"lora.enabled={str(lora).lower()}")
    rows = metrics(result.run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["rollout/trained_samples"] == 4 for r in rows)  # interleaved: one sample per rollout
    assert any(r["train/grad_norm"] > 0 for r in rows)


def test_branching_trains_one_sample_per_turn_of_a_thinking_model(tiny_qwen_workspace: Path) -> None:
    extra = (
        '[orchestrator]\ntrajectory_strategy = "branching"\n[inference.model]\nreasoning_parser = "qwen3"\n'
    )
    path = tiny_qwen_workspace / "think.toml"
    path.write_text(TRAIN.format(steps=2, extra="") + extra)
    dry = workbench("train", str(path), "--dry-run", cwd=tiny_qwen_workspace)
    assert dry.returncode == 0, dry.stderr + dry.stdout
    assert "branching: one sample per model turn" in dry.stdout
    run = workbench("train", str(path), "--set", "output_dir='runs/think'", cwd=tiny_qwen_workspace)
    assert run.returncode == 0, run.stderr + run.stdout
    rows = metrics(tiny_qwen_workspace / "runs" / "think")
    assert len(rows) == 2
    # two model turns per rollout unless one ended early (cut by max_tokens): > 1 sample each
    assert all(r["rollout/samples_per_rollout"] > 1 for r in rows)


async def test_serve_over_http_gives_the_in_process_token_ids(tiny_qwen_model: Path) -> None:
    messages = [{"role": "user", "content": "Reverse: green apple"}]
    sampling = SamplingParams(temperature=1.0, max_tokens=40, seed=11)
    local = LocalClient(tiny_qwen_model, model_name="tiny-qwen")
    try:
        expected = (await local.chat(messages, sampling=sampling))[0]
    finally:
        await local.close()
    server = start_process(
        ["-m", "workbench", "serve", str(tiny_qwen_model), "--served-model-name", "tiny-qwen", "--port", "0"]
    )
    client = OpenAIClient(server.base_url, "tiny-qwen", return_tokens=True)
    try:
        served = (await client.chat(messages, sampling=sampling))[0]
    finally:
        await client.close()
        server.stop()
    assert served.tokens is not None and expected.tokens is not None
    assert served.tokens.prompt_ids == expected.tokens.prompt_ids
    assert served.tokens.completion_ids == expected.tokens.completion_ids
    assert served.message.get("content") == expected.message.get("content")
    assert served.message.get("reasoning_content") == expected.message.get("reasoning_content")


@pytest.mark.extended
def test_merged_export_loads_with_plain_transformers(tiny_qwen_workspace: Path) -> None:
    result = train(tiny_qwen_workspace, "export", 1)
    export = workbench(
        "train", "export", str(result.run_dir), "--step", "1", "--merge", cwd=tiny_qwen_workspace
    )
    assert export.returncode == 0, export.stderr
    merged = result.run_dir / "exports" / "step_000001-merged"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert AutoModelForCausalLM.from_pretrained(merged).config.model_type == "qwen3"
    tokenizer = AutoTokenizer.from_pretrained(merged)
    text = 'Thinking <think>ok</think> and a tool call <tool_call>{"name": "x"}</tool_call> · 中文 ✓\n\n  end'
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 151645


def test_thinking_is_split_from_the_answer_in_process(tiny_qwen_model: Path) -> None:
    async def generate() -> list[Any]:
        client = LocalClient(tiny_qwen_model, model_name="tiny-qwen")
        try:
            return await client.chat(
                [{"role": "user", "content": "Reverse the text: winter"}],
                sampling=SamplingParams(temperature=1.0, max_tokens=64, n=8, seed=2),
            )
        finally:
            await client.close()

    completions = asyncio.run(generate())
    split = [c for c in completions if c.message.get("reasoning_content")]
    assert split, [c.message for c in completions]
    assert all("<think>" not in (c.message.get("content") or "") for c in split)
