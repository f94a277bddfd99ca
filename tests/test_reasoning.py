"""Thinking models: `<think>…</think>` goes to `reasoning_content` on every inference path
(LocalClient, `workbench serve`, OpenAI-compatible servers that split it or leave it inline),
and parsers and rubrics score the answer, not the thinking."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from typing import Any

import pytest
from aiohttp import web

from tests.scripted_lm import SCRIPTED_REPLY, WORDS, build_model, build_tokenizer
from tests.servers import ScriptedBackend, make_app, serve_in_thread
from workbench.engine import run_rollouts
from workbench.envs import Parser, Rubric, SingleTurnEnv, ThinkParser
from workbench.envs.messages import as_message
from workbench.inference.generation import RowResult
from workbench.inference.local_client import LocalClient, _Request
from workbench.inference.openai_client import OpenAIClient, parse_chat_response
from workbench.inference.reasoning import (
    REASONING_PARSERS,
    prompt_ends_in_thinking,
    resolve_reasoning_parser,
    split_reasoning,
)
from workbench.types import Completion, Group, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=20)
ID = {word: i for i, word in enumerate(WORDS)}


# ----- the split itself (vLLM's semantics; see inference/reasoning.py) ---------------------------
@pytest.mark.parametrize(
    ("parser", "text", "prompt_open", "expected"),
    [
        # a whole block, the newlines around it dropped
        ("qwen3", "<think>\nhmm\n</think>\n\nanswer", False, ("hmm", "answer")),
        ("deepseek_r1", "<think>hmm</think>answer", False, ("hmm", "answer")),
        # <think> opened by the template in the prompt: only </think> is generated
        ("qwen3", "hmm</think>\n\nanswer", False, ("hmm", "answer")),
        ("deepseek_r1", "hmm</think>\n\nanswer", False, ("hmm", "answer")),
        # cut mid-thought: all of it is reasoning, no answer
        ("qwen3", "<think>still going", False, ("still going", "")),
        ("qwen3", "still going", True, ("still going", "")),
        ("deepseek_r1", "still going", False, ("still going", "")),
        # qwen3, no thinking at all (switched off, an instruct model): all content
        ("qwen3", "just the answer", False, (None, "just the answer")),
        # thinking only / an empty block
        ("qwen3", "<think>all thought</think>", False, ("all thought", "")),
        ("qwen3", "<think>\n\n</think>\n\nanswer", False, (None, "answer")),
        # as vLLM: text before <think> is not kept; only the first </think> ends the block
        ("qwen3", "  <think>a</think>b</think>c", False, ("a", "b</think>c")),
    ],
)
def test_split_reasoning(parser: str, text: str, prompt_open: bool, expected: tuple[str | None, str]) -> None:
    assert split_reasoning(text, parser, prompt_open=prompt_open) == expected


def test_parser_names_and_auto() -> None:
    assert REASONING_PARSERS == ("qwen3", "deepseek_r1")
    with pytest.raises(ValueError, match="qwen3 or deepseek_r1"):
        split_reasoning("x", "qwen")
    tokenizer = build_tokenizer()
    assert resolve_reasoning_parser("auto", tokenizer) == "qwen3"
    assert resolve_reasoning_parser("deepseek_r1", tokenizer) == "deepseek_r1"
    assert resolve_reasoning_parser(None, tokenizer) is None

    class NoThink:
        def get_vocab(self) -> dict[str, int]:
            return {"<think": 1, "a": 2}

    assert resolve_reasoning_parser("auto", NoThink()) is None


def test_prompt_state_reads_the_last_think_tag() -> None:
    ids = (ID["<think>"], ID["</think>"])
    assert prompt_ends_in_thinking([1, ID["<think>"], 6], ids)
    assert not prompt_ends_in_thinking([ID["<think>"], 6, ID["</think>"], 9], ids)  # an earlier, closed turn
    assert not prompt_ends_in_thinking([1, 2], ids) and not prompt_ends_in_thinking([ID["<think>"]], None)


# ----- LocalClient on a real model whose greedy output is scripted -------------------------------
@pytest.fixture(scope="module")
def scripted() -> tuple[Any, Any]:
    return build_model(), build_tokenizer()


def local(scripted: tuple[Any, Any], reasoning_parser: str | None = "auto") -> LocalClient:
    model, tokenizer = scripted
    return LocalClient.from_model(model, tokenizer, model_name="thinker", reasoning_parser=reasoning_parser)


async def test_local_client_splits_thinking_and_keeps_every_token(scripted) -> None:
    client = local(scripted)
    try:
        assert client.reasoning_parser == "qwen3"  # auto: the vocabulary has <think> and </think>
        [c] = await client.chat([{"role": "user", "content": "Hi"}], sampling=GREEDY)
        assert c.message == {
            "role": "assistant",
            "content": "<answer>7</answer>",
            "reasoning_content": "I think 42",
        }
        assert c.tokens.completion_ids[:2] == [ID["<think>"], ID["I"]]  # RL trains on the thinking too
        assert len(c.tokens.completion_logprobs) == len(c.tokens.completion_ids) == c.completion_tokens
        # The template opened <think> in the prompt and the budget ran out: all reasoning.
        [cut] = await client.complete_ids(
            [ID["<|assistant|>"], ID["<think>"]], sampling=GREEDY.merged({"max_tokens": 3})
        )
        assert (cut.message, cut.finish_reason) == (
            {"role": "assistant", "content": "", "reasoning_content": "I think 42"},
            "length",
        )
        # No thinking: the reply is content under qwen3...
        [plain] = await client.complete_ids([ID["Hi"]], sampling=GREEDY)
        assert plain.message == {"role": "assistant", "content": "<answer>7</answer>"}
    finally:
        await client.close()
    # ...and reasoning under deepseek_r1 (R1 always thinks first); no parser: the raw text.
    for parser, message in (
        ("deepseek_r1", {"content": "", "reasoning_content": "<answer>7</answer>"}),
        (None, {"content": "<answer>7</answer>"}),
    ):
        client = local(scripted, parser)
        try:
            [c] = await client.complete_ids([ID["Hi"]], sampling=GREEDY)
            assert c.message == {"role": "assistant", **message}
        finally:
            await client.close()


async def test_tool_calls_come_from_the_answer_only(scripted) -> None:
    client = local(scripted)
    considered = '<tool_call>{"name": "rm", "arguments": {}}</tool_call>'
    text = f'<think>maybe {considered}? no.</think>\n\n<tool_call>{{"name": "add", "arguments": {{"a": 1}}}}</tool_call>'
    loop = asyncio.get_running_loop()
    request = _Request([1, 2], SamplingParams(), 10, True, loop, loop.create_future())
    completion = client._to_completion(request, RowResult([5, 6], [-0.1, -0.2], text, "stop"))
    assert completion.finish_reason == "tool_calls"
    assert [call["function"]["name"] for call in completion.message["tool_calls"]] == ["add"]
    assert (
        completion.message["reasoning_content"] == f"maybe {considered}? no."
        and completion.message["content"] == ""
    )
    assert completion.tokens.completion_ids == [5, 6]
    await client.close()


# ----- `workbench serve` and OpenAI-compatible servers ---------------------------------------------
def post(base_url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base_url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_serve_returns_reasoning_like_vllm(scripted) -> None:
    client = local(scripted)
    body = {
        "model": "thinker",
        "messages": [{"role": "user", "content": "Hi"}],
        "temperature": 0,
        "max_tokens": 20,
    }
    with serve_in_thread(make_app(client)) as url:
        message = post(url, body)["choices"][0]["message"]
        assert message["content"] == "<answer>7</answer>"
        assert message["reasoning"] == message["reasoning_content"] == "I think 42"  # vLLM 0.11+ sends both
        hidden = post(url, {**body, "include_reasoning": False})["choices"][0]["message"]
        assert (
            "reasoning" not in hidden
            and "reasoning_content" not in hidden
            and hidden["content"] == "<answer>7</answer>"
        )


def test_openai_client_reads_either_key_and_splits_inline_thinking() -> None:
    def response(message: dict[str, Any]) -> dict[str, Any]:
        return {
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}]
        }

    expected = {"role": "assistant", "content": "answer", "reasoning_content": "hmm"}
    for message in (
        {"content": "\n\nanswer", "reasoning_content": "hmm"},  # vLLM <= 0.10
        {"content": "answer", "reasoning": "hmm\n"},  # vLLM main, OpenRouter
        {"content": "answer", "reasoning": "hmm", "reasoning_content": "hmm"},
    ):  # vLLM 0.11+
        assert parse_chat_response(response(message))[0].message == expected
    inline = response({"content": "<think>hmm</think>\n\nanswer"})
    assert parse_chat_response(inline)[0].message == {
        "role": "assistant",
        "content": "<think>hmm</think>\n\nanswer",
    }
    assert parse_chat_response(inline, reasoning_parser="qwen3")[0].message == expected
    # a server that already split: no second split of the answer
    split = response({"content": "<think> is a tag", "reasoning_content": "hmm"})
    assert parse_chat_response(split, reasoning_parser="qwen3")[0].message["content"] == "<think> is a tag"


def test_thinking_goes_back_to_the_server_under_both_keys(echo, url) -> None:
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "4", "reasoning_content": "2+2"},
        {"role": "user", "content": "again"},
    ]
    client = OpenAIClient(url, "echo-model")
    body = client.request_body(history, GREEDY, None)
    assert body["messages"][1] == {**history[1], "reasoning": "2+2"}  # vLLM main reads `reasoning`
    assert (
        "reasoning" not in history[1] and body["messages"][0] is history[0]
    )  # the caller's list is untouched
    asyncio.run(_chat_and_close(client, history))
    sent = echo.calls[0][0][1]
    assert sent["reasoning_content"] == sent["reasoning"] == "2+2"


async def _chat_and_close(client: OpenAIClient, messages: list[dict[str, Any]]) -> None:
    try:
        await client.chat(messages, sampling=GREEDY)
    finally:
        await client.close()


# ----- scoring sees the answer -------------------------------------------------------------------
def first_number(text: str) -> str:
    found = re.findall(r"\d+", text)
    return found[0] if found else ""


def exact(completion, answer, parser) -> float:
    return 1.0 if parser.parse_answer(completion) == answer else 0.0


def thinking_env() -> SingleTurnEnv:
    # The first number in the reply: 42 if the thinking is read, 7 if only the answer is.
    parser = Parser(extract_fn=first_number)
    return SingleTurnEnv(
        dataset=[{"question": "Hi", "answer": "7"}], parser=parser, rubric=Rubric([exact], parser=parser)
    )


def score(client: Any) -> Group:
    env = thinking_env()
    groups: list[Group] = []

    async def main() -> None:
        try:
            await run_rollouts(
                env,
                client,
                env.get_examples(),
                rollouts_per_example=1,
                sampling=GREEDY,
                on_group=groups.append,
            )
        finally:
            await client.close()

    asyncio.run(main())
    [group] = groups
    return group


def vllm_style_app(message: dict[str, Any]) -> web.Application:
    """A server that answers every chat request with `message` (as a vLLM with a reasoning parser would)."""

    async def chat(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "choices": [
                    {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}
                ],
                "usage": {},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def test_rollouts_are_scored_on_the_answer_on_every_path(scripted) -> None:
    # in-process
    rollout = score(local(scripted)).rollouts[0]
    assert rollout.reward == 1.0 and rollout.completion[-1]["reasoning_content"] == "I think 42"
    assert (
        score(local(scripted, None)).rollouts[0].reward == 0.0
    )  # control: unsplit, the thinking's 42 is read
    # `workbench serve` over the same model
    with serve_in_thread(make_app(local(scripted))) as url:
        rollout = score(OpenAIClient(url, "thinker")).rollouts[0]
    assert rollout.reward == 1.0 and rollout.completion[-1]["reasoning_content"] == "I think 42"
    # a server without a reasoning parser (thinking inline): the client splits when told the parser
    inline = ScriptedBackend(
        lambda *_: [Completion({"role": "assistant", "content": SCRIPTED_REPLY}, "stop")]
    )
    with serve_in_thread(make_app(inline)) as url:
        assert score(OpenAIClient(url, "scripted")).rollouts[0].reward == 0.0
        assert score(OpenAIClient(url, "scripted", reasoning_parser="qwen3")).rollouts[0].reward == 1.0
    # vLLM with --reasoning-parser (current main: the `reasoning` key, content after "\n\n")
    with serve_in_thread(
        vllm_style_app({"content": "\n\n<answer>7</answer>", "reasoning": "I think 42"})
    ) as url:
        rollout = score(OpenAIClient(url, "qwen3")).rollouts[0]
    assert rollout.reward == 1.0
    assert rollout.completion[-1] == {
        "role": "assistant",
        "content": "<answer>7</answer>",
        "reasoning_content": "I think 42",
    }


def test_messages_and_think_parser_see_reasoning_content() -> None:
    message = as_message({"role": "assistant", "content": "7", "reasoning_content": "I think 42"})
    assert message.reasoning_content == "I think 42"
    assert as_message({"role": "assistant", "content": "7"}).reasoning_content is None
    parser = ThinkParser()
    assert parser.parse_answer([message]) == "7"
    assert parser.format_score([message]) == 1.0  # the server already split the block off: well formed
    assert parser.format_score([{**message, "content": "</think>7"}]) == 0.0
    assert parser.format_score([{"role": "assistant", "content": "<think>x</think>7"}]) == 1.0


# ----- saved results and their views ------------------------------------------------------------
def test_results_keep_reasoning_and_views_fold_it(tmp_path) -> None:
    from workbench.cli.render import format_rollout
    from workbench.evaluate.export import rollout_rows
    from workbench.store.results import ResultsWriter, read_groups
    from workbench.types import Rollout

    final = {"role": "assistant", "content": "<answer>7</answer>", "reasoning_content": "I think 42"}
    rollout = Rollout(0, 0, [{"role": "user", "content": "Hi"}], [final], answer="7", reward=1.0)
    writer = ResultsWriter(tmp_path)
    writer.write_group(Group(0, [rollout]))
    writer.close()
    [group] = read_groups(tmp_path)
    assert group.rollouts[0].completion == [final]
    [row] = rollout_rows([group])
    assert (row["last_response"], row["last_reasoning"]) == ("<answer>7</answer>", "I think 42")
    line = format_rollout(group.rollouts[0])
    assert "(thought 3 words)" in line and "42" not in line
