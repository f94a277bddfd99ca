"""The OpenAI-compatible server, over real HTTP on 127.0.0.1 (raw requests, no SDK)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from typing import Any

import aiohttp
import pytest

from tests.servers import (
    REPO_ROOT,
    EchoBackend,
    ScriptedBackend,
    make_app,
    raising,
    serve_in_thread,
    start_process,
)
from workbench.errors import InferenceError
from workbench.types import Completion

HELLO = [{"role": "user", "content": "hello"}]


async def post(url: str, body: Any, *, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        kwargs = {"data": raw} if raw is not None else {"json": body}
        async with session.post(f"{url}/v1/chat/completions", **kwargs) as response:
            return response.status, await response.json()


async def get(url: str, path: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}{path}") as response:
            return response.status, await response.json()


async def test_health(url: str) -> None:
    assert await get(url, "/health") == (200, {"status": "ok"})


async def test_models_lists_served_name(url: str) -> None:
    status, body = await get(url, "/v1/models")
    assert status == 200
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["echo-model"]
    assert body["data"][0]["object"] == "model"


async def test_unknown_route_is_json_404(url: str) -> None:
    status, body = await get(url, "/v1/nope")
    assert status == 404
    assert "message" in body["error"]


async def test_chat_completion_shape(url: str) -> None:
    status, body = await post(url, {"model": "echo-model", "messages": HELLO})
    assert status == 200
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == "echo-model"
    [choice] = body["choices"]
    assert choice["index"] == 0
    assert choice["message"] == {"role": "assistant", "content": "olleh"}
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"] is None
    assert "token_ids" not in choice and "prompt_token_ids" not in body
    usage = body["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5


async def test_model_may_be_omitted(url: str) -> None:
    status, body = await post(url, {"messages": HELLO})
    assert status == 200 and body["model"] == "echo-model"


async def test_token_ids_and_logprobs_vllm_style(url: str) -> None:
    request = {
        "model": "echo-model", "messages": HELLO, "logprobs": True,
        "return_tokens_as_token_ids": True, "return_token_ids": True,
    }  # fmt: skip
    status, body = await post(url, request)
    assert status == 200
    choice = body["choices"][0]
    assert choice["token_ids"] == list(b"olleh")
    assert body["prompt_token_ids"] == list(b"user: hello\n")
    content = choice["logprobs"]["content"]
    assert [entry["token"] for entry in content] == [f"token_id:{t}" for t in b"olleh"]
    assert all(isinstance(entry["logprob"], float) for entry in content)


async def test_logprobs_use_backend_token_text(url: str) -> None:
    status, body = await post(url, {"messages": HELLO, "logprobs": True})
    assert status == 200
    assert [e["token"] for e in body["choices"][0]["logprobs"]["content"]] == list("olleh")
    assert "token_ids" not in body["choices"][0]


async def test_sampling_params_reach_backend(url: str, echo: EchoBackend) -> None:
    request = {
        "messages": HELLO, "temperature": 0.5, "top_p": 0.9, "top_k": 20, "max_tokens": 7,
        "max_completion_tokens": 3, "stop": "x", "n": 2, "seed": 11, "min_p": 0.1,
    }  # fmt: skip
    status, body = await post(url, request)
    assert status == 200
    _, sampling, tools = echo.calls[-1]
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.5, 0.9, 20)
    assert sampling.max_tokens == 3  # max_completion_tokens wins over the deprecated max_tokens
    assert sampling.stop == ["x"] and sampling.n == 2 and sampling.seed == 11
    assert sampling.extra == {"min_p": 0.1}
    assert tools is None
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 6  # two choices of three tokens


async def test_tool_calls_in_choices(url: str, echo: EchoBackend) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}  # fmt: skip
    status, body = await post(url, {"messages": HELLO, "tools": [tool]})
    assert status == 200
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "lookup"
    assert call["function"]["arguments"] == '{"q":"hello"}'
    # tool_choice "none" means: no tools for this request.
    await post(url, {"messages": HELLO, "tools": [tool], "tool_choice": "none"})
    assert echo.calls[-1][2] is None


async def test_unknown_model_is_404(url: str) -> None:
    status, body = await post(url, {"model": "gpt-9", "messages": HELLO})
    assert status == 404
    assert "gpt-9" in body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"messages": []}', "messages"),
        (b'{"model": ["x"], "messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"messages": [{"content": "x"}]}', "role"),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', "temperature"),
        (b'{"messages": [{"role": "user", "content": "x"}], "stop": [1]}', "stop"),
        (b'{"messages": [{"role": "user", "content": "x"}], "n": 0}', "'n'"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": true}', "max_tokens"),
    ],
)
async def test_malformed_body_is_400(url: str, raw: bytes, needle: str) -> None:
    status, body = await post(url, None, raw=raw)
    assert status == 400
    assert needle in body["error"]["message"]


def test_streaming_with_the_official_openai_sdk(url: str) -> None:
    """`stream: true` as the openai SDK (and verifiers 0.4's harnesses, chat UIs) read it: chunks
    whose deltas join to the whole answer, the finish reason, usage last when asked."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="echo-model", messages=HELLO, stream=True, stream_options={"include_usage": True}, logprobs=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "olleh" and chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    logprobs = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert [e.token for e in logprobs] == list("olleh")  # token text, not ids, unless asked
    assert (
        chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    )
    plain = client.chat.completions.create(
        model="echo-model", messages=HELLO
    )  # and without stream, the same text
    assert plain.choices[0].message.content == text


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (InferenceError("prompt too long", transient=False), 400),
        (InferenceError("overloaded", transient=True), 503),
        (InferenceError("slow down", transient=True, status=429), 429),
        (RuntimeError("backend bug"), 500),
    ],
)
async def test_backend_errors_map_to_status(exc: Exception, status: int) -> None:
    with serve_in_thread(make_app(raising(exc))) as base_url:
        got, body = await post(base_url, {"messages": HELLO})
    assert got == status
    assert str(exc) in body["error"]["message"]


