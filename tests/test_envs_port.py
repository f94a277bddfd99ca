"""A verifiers environment ports to Workbench by changing its import (`import workbench.envs as vf`):
message objects with attribute access, `@vf.stop`/`@vf.cleanup`, `state["trajectory"]`,
`StatefulToolEnv`, `datasets.Dataset` datasets, verifiers' constructor arguments, package-layout
env folders; and real vendored environments, ported by their import lines alone, run on
Workbench's own engine with `verifiers` made unimportable."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import workbench.envs as vf
from tests import cli
from tests.marks import by_default
from tests.ported_envs import blocked_verifiers, calls, port_fixture, say
from workbench.envs.messages import as_message, plain_messages
from workbench.types import Completion, SamplingParams

REPO = Path(__file__).resolve().parents[1]


class ScriptedClient:
    """Answers with the given assistant messages in order; records what it was sent."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = list(messages)
        self.calls: list[tuple[list[dict[str, Any]], Any]] = []

    async def chat(self, messages, *, sampling, tools=None):
        self.calls.append((messages, tools))
        message = self.messages.pop(0)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return [Completion(message=message, finish_reason=finish, prompt_tokens=1, completion_tokens=1)]

    async def close(self) -> None:
        pass


async def run_one(env: vf.Environment, replies: list[dict[str, Any]], index: int = 0):
    client = ScriptedClient(replies)
    example = env.get_examples(index + 1)[index]
    return await env.rollout(client, example, SamplingParams()), client, example


