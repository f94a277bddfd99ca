"""Tokens in over HTTP (issue 34.1): `workbench serve` answers vLLM's `POST /inference/v1/generate`,
and `TokensInServer` makes a server-mode multi-turn rollout exactly what the sampler saw, as
colocated training is. Real `workbench serve` processes on 127.0.0.1, the real tiny models."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.servers import ServerProcess, serve_in_thread, start_process
from tests.test_tiny_qwen_paths import ToolTurns
from workbench.engine.rollouts import run_rollouts
from workbench.inference.local_client import LocalClient
from workbench.inference.openai_client import OpenAIClient, RoundRobinClient
from workbench.inference.tokens_http import TokensInServer, probe_tokens_in
from workbench.train.samples import rollout_sequences
from workbench.types import Group, SamplingParams


@pytest.fixture(scope="module")
def tiny_server(tiny_model: Path) -> Iterator[ServerProcess]:
    server = start_process(
        ["-m", "workbench", "serve", str(tiny_model), "--served-model-name", "tiny", "--port", "0"]
    )
    yield server
    server.stop()


async def post(url: str, body: object) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, await response.json(content_type=None)


async def test_generate_route_answers_as_vllm_with_the_in_process_tokens(
    tiny_server: ServerProcess, tiny_model: Path
) -> None:
    local = LocalClient(tiny_model, model_name="tiny")
    try:
        ids = local.render_prompt_ids([{"role": "user", "content": "Reverse: stone"}])
        sampling = SamplingParams(temperature=1.0, max_tokens=24, seed=3)
        (expected,) = await local.complete_ids(ids, sampling=sampling)
    finally:
        await local.close()
    status, answer = await post(
        f"{tiny_server.base_url}/inference/v1/generate",
        {
            "token_ids": ids,
            "sampling_params": {"temperature": 1.0, "max_tokens": 24, "seed": 3, "logprobs": 0},
            "model": "tiny",
        },
    )
    assert status == 200, answer
    (choice,) = answer["choices"]
    assert expected.tokens is not None
    assert choice["token_ids"] == expected.tokens.completion_ids
    content = choice["logprobs"]["content"]
    assert [entry["token"] for entry in content] == [f"token_id:{t}" for t in expected.tokens.completion_ids]
    assert [entry["logprob"] for entry in content] == pytest.approx(
        expected.tokens.completion_logprobs, abs=1e-5
    )
    assert answer["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": len(choice["token_ids"]),
        "total_tokens": len(ids) + len(choice["token_ids"]),
    }
    assert choice["finish_reason"] in ("stop", "length")


async def test_generate_route_refuses_bad_requests_in_one_line(tiny_server: ServerProcess) -> None:
    url = f"{tiny_server.base_url}/inference/v1/generate"
    status, answer = await post(url, {"token_ids": [], "sampling_params": {}})
    assert status == 400 and "token_ids" in answer["error"]["message"]
    status, answer = await post(url, {"token_ids": [1, 2], "sampling_params": {"logprobs": -1}})
    assert status == 400 and "logprobs" in answer["error"]["message"]
    status, answer = await post(url, {"token_ids": [1, 2], "model": "nope"})
    assert status == 404 and "nope" in answer["error"]["message"]
    status, answer = await post(
        url, {"token_ids": [1, 2], "sampling_params": {"max_tokens": 2, "logprobs": 2}}
    )
    assert status == 200
    first = answer["choices"][0]["logprobs"]["content"][0]
    assert len(first["top_logprobs"]) == 2 and all(
        t["token"].startswith("token_id:") for t in first["top_logprobs"]
    )


@pytest.mark.slow
async def test_three_turn_tool_rollouts_over_http_train_on_exactly_the_sampled_tokens(
    tiny_qwen_model: Path,
) -> None:
    """The acceptance test: `workbench serve tiny-qwen` + a 3-turn tool environment in server
    mode, tokens in. Every turn's prompt extends the previous turn's ids, one sample per rollout,
    its masked tokens decode to exactly the model's turns, and the trainer's logprobs of them (the
    same weights, in this process) match the sampler's: mismatch_kl < 1e-3."""
    server = start_process(
        ["-m", "workbench", "serve", str(tiny_qwen_model), "--served-model-name", "tiny-qwen", "--port", "0"]
    )
    local = LocalClient(tiny_qwen_model, model_name="tiny-qwen")  # the trainer's tokenizer and weights
    pool = RoundRobinClient(
        [TokensInServer(OpenAIClient(server.base_url, "tiny-qwen", return_tokens=True), local.tokenizer)]
    )
    warnings: list[str] = []
    env = ToolTurns()
    groups: list[Group] = []
    try:
        assert await probe_tokens_in(pool, warnings.append) and warnings == []
        await run_rollouts(
            env,
            pool,
            env.get_examples(1, split="train"),
            rollouts_per_example=4,
            on_group=groups.append,
            # temperature 1: `prompt_logprobs` scores at 1, as the trainer does at the sampling temperature
            sampling=SamplingParams(temperature=1.0, max_tokens=256, seed=5),
        )
        tokenizer = local.tokenizer
        three = [r for r in groups[0].rollouts if len(r.turn_tokens) == 3]
        assert three, [(r.stop_condition, r.error) for r in groups[0].rollouts]
        kls: list[float] = []
        for rollout in three:
            for before, after in zip(rollout.turn_tokens, rollout.turn_tokens[1:]):
                assert (
                    after.prompt_ids[: len(before.prompt_ids) + len(before.completion_ids)]
                    == before.prompt_ids + before.completion_ids
                )
            (sample,) = rollout_sequences(rollout, "interleaved")
            assert sample.completion_mask is not None
            model_ids = [t for t, m in zip(sample.completion_ids, sample.completion_mask) if m]
            env_ids = [t for t, m in zip(sample.completion_ids, sample.completion_mask) if not m]
            assert model_ids == [t for turn in rollout.turn_tokens for t in turn.completion_ids]
            env_text = tokenizer.decode(env_ids)
            assert env_text.count("<|im_start|>assistant\n") == 2 and "<|im_start|>user" in env_text
            assert "<|im_start|>" not in tokenizer.decode(model_ids)
            trainer = await local.prompt_logprobs(sample.prompt_ids + sample.completion_ids)
            start = len(sample.prompt_ids)
            for offset, (mask, sampled) in enumerate(zip(sample.completion_mask, sample.completion_logprobs)):
                if mask:
                    log_ratio = trainer[start + offset] - sampled
                    kls.append(math.exp(log_ratio) - 1 - log_ratio)
        assert max(kls) < 1e-3, max(kls)
    finally:
        await pool.close()
        await local.close()
        server.stop()