async def test_tool_call_arguments_are_wired_as_json_strings() -> None:
    # A backend may hand back parsed arguments; the wire format wants a JSON string.
    call = {"function": {"name": "f", "arguments": {"a": 1}}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    backend = ScriptedBackend(lambda *_: [Completion(message, "tool_calls")])
    with serve_in_thread(make_app(backend)) as base_url:
        status, body = await post(base_url, {"messages": HELLO})
    assert status == 200
    [wired] = body["choices"][0]["message"]["tool_calls"]
    assert wired == {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}


async def test_many_concurrent_requests(url: str) -> None:
    async with aiohttp.ClientSession() as session:

        async def one(i: int) -> str:
            body = {"messages": [{"role": "user", "content": f"m{i}"}]}
            async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                assert response.status == 200
                return (await response.json())["choices"][0]["message"]["content"]

        answers = await asyncio.gather(*(one(i) for i in range(300)))
    assert answers == [f"m{i}"[::-1] for i in range(300)]


def test_run_server_prints_url_and_stops_on_signal() -> None:
    code = (
        "from workbench.inference.echo import EchoClient; from workbench.inference.server import run_server; "
        "run_server(EchoClient('e'), port=0)"
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        server = start_process(["-c", code])
        try:
            assert server.base_url.startswith("http://127.0.0.1:")
            assert asyncio.run(get(server.base_url, "/health")) == (200, {"status": "ok"})
            server.proc.send_signal(sig)
            assert server.proc.wait(10) == 0
        finally:
            server.kill()


def test_http_modules_do_not_import_torch() -> None:
    # The server and clients run in processes (TUI, engine) that must start fast.
    code = (
        "import sys, workbench.inference.server, workbench.inference.openai_client, "
        "workbench.inference.endpoints, workbench.inference.echo; print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert out.stdout.strip() == "False"


def test_a_client_that_leaves_mid_request_is_not_an_error(caplog: pytest.LogCaptureFixture):
    """A Ctrl-C'd eval drops its connections half-sent: the server must not log a traceback."""
    import logging
    import socket
    import threading

    from aiohttp import web

    entered, finished = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    @web.middleware
    async def watch(request: web.Request, handler: Any) -> web.StreamResponse:
        """Tells the test when the chat handler starts and when it is done with the request."""
        if request.path != "/v1/chat/completions":
            return await handler(request)
        entered.set()
        try:
            response = await handler(request)
            outcome["status"] = response.status
            return response
        except BaseException as exc:
            outcome["raised"] = repr(exc)
            raise
        finally:
            finished.set()

    caplog.set_level(logging.ERROR, logger="aiohttp")
    with serve_in_thread(make_app(EchoBackend(), middlewares=(watch,))) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"model": '
            )
            assert entered.wait(30)  # the server is waiting for the rest of the body: now leave
        assert finished.wait(30), "the server never noticed the client left"
    # the server has shut down (its thread joined) after the handler ended by itself: all it
    # logged about the dropped connection is in caplog
    assert not [r for r in caplog.records if "Error handling request" in r.getMessage()], outcome


def test_a_real_models_logprobs_carry_token_text_ids_only_when_asked(tiny_model) -> None:
    """vLLM's form: `logprobs.content[].token` is the token's text; `token_id:N` only with
    `return_tokens_as_token_ids` (the tiny model served by LocalClient, read by the openai SDK)."""
    from openai import OpenAI

    from tests.servers import make_app, serve_in_thread
    from workbench.inference.local_client import LocalClient

    backend = LocalClient(str(tiny_model), model_name="tiny")
    with serve_in_thread(make_app(backend)) as base:
        client = OpenAI(base_url=f"{base}/v1", api_key="unused")
        answer = client.chat.completions.create(
            model="tiny", messages=HELLO, logprobs=True, max_tokens=8, temperature=0
        )
        ids = client.chat.completions.create(
            model="tiny", messages=HELLO, logprobs=True, max_tokens=8, temperature=0,
            extra_body={"return_tokens_as_token_ids": True},
        )  # fmt: skip
    tokens = [e.token for e in answer.choices[0].logprobs.content]
    assert tokens and not any(t.startswith("token_id:") for t in tokens)
    assert "".join(tokens).startswith((answer.choices[0].message.content or "")[:4])
    assert all(e.token.startswith("token_id:") for e in ids.choices[0].logprobs.content)


def test_top_logprobs_from_a_real_model(tiny_model) -> None:
    """`top_logprobs=k`: each token's k most likely alternatives (text and logprob), most likely
    first, the sampled token among them when it is the greedy choice (temperature 0)."""
    from openai import OpenAI

    from tests.servers import make_app, serve_in_thread
    from workbench.inference.local_client import LocalClient

    backend = LocalClient(str(tiny_model), model_name="tiny")
    with serve_in_thread(make_app(backend)) as base:
        client = OpenAI(base_url=f"{base}/v1", api_key="unused")
        answer = client.chat.completions.create(
            model="tiny", messages=HELLO, logprobs=True, top_logprobs=3, max_tokens=6, temperature=0
        )
        plain = client.chat.completions.create(
            model="tiny", messages=HELLO, logprobs=True, max_tokens=6, temperature=0
        )
    content = answer.choices[0].logprobs.content
    assert content and all(len(e.top_logprobs) == 3 for e in content)
    for entry in content:
        values = [alt.logprob for alt in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the sampled token is the most likely
        assert abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-4
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)  # none unless asked