# ----- messages ------------------------------------------------------------------------------
def test_messages_are_dicts_with_attribute_access():
    user = vf.UserMessage(content="hi")
    assert user == {"role": "user", "content": "hi"} and isinstance(user, dict)
    assert user.content == user["content"] == "hi" and user.role == "user"
    assert json.dumps(user) == '{"role": "user", "content": "hi"}'
    with pytest.raises(AttributeError):
        _ = user.tool_calls  # a user message has no tool calls, as on verifiers' models
    with pytest.raises(ValueError, match="role 'user'"):
        vf.UserMessage(role="assistant", content="x")

    plain_answer = as_message({"role": "assistant", "content": "42"})
    assert isinstance(plain_answer, vf.AssistantMessage) and plain_answer.tool_calls is None
    flat = vf.AssistantMessage(
        content=None, tool_calls=[vf.ToolCall(id="c1", name="add", arguments={"a": 1})]
    )
    call = flat.tool_calls[0]
    assert (call.id, call.name, call.arguments, call["name"]) == ("c1", "add", '{"a": 1}', "add")
    assert call == {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    wire = as_message({"role": "assistant", "content": "", "tool_calls": [dict(call)]})
    assert wire.tool_calls[0].name == "add"

    tool = vf.ToolMessage(content="3", tool_call_id="c1")
    tool.content = "4"
    assert tool["content"] == "4"
    for clone in (copy.deepcopy(flat), pickle.loads(pickle.dumps(flat))):
        assert (
            type(clone) is vf.AssistantMessage and type(clone.tool_calls[0]) is vf.ToolCall and clone == flat
        )
    (back,) = plain_messages([flat])
    assert type(back) is dict and type(back["tool_calls"][0]) is dict and back == flat


# ----- multi-turn: @stop, @cleanup, trajectory, setup_state, env_response forms --------------
class Quiz(vf.MultiTurnEnv):
    """Asks 'again?' until the model says 'done' or a checked turn count is reached."""

    seen: list[str]

    async def setup_state(self, state: vf.State, **kwargs: Any) -> vf.State:
        state = await super().setup_state(state, **kwargs)
        state["asked"] = 0
        return state

    @vf.stop
    async def said_done(self, state: vf.State) -> bool:
        return state["trajectory"][-1]["completion"][-1].content == "done" if state["trajectory"] else False

    @vf.stop(priority=-1)
    def after_builtins(self, state: vf.State) -> bool:  # sync, checked after max_turns
        return len(state["trajectory"]) >= 2

    @vf.cleanup
    async def record(self, state: vf.State) -> None:
        state["cleaned_after_turns"] = len(state["trajectory"])

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        self.seen = [m.content for m in messages]  # attribute access on every message handed over
        state["asked"] += 1
        return [vf.UserMessage(content="again?")]


async def test_stop_condition_names_the_stop_and_cleanup_runs():
    env = Quiz(dataset=[{"question": "go"}], system_prompt="sys", max_turns=5)
    out, client, _ = await run_one(env, [say("no"), say("done"), say("never")])
    assert out.stop_condition == "said_done" and out.state["stop_condition"] == "said_done"
    assert out.num_turns == 2 and out.state["asked"] == 1 and out.state["cleaned_after_turns"] == 2
    assert env.seen == ["sys", "go", "no"]
    assert out.state["prompt"][0].role == "system"
    first, second = out.state["trajectory"]
    assert [m.content for m in first["prompt"]] == ["sys", "go"] and first["completion"][0].content == "no"
    assert [m["content"] for m in second["prompt"]] == ["sys", "go", "no", "again?"]
    assert (
        second["response"].finish_reason == "stop" and second["trajectory_id"] == out.state["trajectory_id"]
    )
    assert all(type(m) is dict for sent, _ in client.calls for m in sent)  # clients get plain dicts
    assert all(type(m) is dict for m in out.completion)  # so do records
    assert [m["content"] for m in out.completion] == ["no", "again?", "done"]


async def test_stop_priority_orders_against_max_turns():
    env = Quiz(dataset=[{"question": "go"}], max_turns=2)
    out, _, _ = await run_one(env, [say("a"), say("b")])
    assert out.stop_condition == "max_turns"  # priority -1 comes after the built-in max_turns
    env = Quiz(dataset=[{"question": "go"}], max_turns=3)
    out, _, _ = await run_one(env, [say("a"), say("b")])
    assert out.stop_condition == "after_builtins" and out.num_turns == 2


async def test_rewards_read_messages_by_attribute():
    def last_is_yes(completion: vf.Messages, prompt: vf.Messages) -> float:
        return float(completion[-1].content == "yes" and prompt[-1].role == "user")

    env = vf.SingleTurnEnv(dataset=[{"question": "ok?"}], rubric=vf.Rubric(funcs=[last_is_yes]))
    example = env.get_examples(1)[0]
    outs = [(await run_one(env, [say(text)]))[0] for text in ("yes", "no")]
    scores = await env.score_group(example, outs)
    assert [s.reward for s in scores] == [1.0, 0.0] and all(s.error is None for s in scores)


async def test_env_response_old_tuple_form_final_response_and_returned_state():
    class Old(vf.MultiTurnEnv):
        def setup_state(self, state):  # returns a new dict: it becomes the state
            return {**state, "fresh": True}

        async def env_response(self, messages, state):
            if len(state["trajectory"]) == 2:
                state["final_env_response"] = [{"role": "user", "content": "bye"}]
            return [{"role": "user", "content": "more"}], {**state, "replied": True}

    env = Old(dataset=[{"question": "go"}], max_turns=5)
    out, _, _ = await run_one(env, [say("1"), say("2"), say("3")])
    assert out.state["fresh"] and out.state["replied"]
    assert out.stop_condition == "has_final_env_response" and out.num_turns == 2
    assert [m["content"] for m in out.completion] == ["1", "more", "2", "bye"]


async def test_timeout_and_unlimited_turns():
    import asyncio

    class Slow(ScriptedClient):
        async def chat(self, messages, *, sampling, tools=None):
            if len(messages) > 4:
                await asyncio.Event().wait()  # never answers: only the env's timeout ends this
            return await super().chat(messages, sampling=sampling, tools=tools)

    class Chatty(vf.MultiTurnEnv):
        async def env_response(self, messages, state):
            return [vf.UserMessage(content="more")]

    env = Chatty(dataset=[{"question": "go"}], max_turns=-1, timeout_seconds=0.05)
    out = await env.rollout(Slow([say("a")] * 5), env.get_examples(1)[0], SamplingParams())
    assert out.stop_condition == "timeout_reached" and out.num_turns == 2 and out.state["timed_out"]
    with pytest.raises(ValueError, match="max_turns"):
        Chatty(dataset=[{"question": "go"}], max_turns=0)


# ----- tools ---------------------------------------------------------------------------------
def offset_tool(x: int, offset: int) -> int:
    """Add an offset to x.

    Args:
        x: the number
        offset: how much to add
    """
    return x + offset


class Offsetting(vf.StatefulToolEnv):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_tool(offset_tool, args_to_skip=["offset"])

    async def setup_state(self, state, **kwargs):
        state = await super().setup_state(state, **kwargs)
        state["offset"] = 10
        state["updates"] = []
        return state

    def update_tool_args(self, tool_name, tool_args, messages, state, **kwargs):
        state["updates"].append((tool_name, dict(tool_args), messages[-1].tool_calls[0].name))
        return {**tool_args, "offset": state["offset"]}


async def test_stateful_tool_env_hides_skipped_args_and_injects_them():
    env = Offsetting(dataset=[{"question": "add"}], max_turns=4)
    (schema,) = env.oai_tools
    assert list(schema["function"]["parameters"]["properties"]) == ["x"]
    assert schema["function"]["parameters"]["required"] == ["x"]
    assert env.skipped_args == {"offset_tool": ["offset"]} and env.tools == [offset_tool]
    out, client, _ = await run_one(env, [calls(("offset_tool", {"x": 5})), say("15")])
    assert out.state["updates"] == [("offset_tool", {"x": 5}, "offset_tool")]
    assert out.completion[1] == {"role": "tool", "tool_call_id": "call_0", "content": "15"}
    assert out.stop_condition == "completed" and client.calls[0][1] == env.oai_tools
    with pytest.raises(TypeError, match="abstract"):
        vf.StatefulToolEnv(dataset=[{"question": "q"}])


async def test_tool_env_error_formatter_and_stop_errors():
    def fails(x: int) -> int:
        """Fails."""
        raise ValueError(f"bad {x}")

    env = vf.ToolEnv(tools=[fails], dataset=[{"question": "q"}], error_formatter=lambda e: f"E:{e}")
    out, _, _ = await run_one(env, [calls(("fails", {"x": 1})), say("ok")])
    assert out.completion[1]["content"] == "E:bad 1" and out.state["tool_errors"] == 1 and out.error is None
    env = vf.ToolEnv(tools=[fails], dataset=[{"question": "q"}], stop_errors=[ValueError])
    out, _, _ = await run_one(env, [calls(("fails", {"x": 1})), say("ok")])
    assert out.error is not None and out.error.type == "ValueError" and out.stop_condition == "error"


# ----- datasets and constructor arguments ----------------------------------------------------
async def test_hf_dataset_rows_prompt_column_and_json_info():
    from datasets import Dataset

    rows = [
        {"prompt": [{"role": "user", "content": "p0"}], "answer": "a0", "info": json.dumps({"k": 0})},
        {"prompt": [{"role": "user", "content": "p1"}], "answer": None, "info": json.dumps({"k": 1})},
    ]
    env = vf.SingleTurnEnv(dataset=lambda: Dataset.from_list(rows), system_prompt="be brief")
    first, second = env.get_examples()
    assert [m["content"] for m in first.prompt] == ["be brief", "p0"] and first.info == {"k": 0}
    assert second.answer == "" and second.info == {"k": 1}

    questions = Dataset.from_list([{"question": "q", "answer": 7}])
    few_shot = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]
    env = vf.SingleTurnEnv(dataset=questions, system_prompt="s", few_shot=few_shot)
    (example,) = env.get_examples()
    assert [m["content"] for m in example.prompt] == ["s", "1+1", "2", "q"] and example.answer == "7"
    with pytest.warns(UserWarning, match="few_shot"):
        vf.SingleTurnEnv(dataset=Dataset.from_list(rows), few_shot=few_shot).get_examples()