async def test_a_server_without_the_route_falls_back_to_chat_with_one_warning(
    tiny_server: ServerProcess, tiny_model: Path
) -> None:
    """A proxy that forwards the OpenAI routes and has no tokens-in route (an older vLLM)."""

    async def forward(request: web.Request) -> web.Response:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{tiny_server.base_url}{request.path}",
                data=await request.read(),
                headers={"Content-Type": "application/json"},
            ) as response,
        ):
            return web.Response(
                body=await response.read(), status=response.status, content_type="application/json"
            )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", forward)
    local = LocalClient(tiny_model, model_name="tiny")
    with serve_in_thread(app) as url:
        servers = [
            TokensInServer(OpenAIClient(url, "tiny", return_tokens=True), local.tokenizer) for _ in range(2)
        ]
        pool = RoundRobinClient(servers)
        warnings: list[str] = []
        try:
            assert not await probe_tokens_in(pool, warnings.append)
            assert not pool.tokens_in and not any(s.tokens_in for s in servers)
            assert len(warnings) == 2 and all(
                "/inference/v1/generate" in w and "chat API" in w for w in warnings
            )
            (completion,) = await pool.chat(
                [{"role": "user", "content": "Reverse: stone"}], sampling=SamplingParams(max_tokens=8, seed=1)
            )
            assert completion.tokens is not None and completion.tokens.completion_ids  # the chat path's ids
        finally:
            await pool.close()
            await local.close()


def test_the_request_is_vllms_generate_request(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    server = TokensInServer(
        OpenAIClient("http://127.0.0.1:9/v1", "tiny"), AutoTokenizer.from_pretrained(tiny_model)
    )
    sampling = SamplingParams(
        temperature=0.5,
        max_tokens=7,
        seed=4,
        stop=["</answer>"],
        extra={"min_p": 0.1, "chat_template_kwargs": {"enable_thinking": False}},
    )
    assert server.request_body([5, 6], sampling) == {
        "token_ids": [5, 6],
        "model": "tiny",
        "sampling_params": {
            "temperature": 0.5,
            "top_p": 1.0,
            "top_k": -1,
            "max_tokens": 7,
            "n": 1,
            "logprobs": 0,
            "stop": ["</answer>"],
            "seed": 4,
            "min_p": 0.1,  # the template's kwargs were applied here, where the prompt is rendered
        },
    }
    assert server.server.server_root == "http://127.0.0.1:9"
