"""Environment API: parsers, rubric (weights, metrics, injection, async, group functions, errors),
multi-turn and tool loops, EnvGroup routing, loader resolution."""

from __future__ import annotations

import asyncio

import pytest

from workbench.envs import (
    EnvGroup,
    MultiTurnEnv,
    Rubric,
    SingleTurnEnv,
    ThinkParser,
    ToolEnv,
    XMLParser,
    load_environment,
    tool_schema,
)
from workbench.envs.rubric import ScoringInput
from workbench.errors import UserError
from workbench.inference.echo import EchoClient
from workbench.types import Completion, SamplingParams


def item(text: str, answer: str = "", **kw) -> ScoringInput:
    return ScoringInput(
        prompt=[{"role": "user", "content": "q"}],
        completion=[{"role": "assistant", "content": text}],
        answer=answer,
        state={},
        **kw,
    )


def test_xml_parser_answer_and_format():
    parser = XMLParser(["think", "answer"], answer_field="answer")
    text = "<think>hmm</think>\n<answer> 42 </answer>"
    assert parser.parse(text).answer == "42"
    assert parser.parse_answer([{"role": "assistant", "content": text}]) == "42"
    assert parser.format_score([{"role": "assistant", "content": text}]) == 1.0
    assert (
        parser.format_score([{"role": "assistant", "content": "<answer>1</answer><answer>2</answer>"}]) == 0.0
    )
    assert parser.parse_answer([{"role": "assistant", "content": "no tags"}]) is None
    assert parser.format(think="a", answer="b") == "<think>\na\n</think>\n<answer>\nb\n</answer>"


def test_think_parser():
    parser = ThinkParser(extract_fn=lambda t: t.upper())
    assert parser.parse_answer([{"role": "assistant", "content": "<think>x</think> yes"}]) == "YES"
    assert parser.parse_answer([{"role": "assistant", "content": "<think>never closed"}]) is None


async def test_rubric_weights_metrics_injection_async_and_group():
    seen_args = {}

    def exact(completion, answer) -> float:
        seen_args["exact"] = (completion, answer)
        return float(completion[-1]["content"] == answer)

    async def length_metric(completion) -> float:
        await asyncio.sleep(0)
        return float(len(completion[-1]["content"]))

    def best_in_group(completions) -> list[float]:
        lengths = [len(c[-1]["content"]) for c in completions]
        return [float(n == max(lengths)) for n in lengths]

    rubric = Rubric([exact, length_metric, best_in_group], weights=[1.0, 0.0, 0.5])
    scores = await rubric.score_group([item("abc", "abc"), item("x", "abc")])
    assert scores[0].reward == pytest.approx(1.5) and scores[1].reward == 0.0
    assert scores[0].rewards == {"exact": 1.0, "best_in_group": 1.0}
    assert scores[0].metrics == {"length_metric": 3.0}
    assert seen_args["exact"][1] == "abc"


async def test_rubric_reward_error_is_recorded_not_raised():
    def boom(completion) -> float:
        raise RuntimeError("bad reward")

    def fine() -> float:
        return 1.0

    scores = await Rubric([fine, boom]).score_group([item("a")])
    assert scores[0].reward == 0.0
    assert (
        scores[0].error is not None
        and "boom" in scores[0].error.message
        and scores[0].error.where == "reward"
    )


def test_tool_schema_from_hints_and_docstring():
    def search(query: str, limit: int = 5, exact: bool | None = None) -> str:
        """Search the corpus.

        Args:
            query: what to look for
            limit: how many hits
        """
        return ""

    schema = tool_schema(search)["function"]
    assert schema["name"] == "search" and schema["description"] == "Search the corpus."
    props = schema["parameters"]["properties"]
    assert props["query"] == {"type": "string", "description": "what to look for"}
    assert props["limit"]["type"] == "integer" and props["exact"]["type"] == "boolean"
    assert schema["parameters"]["required"] == ["query"]