async def test_verifiers_constructor_arguments():
    data = [{"question": "q"}]
    with pytest.raises(ValueError, match="'chat' or 'completion'"):
        vf.SingleTurnEnv(dataset=data, message_type="raw")
    completion_style = vf.SingleTurnEnv(
        dataset=[{"prompt": "Once upon a", "answer": " time"}], message_type="completion"
    )
    assert completion_style.get_examples()[0].prompt == [{"role": "user", "content": "Once upon a"}]
    with pytest.raises(TypeError, match="bogus"):
        vf.SingleTurnEnv(dataset=data, bogus=1)
    env = vf.SingleTurnEnv(
        dataset=data,
        message_type="chat",
        env_id="mine",
        max_concurrent=4,
        max_workers=8,
        map_kwargs={"num_proc": 2},
        sampling_args={"temperature": 0.3, "extra_body": {"min_p": 0.1}},
    )
    assert env.env_id == "mine" and env.sampling_args == {"temperature": 0.3, "min_p": 0.1}
    assert not hasattr(env, "max_concurrent") and not hasattr(env, "num_proc")

    tools = [{"name": "look", "description": "Look.", "parameters": {"type": "object", "properties": {}}}]
    env = vf.SingleTurnEnv(
        dataset=data, tool_defs=tools, score_rollouts=False, rubric=vf.Rubric(funcs=[lambda completion: 1.0])
    )
    out, client, example = await run_one(env, [say("x")])
    assert client.calls[0][1] == [{"type": "function", "function": tools[0]}]
    assert [(s.reward, s.rewards) for s in await env.score_group(example, [out])] == [(0.0, {})]


