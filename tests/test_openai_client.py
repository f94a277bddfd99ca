"""OpenAIClient and RoundRobinClient against real servers on 127.0.0.1 (threads and processes)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from tests.servers import (
    EchoBackend,
    FaultInjector,
    Gate,
    HeaderRecorder,
    after_first,
    make_app,
    raising,
    serve_in_subprocess,
    serve_in_thread,
)
from workbench.errors import InferenceError
from workbench.inference.client import Client
from workbench.inference.openai_client import (
    OpenAIClient,
    RoundRobinClient,
    error_for_status,
    is_transient_status,
)
from workbench.types import Completion, SamplingParams

HELLO = [{"role": "user", "content": "hello"}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def with_retries(
    call: Callable[[], Awaitable[list[Completion]]], attempts: int = 5
) -> list[Completion]:
    """What the engine does: retry transient errors (no backoff needed in tests)."""
    for attempt in range(attempts):
        try:
            return await call()
        except InferenceError as exc:
            if not exc.transient or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


async def test_is_a_client() -> None:
    assert isinstance(OpenAIClient("http://127.0.0.1:1/v1", "m"), Client)
    assert isinstance(RoundRobinClient([OpenAIClient("http://127.0.0.1:1/v1", "m")]), Client)


async def test_round_trip(url: str) -> None:
    client = OpenAIClient(f"{url}/v1", "echo-model")
    try:
        [completion] = await client.chat(HELLO, sampling=SamplingParams())
    finally:
        await client.close()
    assert completion.message == {"role": "assistant", "content": "olleh"}
    assert completion.finish_reason == "stop"
    assert completion.completion_tokens == 5
    assert completion.prompt_tokens == len(b"user: hello\n")
    assert completion.tokens is None


async def test_base_url_without_v1_works(url: str) -> None:
    client = OpenAIClient(url + "/", "echo-model")
    assert client.base_url == f"{url}/v1"
    try:
        assert (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"] == "olleh"
    finally:
        await client.close()


async def test_token_data_when_requested(url: str) -> None:
    client = OpenAIClient(f"{url}/v1", "echo-model", return_tokens=True)
    try:
        [completion] = await client.chat(HELLO, sampling=SamplingParams())
    finally:
        await client.close()
    assert completion.tokens is not None
    assert completion.tokens.prompt_ids == list(b"user: hello\n")
    assert completion.tokens.completion_ids == list(b"olleh")
    assert completion.tokens.completion_logprobs == [-0.25] * 5


def test_request_body() -> None:
    client = OpenAIClient("http://h/v1", "m", return_tokens=True)
    sampling = SamplingParams(
        temperature=0.3, max_tokens=9, stop=["\n"], seed=1, extra={"min_p": 0.05, "n": 3}
    )
    body = client.request_body(HELLO, sampling, [TOOL])
    assert body["model"] == "m" and body["messages"] == HELLO and body["tools"] == [TOOL]
    assert (
        body["temperature"] == 0.3
        and body["max_tokens"] == 9
        and body["stop"] == ["\n"]
        and body["seed"] == 1
    )
    assert "top_k" not in body  # -1 = off: not sent, so servers without top_k accept the request
    assert body["min_p"] == 0.05 and body["n"] == 3  # extra is merged as-is and wins, like extra_body
    assert (
        body["logprobs"] is True
        and body["return_tokens_as_token_ids"] is True
        and body["return_token_ids"] is True
    )
    plain = OpenAIClient("http://h/v1", "m").request_body(HELLO, SamplingParams(top_k=5), None)
    assert plain["top_k"] == 5
    assert not {"logprobs", "return_token_ids", "tools", "stop", "seed"} & plain.keys()


async def test_sampling_reaches_server(url: str, echo: EchoBackend) -> None:
    client = OpenAIClient(url, "echo-model")
    try:
        sampling = SamplingParams(temperature=0.2, top_k=4, max_tokens=3, stop=["q"], extra={"min_p": 0.1})
        await client.chat(HELLO, sampling=sampling)
    finally:
        await client.close()
    _, seen, _ = echo.calls[-1]
    assert (seen.temperature, seen.top_k, sampling.max_tokens, sampling.stop) == (0.2, 4, 3, ["q"])
    assert seen.extra == {"min_p": 0.1}


async def test_n_and_length(url: str) -> None:
    client = OpenAIClient(url, "echo-model", return_tokens=True)
    try:
        completions = await client.chat(HELLO, sampling=SamplingParams(n=2, max_tokens=3))
    finally:
        await client.close()
    assert [c.message["content"] for c in completions] == ["oll", "oll"]
    assert [c.finish_reason for c in completions] == ["length", "length"]
    assert [c.completion_tokens for c in completions] == [3, 3]


async def test_usage_split_without_token_ids(url: str) -> None:
    client = OpenAIClient(url, "echo-model")
    try:
        completions = await client.chat(HELLO, sampling=SamplingParams(n=2, max_tokens=3))
    finally:
        await client.close()
    assert sum(c.completion_tokens for c in completions) == 6
    assert all(c.prompt_tokens == len(b"user: hello\n") for c in completions)


async def test_tool_calls(url: str) -> None:
    client = OpenAIClient(url, "echo-model")
    try:
        [completion] = await client.chat(HELLO, sampling=SamplingParams(), tools=[TOOL])
    finally:
        await client.close()
    assert completion.finish_reason == "tool_calls"
    [call] = completion.message["tool_calls"]
    assert call["function"] == {"name": "lookup", "arguments": '{"q":"hello"}'}
    assert completion.message["content"] == ""


async def test_unknown_model_is_permanent(url: str) -> None:
    client = OpenAIClient(url, "not-served")
    try:
        with pytest.raises(InferenceError) as info:
            await client.chat(HELLO, sampling=SamplingParams())
    finally:
        await client.close()
    assert not info.value.transient and info.value.status == 404
    assert "not-served" in str(info.value)


async def test_backend_400_is_permanent_with_server_message() -> None:
    app = make_app(raising(InferenceError("prompt is 9000 tokens, limit 4096", transient=False)))
    with serve_in_thread(app) as base_url:
        client = OpenAIClient(base_url, "scripted")
        try:
            with pytest.raises(InferenceError) as info:
                await client.chat(HELLO, sampling=SamplingParams())
        finally:
            await client.close()
    assert not info.value.transient and info.value.status == 400
    assert "prompt is 9000 tokens, limit 4096" in str(info.value)


@pytest.mark.parametrize("status", [503, 429, 500, 408])
async def test_retryable_statuses_are_transient(echo: EchoBackend, status: int) -> None:
    faults = FaultInjector(fail_first=1, status=status)
    with serve_in_thread(make_app(echo, middlewares=(faults.middleware,))) as base_url:
        client = OpenAIClient(base_url, "echo-model")
        try:
            with pytest.raises(InferenceError) as info:
                await client.chat(HELLO, sampling=SamplingParams())
            # The next try gets through: exactly what the engine's retry relies on.
            assert (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"] == "olleh"
        finally:
            await client.close()
    assert info.value.transient and info.value.status == status
    assert "injected fault" in str(info.value)


def test_status_classification() -> None:
    assert [is_transient_status(s) for s in (400, 401, 403, 404, 408, 409, 422, 429, 500, 502, 503, 504)] == [
        False, False, False, False, True, True, False, True, True, True, True, True,
    ]  # fmt: skip
    error = error_for_status(401, b'{"error": {"message": "bad key"}}', "http://h/v1/chat/completions")
    assert not error.transient and error.status == 401 and "bad key" in str(error)
    assert "gateway" in str(error_for_status(502, b"<html>bad gateway</html>", "u"))


async def test_connection_refused_is_transient() -> None:
    client = OpenAIClient(f"http://127.0.0.1:{free_port()}/v1", "m")
    try:
        with pytest.raises(InferenceError) as info:
            await client.chat(HELLO, sampling=SamplingParams())
    finally:
        await client.close()
    assert info.value.transient and info.value.status is None


async def test_dns_failure_is_transient() -> None:
    client = OpenAIClient("http://no-such-host.invalid/v1", "m", timeout_s=10)
    try:
        with pytest.raises(InferenceError) as info:
            await client.chat(HELLO, sampling=SamplingParams())
    finally:
        await client.close()
    assert info.value.transient


async def test_timeout_is_transient(echo: EchoBackend) -> None:
    stall = Gate(after_first(1))  # the first request never gets an answer: it must time out
    with serve_in_thread(make_app(echo, middlewares=(stall.middleware,))) as base_url, stall:
        client = OpenAIClient(base_url, "echo-model", timeout_s=0.3)
        try:
            with pytest.raises(InferenceError) as info:
                await client.chat(HELLO, sampling=SamplingParams())
            assert str(info.value).startswith("no response from") and "for 0.3 s" in str(info.value)
            assert (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"] == "olleh"
        finally:
            await client.close()
    assert info.value.transient


async def test_server_killed_mid_run_then_restarted() -> None:
    with serve_in_subprocess() as server:
        port = server.port
        client = OpenAIClient(server.base_url, "echo")
        try:
            assert (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"] == "olleh"
            server.kill()
            with pytest.raises(InferenceError) as info:
                await client.chat(HELLO, sampling=SamplingParams())
            assert info.value.transient
            # Back on the same port: the same client recovers (stale keep-alive sockets included).
            with serve_in_subprocess(port=port):
                result = await with_retries(lambda: client.chat(HELLO, sampling=SamplingParams()))
                assert result[0].message["content"] == "olleh"
        finally:
            await client.close()


async def test_many_concurrent_calls_share_a_small_pool(url: str) -> None:
    client = OpenAIClient(url, "echo-model", max_connections=8)
    try:
        results = await asyncio.gather(
            *(
                client.chat([{"role": "user", "content": f"n{i}"}], sampling=SamplingParams())
                for i in range(200)
            )
        )
    finally:
        await client.close()
    assert [r[0].message["content"] for r in results] == [f"n{i}"[::-1] for i in range(200)]


async def test_api_key_sent_but_never_shown(echo: EchoBackend) -> None:
    secret = "sk-test-7f3a9c1e5b"
    headers = HeaderRecorder()
    with serve_in_thread(make_app(echo, middlewares=(headers.middleware,))) as base_url:
        client = OpenAIClient(base_url, "echo-model", api_key=secret, extra_headers={"X-Team": "rl"})
        try:
            await client.chat(HELLO, sampling=SamplingParams())
            bad = OpenAIClient(base_url, "not-served", api_key=secret)
            with pytest.raises(InferenceError) as info:
                await bad.chat(HELLO, sampling=SamplingParams())
            await bad.close()
        finally:
            await client.close()
    assert headers.seen[0]["Authorization"] == f"Bearer {secret}"
    assert headers.seen[0]["X-Team"] == "rl"
    for shown in (repr(client), str(client), repr(RoundRobinClient([client])), str(info.value)):
        assert secret not in shown


async def test_round_robin_spreads_calls() -> None:
    first, second = EchoBackend("echo-model"), EchoBackend("echo-model")
    with serve_in_thread(make_app(first)) as url_a, serve_in_thread(make_app(second)) as url_b:
        client = RoundRobinClient([OpenAIClient(url_a, "echo-model"), OpenAIClient(url_b, "echo-model")])
        try:
            for _ in range(10):
                await client.chat(HELLO, sampling=SamplingParams())
        finally:
            await client.close()
    assert (len(first.calls), len(second.calls)) == (5, 5)
    assert client.model == "echo-model"


async def test_round_robin_fails_over_to_healthy_replica() -> None:
    broken = FaultInjector(fail_rate=1.0)  # every request: 503
    healthy = EchoBackend("echo-model")
    with serve_in_thread(make_app(EchoBackend("echo-model"), middlewares=(broken.middleware,))) as url_a, \
            serve_in_thread(make_app(healthy)) as url_b:  # fmt: skip
        client = RoundRobinClient([OpenAIClient(url_a, "echo-model"), OpenAIClient(url_b, "echo-model")])
        try:
            for _ in range(10):
                result = await with_retries(lambda: client.chat(HELLO, sampling=SamplingParams()))
                assert result[0].message["content"] == "olleh"
        finally:
            await client.close()
    assert len(healthy.calls) == 10
    assert broken.requests == 1  # cooled down after its first failure


async def test_round_robin_over_killed_process_replica() -> None:
    with serve_in_subprocess() as a, serve_in_subprocess() as b:
        client = RoundRobinClient([OpenAIClient(a.base_url, "echo"), OpenAIClient(b.base_url, "echo")])
        try:
            await client.chat(HELLO, sampling=SamplingParams())
            a.kill()
            for _ in range(6):
                result = await with_retries(lambda: client.chat(HELLO, sampling=SamplingParams()))
                assert result[0].message["content"] == "olleh"
        finally:
            await client.close()


async def test_session_survives_close_and_reuse(url: str) -> None:
    client = OpenAIClient(url, "echo-model")
    await client.chat(HELLO, sampling=SamplingParams())
    await client.close()
    assert (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"] == "olleh"
    await client.close()


async def test_malformed_success_body_is_permanent() -> None:
    from aiohttp import web

    async def garbage(request: web.Request) -> web.Response:
        return web.Response(body=b'{"choices": "nope"}', content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", garbage)
    with serve_in_thread(app) as base_url:
        client = OpenAIClient(base_url, "m")
        try:
            with pytest.raises(InferenceError) as info:
                await client.chat(HELLO, sampling=SamplingParams())
        finally:
            await client.close()
    assert not info.value.transient and "malformed" in str(info.value)