class ScriptedClient:
    """A Client that replays fixed assistant messages (one per call)."""

    model = "scripted"

    def __init__(self, messages):
        self.messages = list(messages)
        self.calls = []

    async def chat(self, messages, *, sampling, tools=None):
        self.calls.append((list(messages), tools))
        message = self.messages.pop(0)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return [Completion(message=message, finish_reason=finish, prompt_tokens=1, completion_tokens=1)]

    async def close(self):
        pass


def tool_call(name: str, arguments: str, call_id: str = "c1") -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }


async def test_tool_env_runs_tools_and_records_tool_errors():
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    def crash(x: str) -> str:
        """Always fails."""
        raise ValueError("tool exploded")

    env = ToolEnv(tools=[add, crash], dataset=[{"question": "1+2?", "answer": "3"}], max_turns=5)
    client = ScriptedClient(
        [
            tool_call("add", '{"a": 1, "b": 2}'),
            tool_call("crash", '{"x": "y"}'),
            tool_call("nope", "{}"),
            tool_call("add", "not json"),
            {"role": "assistant", "content": "3"},
        ]
    )
    example = env.get_examples(1)[0]
    out = await env.rollout(client, example, SamplingParams())
    tool_msgs = [m for m in out.completion if m["role"] == "tool"]
    assert tool_msgs[0]["content"] == "3"
    assert "tool exploded" in tool_msgs[1]["content"]
    assert "unknown tool 'nope'" in tool_msgs[2]["content"]
    assert out.state["tool_errors"] == 3 and out.state["tool_calls"] == 4
    assert out.num_turns == 5 and out.stop_condition == "completed" and out.error is None
    assert client.calls[0][1][0]["function"]["name"] == "add"


async def test_multiturn_max_turns_and_env_error():
    class Counter(MultiTurnEnv):
        async def env_response(self, messages, state):
            if state["turn"] == 2 and state["info"].get("explode"):
                raise RuntimeError("env broke")
            return [{"role": "user", "content": "again"}]

    env = Counter(dataset=[{"question": "go"}, {"question": "go", "info": {"explode": True}}], max_turns=3)
    client = ScriptedClient([{"role": "assistant", "content": str(i)} for i in range(10)])
    first, second = env.get_examples()
    out = await env.rollout(client, first, SamplingParams())
    assert out.num_turns == 3 and out.stop_condition == "max_turns"
    out = await env.rollout(client, second, SamplingParams())
    assert out.error is not None and out.error.where == "env" and out.num_turns == 2
    assert [m["content"] for m in out.completion] == ["3", "again", "4"]  # partial work is kept


async def test_env_group_routes_by_task_and_scores_with_member_rubric():
    a = SingleTurnEnv(dataset=[{"question": "a1"}, {"question": "a2"}], rubric=Rubric([lambda: 1.0]))
    b = SingleTurnEnv(dataset=[{"question": "b1"}], rubric=Rubric([lambda: 0.25]))
    group = EnvGroup([a, b], env_names=["a", "b"])
    examples = group.get_examples()
    assert [e.task for e in examples] == ["a", "b", "a"]
    assert [e.example_id for e in examples] == [0, 1, 2]
    out = await group.rollout(EchoClient(), examples[1], SamplingParams())
    scores = await group.score_group(examples[1], [out])
    assert scores[0].reward == 0.25


def test_loader_resolves_dashes_and_owner_prefix(workspace):
    for env_id in ("reverse-text", "reverse_text", "primeintellect/reverse-text"):
        env = load_environment(env_id)
        assert env.env_id == "reverse-text"
    assert load_environment("alphabet-sort", max_turns=4).max_turns == 4


def test_loader_errors_are_one_line(workspace):
    with pytest.raises(UserError, match=r"unknown environment 'nope'.*available: .*reverse-text"):
        load_environment("nope")
    with pytest.raises(UserError, match=r"has no argument 'bogus'.*arguments: .*max_turns"):
        load_environment("alphabet-sort", bogus=1)
    with pytest.raises(UserError, match="failed to load: ValueError"):
        load_environment("alphabet-sort", min_turns=5, max_turns=2)