async def test_env_group_names_like_verifiers():
    a = vf.SingleTurnEnv(dataset=[{"question": "a"}], rubric=vf.Rubric(funcs=[lambda: 1.0]))
    b = vf.SingleTurnEnv(dataset=[{"question": "b"}], rubric=vf.Rubric(funcs=[lambda: 0.5]))
    group = vf.EnvGroup(envs=[a, b])  # both have the default env_id: verifiers' env_0, env_1
    assert group.env_names == ["env_0", "env_1"] and group.env_map["env_1"] is b and group.envs == [a, b]
    example = group.get_examples()[1]
    out = (await run_one(group, [say("x")], index=1))[0]
    assert example.task == "env_1" and (await group.score_group(example, [out]))[0].reward == 0.5


# ----- loader: package layout ----------------------------------------------------------------
def test_package_layout_env_is_found_listed_and_loaded(workspace: Path):
    from workbench.envs.catalog import describe, list_environments

    package = workspace / "environments" / "pkg_env" / "pkg_env"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        '"""pkg-env: a packaged env."""\nfrom .env import load_environment\n'
    )
    (package / "env.py").write_text(
        "import workbench.envs as vf\n\n"
        "def load_environment(n: int = 2) -> vf.SingleTurnEnv:\n"
        "    return vf.SingleTurnEnv(dataset=[{'question': f'q{i}'} for i in range(n)])\n"
    )
    env = vf.load_environment("pkg-env", n=3)
    assert env.env_id == "pkg-env" and len(env.get_examples()) == 3
    assert (
        vf.load_environment("pkg-env").get_examples()[1].prompt[-1]["content"] == "q1"
    )  # cached module reused
    (source,) = [s for s in list_environments() if s.name == "pkg_env"]
    info = describe(source)
    assert (
        info.origin == "workspace" and info.kind == "SingleTurnEnv" and info.description == "a packaged env."
    )


# ----- real verifiers environments, ported by their import lines -----------------------------
PORTED = [
    "alphabet_sort",
    "tool_test",
    "example_stateful_tool_env",
    "reverse_text",
    "gsm8k",
    "math_group",
    "doublecheck",
]


def _runnable(name: str) -> bool:
    """doublecheck imports `verifiers.rubrics.math_rubric`: it ports once that module path exists."""
    return name != "doublecheck" or importlib.util.find_spec("workbench.envs.rubrics") is not None


def no_verifiers_env(tmp_path: Path, workspace: Path) -> dict[str, str]:
    path = os.pathsep.join([str(blocked_verifiers(tmp_path / "blocked")), str(REPO)])
    return {
        **{k: v for k, v in os.environ.items() if k != "WORKBENCH_WORKSPACE"},
        "PYTHONPATH": path,
        "WORKBENCH_WORKSPACE": str(workspace),
    }


