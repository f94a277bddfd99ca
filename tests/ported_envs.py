"""Port verifiers environments to Workbench by their imports alone, and run them scripted.

`port_fixture` copies a vendored environment (tests/fixtures/verifiers_envs, see ORIGIN.md) into a
workspace and rewrites only its verifiers import lines (`import verifiers as vf` ->
`import workbench.envs as vf`, `from verifiers.x import y` -> `from workbench.envs.x import y`).

Run as `python -m tests.ported_envs NAME...` (with $WORKBENCH_WORKSPACE holding the ported envs)
it loads each, plays one or two scripted rollouts whose rewards depend on the env's code path,
and prints one JSON line per env. tests/test_envs_port.py runs it in a child whose `verifiers`
cannot be imported, so what runs is Workbench's engine alone.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures" / "verifiers_envs"
_IMPORT = re.compile(r"^(\s*)import verifiers as vf\b")
_FROM = re.compile(r"^(\s*)from verifiers(?=[. ])")


def port_fixture(name: str, workspace: Path) -> Path:
    """Copy fixture `name` into `workspace/environments/` with only its verifiers imports changed."""
    target = workspace / "environments" / name
    shutil.copytree(FIXTURES / name, target)
    for path in target.rglob("*.py"):
        lines = path.read_text().splitlines(keepends=True)
        ported = [
            _FROM.sub(r"\1from workbench.envs", _IMPORT.sub(r"\1import workbench.envs as vf", line))
            for line in lines
        ]
        path.write_text("".join(ported))
    return target


def blocked_verifiers(folder: Path) -> Path:
    """A folder to put first on PYTHONPATH: its `verifiers` package fails to import."""
    package = folder / "verifiers"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(
        'raise ImportError("verifiers is blocked: a ported env must not need it")\n'
    )
    return folder


# ----- scripted models -----------------------------------------------------------------------
Reply = Callable[[list[dict[str, Any]], Any], dict[str, Any]]


class Scripted:
    """A client whose answer is computed from the conversation and the example."""

    def __init__(self, reply: Reply, example: Any) -> None:
        self.reply, self.example, self.seen_tools = reply, example, None

    async def chat(self, messages: list[dict[str, Any]], *, sampling: Any, tools: Any = None) -> list[Any]:
        from workbench.types import Completion

        assert all(type(m) is dict for m in messages), "clients get plain dict messages"
        self.seen_tools = tools
        message = self.reply(messages, self.example)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return [Completion(message=message, finish_reason=finish, prompt_tokens=1, completion_tokens=1)]

    async def close(self) -> None:
        pass


def say(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def calls(*named: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in enumerate(named)
        ],
    }


def sorted_names(messages: list[dict[str, Any]], example: Any) -> dict[str, Any]:
    turn = sum(m["role"] == "assistant" for m in messages)
    tag = "alphabetical_sorted" if turn == 0 else "combined_alphabetical_sorted"
    lines = "\n".join(example.info["ground_truths"][turn])
    return say(f"<{tag}>\n{lines}\n</{tag}>")


def expected_tools(messages: list[dict[str, Any]], example: Any) -> dict[str, Any]:
    args = {"tool_A": {"x": 1}, "tool_B": {"x": "a"}, "tool_C": {"x": 1.5}, "tool_D": {"x": True}}
    return calls(*[(n, args[n]) for n in example.info["tool_names"]])


def offset_then_answer(messages: list[dict[str, Any]], example: Any) -> dict[str, Any]:
    if messages[-1]["role"] == "tool":
        return say(f"the tool said {messages[-1]['content']}")
    return calls(("offset_tool", {"x": 5, "offset": 100}))  # the env overrides the model's offset


def reversed_text(messages: list[dict[str, Any]], example: Any) -> dict[str, Any]:
    return say(f"<reversed_text>\n{example.answer}\n</reversed_text>")


def boxed(messages: list[dict[str, Any]], example: Any) -> dict[str, Any]:
    return say(f"<reasoning>easy</reasoning>\n<answer>\\boxed{{{example.answer}}}</answer>")


def wrong(messages: list[dict[str, Any]], example: Any) -> dict[str, Any]:
    return say("<answer>\\boxed{-1}</answer> <reversed_text>nope</reversed_text>")


# env -> (the right answer, a wrong one)
SCRIPTS: dict[str, tuple[Reply, Reply]] = {
    "alphabet_sort": (sorted_names, wrong),
    "tool_test": (expected_tools, wrong),  # a text answer: `completion[-1].tool_calls` is None
    "example_stateful_tool_env": (offset_then_answer, wrong),
    "reverse_text": (reversed_text, wrong),
    "gsm8k": (boxed, wrong),
    "math_group": (boxed, wrong),
    "doublecheck": (boxed, wrong),
}


async def play(name: str) -> dict[str, Any]:
    from workbench.envs.loader import load_environment
    from workbench.types import SamplingParams

    env = load_environment(name)
    example = env.get_examples(1)[0]
    right, bad = SCRIPTS[name]
    outputs, clients = [], []
    for reply in (right, bad):
        client = Scripted(reply, example)
        outputs.append(await env.rollout(client, example, SamplingParams()))
        clients.append(client)
    scores = await env.score_group(example, outputs)
    state = outputs[0].state
    return {
        "env": name,
        "kind": type(env).__name__,
        "task": example.task,
        "info": example.info,
        "rewards": [s.reward for s in scores],
        "errors": [None if s.error is None else vars(s.error) for s in scores],
        "rollout_errors": [None if o.error is None else vars(o.error) for o in outputs],
        "stop_conditions": [o.stop_condition for o in outputs],
        "num_turns": [o.num_turns for o in outputs],
        "completion": outputs[0].completion,
        "trajectory_len": len(state.get("trajectory", [])),
        "tools": [t["function"]["name"] for t in clients[0].seen_tools or []],
        "state": {k: state.get(k) for k in ("update_calls", "last_tool_args", "offset", "stop_condition")},
    }


def main(names: list[str]) -> None:
    for name in names:
        print(json.dumps(asyncio.run(play(name))), flush=True)
    print(json.dumps({"verifiers_imported": "verifiers" in sys.modules}))


if __name__ == "__main__":
    main(sys.argv[1:])