def test_workspace_env_shadows_bundled(workspace):
    folder = workspace / "environments" / "reverse_text"
    folder.mkdir(parents=True)
    (folder / "reverse_text.py").write_text(
        "from workbench.envs import SingleTurnEnv\n"
        "def load_environment():\n    return SingleTurnEnv(dataset=[{'question': 'local'}])\n"
    )
    env = load_environment("reverse-text")
    assert env.get_examples()[0].prompt[-1]["content"] == "local"


def test_bundled_envs_data_is_seeded_and_disjoint():
    rt = load_environment("reverse-text")
    again = load_environment("reverse-text")
    assert [e.prompt for e in rt.get_examples(5)] == [e.prompt for e in again.get_examples(5)]
    assert rt.get_examples(3, split="train")[0].prompt != rt.get_examples(3, split="eval")[0].prompt
    example = rt.get_examples(1)[0]
    assert example.answer == example.prompt[-1]["content"][::-1]


async def test_reverse_text_rewards_hand_written():
    env = load_environment("reverse-text")
    example = env.get_examples(1)[0]
    perfect = [{"role": "assistant", "content": f"<reversed_text>\n{example.answer}\n</reversed_text>"}]
    half = [
        {
            "role": "assistant",
            "content": f"<reversed_text>{example.answer[: len(example.answer) // 2]}</reversed_text>",
        }
    ]
    garbage = [{"role": "assistant", "content": "I don't know"}]
    from workbench.envs.environment import RolloutOutput

    scores = await env.score_group(example, [RolloutOutput(c, {}) for c in (perfect, half, garbage)])
    assert scores[0].reward == 1.0 and 0.3 < scores[1].reward < 0.9 and scores[2].reward == 0.0
    assert scores[0].metrics["format_reward"] == 1.0 and scores[2].metrics["format_reward"] == 0.0


async def test_alphabet_sort_reference_scores_one_and_turns_follow_data():
    env = load_environment("alphabet-sort", min_turns=3, max_turns=3)
    example = env.get_examples(1)[0]
    reference = env.reference_completion(example)
    assistant_turns = [m for m in reference if m["role"] == "assistant"]
    client = ScriptedClient(assistant_turns)
    out = await env.rollout(client, example, SamplingParams())
    assert out.num_turns == 3 and out.stop_condition == "completed"
    assert "Add these names" in out.completion[1]["content"]
    scores = await env.score_group(example, [out])
    assert scores[0].reward == pytest.approx(1.0)
    assert scores[0].metrics["turns_completed"] == 1.0


def test_assemble_tokens_masks_env_turns():
    from workbench.envs.multiturn import assemble_tokens
    from workbench.types import TokenData

    turn1 = TokenData(prompt_ids=[1, 2], completion_ids=[3, 4], completion_logprobs=[-0.1, -0.2])
    turn2 = TokenData(prompt_ids=[1, 2, 3, 4, 9, 9], completion_ids=[5], completion_logprobs=[-0.5])
    tokens = assemble_tokens([turn1, turn2])
    assert tokens.prompt_ids == [1, 2] and tokens.completion_ids == [3, 4, 9, 9, 5]
    assert tokens.completion_mask == [1, 1, 0, 0, 1]
    assert tokens.completion_logprobs == [-0.1, -0.2, 0.0, 0.0, -0.5]
    broken = TokenData(prompt_ids=[1, 2, 7, 7, 9], completion_ids=[5], completion_logprobs=[-0.5])
    assert assemble_tokens([turn1, broken]).completion_mask == [0, 0, 0, 1]  # turn 1 not found: masked out
    assert assemble_tokens([turn1, None]) is None