@pytest.fixture(scope="module")
def ported_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("ported")
    names = [n for n in PORTED if _runnable(n)]
    for name in names:
        port_fixture(name, tmp / "ws")
    result = subprocess.run(
        [sys.executable, "-m", "tests.ported_envs", *names],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=no_verifiers_env(tmp, tmp / "ws"),
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines[-1] == {"verifiers_imported": False}
    return {line["env"]: line for line in lines[:-1]}


def test_port_changes_only_import_lines(tmp_path: Path):
    for name in ("doublecheck", "example_stateful_tool_env", "math_group"):
        original = (Path(__file__).parent / "fixtures" / "verifiers_envs" / name / f"{name}.py").read_text()
        ported = (port_fixture(name, tmp_path) / f"{name}.py").read_text()
        changed = [(a, b) for a, b in zip(original.splitlines(), ported.splitlines(), strict=True) if a != b]
        assert changed and all(
            "verifiers" in a and "workbench.envs" in b and "verifiers" not in b for a, b in changed
        )


@pytest.mark.parametrize("name", PORTED)
def test_ported_env_runs_on_workbench(name: str, ported_results: dict[str, dict[str, Any]]):
    if not _runnable(name):
        pytest.skip("needs workbench.envs.rubrics.math_rubric (verifiers.rubrics.math_rubric's port)")
    r = ported_results[name]
    assert r["rollout_errors"] == [None, None] and r["errors"] == [None, None], r
    if name == "alphabet_sort":  # @vf.stop ends at the example's own turn count; the right sort scores 1
        turns = r["info"]["num_turns"]
        assert r["rewards"] == [1.0, 0.0] and r["num_turns"][0] == turns == r["trajectory_len"]
        assert r["stop_conditions"][0] == "max_turns_for_example"
    elif name == "tool_test":  # the reward reads `completion[-1].tool_calls` and `call.name`
        assert r["rewards"] == [1.0, 0.0] and r["tools"] == ["tool_A", "tool_B", "tool_C", "tool_D"]
        assert r["stop_conditions"] == ["max_turns", "completed"]
    elif name == "example_stateful_tool_env":  # update_tool_args overrode the model's offset (100) with 3
        assert r["state"]["update_calls"] == 1 and r["state"]["last_tool_args"] == {"x": 5, "offset": 3}
        assert r["completion"][1]["content"] == "8" and r["num_turns"] == [2, 1]
    elif name == "doublecheck":  # @vf.stop after two turns; env_response returns a vf.UserMessage
        assert (
            r["stop_conditions"][0] == "double_checked" and r["completion"][1]["content"] == "Are you sure?"
        )
        assert r["rewards"][0] == 1.0 > r["rewards"][1]
    else:  # single-turn: the right answer scores 1 through the env's own rubric, a wrong one less
        assert r["rewards"][0] == 1.0 > r["rewards"][1] and r["stop_conditions"] == ["completed", "completed"]
    if name == "math_group":
        assert r["kind"] == "EnvGroup" and r["task"] == "gsm8k"


CLASSIC = [*PORTED, "continuation_quality"]


@pytest.mark.parametrize("name", by_default(CLASSIC, ["tool_test"]))
def test_ported_env_through_the_cli(name: str, tmp_path: Path, tiny_model: Path):
    """`workbench eval run NAME -m tiny -n 2 -r 2` on each classic fixture ported by its imports,
    verifiers unimportable: Workbench's own engine, environment classes and tiny model."""
    from tests.servers import EchoBackend, make_app, serve_in_thread

    workspace = tmp_path / "ws"
    port_fixture(name, workspace)
    (workspace / "outputs" / "models").mkdir(parents=True)
    (workspace / "outputs" / "models" / "tiny").symlink_to(tiny_model)
    args = ["eval", "run", name.replace("_", "-"), "-m", "tiny", "-n", "2", "-r", "2", "-t", "24"]
    env = no_verifiers_env(tmp_path, workspace)
    with serve_in_thread(make_app(EchoBackend("judge"))) as judge:  # continuation_quality's judge, over HTTP
        if name == "continuation_quality":
            env["WB_TEST_JUDGE_KEY"] = "not-a-secret"
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
        result = cli.run(
            [sys.executable, "-m", "workbench", *args],
            cwd=workspace,
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = sorted((workspace / "environments" / name / "outputs" / "evals").glob("*/*"))
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted((r["example_id"], r["rollout_index"]) for r in records) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for record in records:
        assert record["error"] is None, record["error"]
        assert record["completion"][0]["role"] == "assistant"
        assert record["rewards"] or name == "example_stateful_tool_env"  # its Rubric() has no functions
        assert record["num_turns"] >= 1 and record["stop_condition"]
    if name == "tool_test":  # verifiers' ToolEnv metrics, as the original reports them
        expected = {"total_tool_calls", "tool_A_calls", "tool_B_calls", "tool_C_calls", "tool_D_calls"}
        assert all(expected <= set(r["metrics"]) for r in records), records[0]["metrics"]
    if name == "alphabet_sort":
        assert all("weighted_reward" in r["rewards"] for r in records)
        assert all(r["stop_condition"] in {"max_turns_for_example", "length"} for r in records)