async def test_context_overflow_ends_rollout_as_truncated_not_error():
    from workbench.errors import ContextLengthError

    class Overflowing(ScriptedClient):
        async def chat(self, messages, *, sampling, tools=None):
            if len(messages) > 3:
                raise ContextLengthError("prompt is 2000 tokens; maximum context length is 1024")
            return await super().chat(messages, sampling=sampling, tools=tools)

    class Chatty(MultiTurnEnv):
        async def env_response(self, messages, state):
            return [{"role": "user", "content": "more"}]

    env = Chatty(dataset=[{"question": "go"}], max_turns=5)
    out = await env.rollout(
        Overflowing([{"role": "assistant", "content": "a"}] * 5), env.get_examples(1)[0], SamplingParams()
    )
    assert (
        out.error is None
        and out.is_truncated
        and out.stop_condition == "prompt_too_long"
        and out.num_turns == 2
    )


async def test_http_400_context_message_maps_to_context_length_error():
    from workbench.errors import ContextLengthError
    from workbench.inference.openai_client import error_for_status

    body = b'{"error": {"message": "This model\'s maximum context length is 1024 tokens."}}'
    assert isinstance(error_for_status(400, body, "http://x/v1/chat/completions"), ContextLengthError)
    assert not isinstance(error_for_status(400, b'{"error": {"message": "bad"}}', "u"), ContextLengthError)


async def test_a_tool_env_logs_verifiers_tool_call_metrics():
    """As verifiers' ToolMonitorRubric: `total_tool_calls` and `<tool>_calls` per tool, weight 0,
    next to the env's own rubric (which is not changed), following add_tool/remove_tool."""
    from workbench.envs.environment import RolloutOutput
    from workbench.envs.rubric import Rubric
    from workbench.envs.tool_env import ToolEnv

    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    def echo(text: str) -> str:
        """Echo text."""
        return text

    def answered(completion) -> float:
        return float("7" in (completion[-1].get("content") or ""))

    own = Rubric([answered])
    env = ToolEnv(tools=[add], rubric=own, dataset=[{"question": "3 + 4?", "answer": "7"}])
    env.add_tool(echo)
    call = lambda name, args: {"id": name, "type": "function", "function": {"name": name, "arguments": args}}  # noqa: E731
    completion = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("add", '{"a": 3, "b": 4}'), call("add", "{}")],
        },
        {"role": "tool", "tool_call_id": "add", "content": "7"},
        {"role": "assistant", "content": "", "tool_calls": [call("echo", '{"text": "7"}')]},
        {"role": "assistant", "content": "7"},
    ]
    (score,) = await env.score_group(env.get_examples(1)[0], [RolloutOutput(completion, {})])
    assert score.reward == 1.0 and score.rewards == {"answered": 1.0}
    assert score.metrics == {"total_tool_calls": 3.0, "add_calls": 2.0, "echo_calls": 1.0}
    assert own.func_names == ["answered"]
    env.remove_tool(echo)
    (score,) = await env.score_group(env.get_examples(1)[0], [RolloutOutput(completion, {})])
    assert score.metrics == {"total_tool_calls": 3.0, "add_calls": 2.0}


def test_an_env_imported_from_another_workspace_is_not_taken_for_an_installed_one(tmp_path, monkeypatch):
    """A long-lived process (a launcher whose ranks fork from it, the TUI's in-process screens)
    that imported workspace A's env must not find it in workspace B, where it does not exist."""
    import sys

    from workbench.envs.loader import find_environment, import_env_module

    folder = tmp_path / "a" / "environments" / "only_in_a"
    folder.mkdir(parents=True)
    (folder / "only_in_a.py").write_text("def load_environment():\n    return None\n")
    (tmp_path / "b").mkdir()
    try:
        monkeypatch.setenv("WORKBENCH_WORKSPACE", str(tmp_path / "a"))
        source = find_environment("only-in-a")
        assert source is not None and source.origin == "workspace"
        import_env_module(source)
        monkeypatch.setenv("WORKBENCH_WORKSPACE", str(tmp_path / "b"))
        assert find_environment("only-in-a") is None  # not "installed": nothing installs it
    finally:
        sys.modules.pop("only_in_a", None)
