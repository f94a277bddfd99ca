"""The lean HTTP path (issue 19): `HttpPool`, OpenAIClient's keep-alive client for http:// URLs,
and the lean echo endpoint (`echo_server`), against real servers on 127.0.0.1.

Covered: answers, error statuses and their classification, a server that closes a kept-alive
connection (the request goes again on a fresh one) or closes before/mid answer (a transient
error, not retried blindly), the silence timeout and a ping timeout (a server the test holds with
a `Gate`, never a sleep), concurrency within `max_connections`, a cancel while waiting for a
connection, chunked / gzip / HTTP/1.0 answers, which transport a URL gets, and that the lean echo
server answers exactly as `workbench serve` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from tests.servers import EchoBackend, FaultInjector, Gate, after_first, make_app, serve_in_thread
from workbench.errors import InferenceError
from workbench.inference.echo import EchoClient
from workbench.inference.echo_server import serve_echo
from workbench.inference.http_connection import ConnectError
from workbench.inference.http_pool import HttpPool
from workbench.inference.http_transport import AiohttpTransport, LeanTransport, transport_for
from workbench.inference.openai_client import OpenAIClient
from workbench.types import SamplingParams

HELLO = [{"role": "user", "content": "hello"}]
REPLY = orjson.dumps(
    {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
    }
)

RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


# ----- helpers -------------------------------------------------------------------------------
async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request's head and body from a raw connection (None at EOF)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


def response(body: bytes, *, status: str = "200 OK", extra: bytes = b"") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


@contextlib.asynccontextmanager
async def raw_server(handle: RawHandler) -> AsyncIterator[str]:
    """A hand-scripted HTTP server in this test's loop; `handle` gets each connection and its number."""
    count = 0

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        count += 1
        try:
            await handle(reader, writer, count)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


@contextlib.contextmanager
def lean_echo_in_thread(client: Any | None = None) -> Iterator[str]:
    """The lean echo endpoint on a free port, served from a background thread (its own loop)."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()

        def on_ready(url: str) -> None:
            box["url"] = url
            ready.set()

        await serve_echo(
            client or EchoClient("echo-model"), host="127.0.0.1", port=0, stop=box["stop"], on_ready=on_ready
        )

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(15), "the lean echo server did not start"
    try:
        yield box["url"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(15)


def lean(client: OpenAIClient) -> HttpPool:
    transport = client._transport
    assert isinstance(transport, LeanTransport)
    return transport.pool


# ----- which transport -------------------------------------------------------------------------
def test_plain_http_gets_the_lean_client_and_the_rest_aiohttp() -> None:
    headers = {"Content-Type": "application/json"}
    kw: dict[str, Any] = {"max_connections": 4, "connect_timeout_s": 1.0}
    assert isinstance(transport_for("http://127.0.0.1:8000/v1", headers, **kw), LeanTransport)
    assert isinstance(transport_for("https://api.example.com/v1", headers, **kw), AiohttpTransport)
    assert isinstance(transport_for("http://user:pw@host/v1", headers, **kw), AiohttpTransport)
    assert isinstance(transport_for("http://host/v1", {"X-Bad": "a\r\nInjected: 1"}, **kw), AiohttpTransport)
    assert isinstance(transport_for("http://host/v1", headers, kind="aiohttp", **kw), AiohttpTransport)
    with pytest.raises(ValueError, match="plain http"):
        transport_for("https://api.example.com/v1", headers, kind="lean", **kw)
    secret = "sk-lean-4d2e"
    client = OpenAIClient("http://127.0.0.1:1/v1", "m", api_key=secret)
    assert isinstance(lean(client), HttpPool)
    assert secret not in repr(client._transport) and secret not in repr(client)


async def first_chat_error(base_url: str) -> InferenceError:
    """The InferenceError a fresh client's first chat to `base_url` raises."""
    client = OpenAIClient(base_url, "m")
    try:
        with pytest.raises(InferenceError) as info:
            await client.chat(HELLO, sampling=SamplingParams())
    finally:
        await client.close()
    return info.value


# ----- against the real (aiohttp) server --------------------------------------------------------
def peer_recorder(peers: set[Any]) -> Any:
    """An aiohttp middleware adding each request's client socket (host, port) to `peers`."""

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        assert request.transport is not None
        peers.add(request.transport.get_extra_info("peername"))
        return await handler(request)

    return record


async def test_answers_tokens_and_keep_alive(url: str, echo: EchoBackend) -> None:
    seen_peers: set[Any] = set()
    with serve_in_thread(make_app(echo, middlewares=(peer_recorder(seen_peers),))) as base_url:
        client = OpenAIClient(f"{base_url}/v1", "echo-model", return_tokens=True)
        try:
            for _ in range(5):
                [completion] = await client.chat(HELLO, sampling=SamplingParams())
            await client.ping()
        finally:
            await client.close()
    assert completion.message == {"role": "assistant", "content": "olleh"}
    assert completion.tokens is not None and completion.tokens.completion_ids == list(b"olleh")
    assert len(seen_peers) == 1  # one socket, kept alive across six requests


@pytest.mark.parametrize(
    ("status", "transient"), [(503, True), (429, True), (500, True), (401, False), (422, False)]
)
async def test_error_statuses(echo: EchoBackend, status: int, transient: bool) -> None:
    faults = FaultInjector(fail_first=1, status=status)
    with serve_in_thread(make_app(echo, middlewares=(faults.middleware,))) as base_url:
        client = OpenAIClient(base_url, "echo-model")
        try:
            with pytest.raises(InferenceError) as info:
                await client.chat(HELLO, sampling=SamplingParams())
            # The same connection serves the next request: an error answer does not end it.
            assert (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"] == "olleh"
        finally:
            await client.close()
    assert info.value.status == status and info.value.transient is transient
    assert f"HTTP {status}" in str(info.value) and "injected fault" in str(info.value)


async def test_connection_refused_is_transient_and_in_words() -> None:
    async with raw_server(lambda r, w, n: asyncio.sleep(0)) as base_url:
        pass  # closed: nothing listens on its port any more
    error = await first_chat_error(base_url)
    assert error.transient and "cannot connect to" in str(error) and "refused" in str(error)
    assert isinstance(error.__cause__, ConnectError)


async def test_silence_timeout_frees_the_connection(echo: EchoBackend) -> None:
    stall = Gate(after_first(1))  # the first request is never answered
    with serve_in_thread(make_app(echo, middlewares=(stall.middleware,))) as base_url, stall:
        client = OpenAIClient(base_url, "echo-model", timeout_s=0.3, max_connections=1)
        try:
            with pytest.raises(InferenceError, match="no response from") as info:
                await client.chat(HELLO, sampling=SamplingParams())
            assert info.value.transient
            client.timeout_s = 60  # however slow the machine, the next answer is not a timeout
            # The only slot was given back: the next request gets a fresh connection.
            assert (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"] == "olleh"
            assert lean(client)._count == 1
        finally:
            await client.close()


async def test_ping_timeout(echo: EchoBackend) -> None:
    hold = Gate(0, path="/models")  # GET /v1/models never answered
    with serve_in_thread(make_app(echo, middlewares=(hold.middleware,))) as base_url, hold:
        client = OpenAIClient(base_url, "echo-model")
        try:
            with pytest.raises(InferenceError, match="timed out") as info:
                await client.ping(timeout_s=0.2)
        finally:
            await client.close()
    assert info.value.transient


async def test_concurrency_stays_within_max_connections(echo: EchoBackend) -> None:
    peers: set[Any] = set()
    with serve_in_thread(make_app(echo, middlewares=(peer_recorder(peers),))) as base_url:
        client = OpenAIClient(base_url, "echo-model", max_connections=4)
        try:
            results = await asyncio.gather(
                *(
                    client.chat([{"role": "user", "content": f"m{i}"}], sampling=SamplingParams())
                    for i in range(150)
                )
            )
        finally:
            await client.close()
    assert [r[0].message["content"] for r in results] == [f"m{i}"[::-1] for i in range(150)]
    assert 1 <= len(peers) <= 4


async def test_cancel_while_waiting_for_a_connection(echo: EchoBackend) -> None:
    hold = Gate(0)  # every chat request waits until the test opens the gate
    with serve_in_thread(make_app(echo, middlewares=(hold.middleware,))) as base_url, hold:
        client = OpenAIClient(base_url, "echo-model", max_connections=1)
        pool = lean(client)
        try:
            first = asyncio.ensure_future(client.chat(HELLO, sampling=SamplingParams()))
            while hold.held < 1:  # the first request holds the only connection, at the server
                await asyncio.sleep(0.01)
            second = asyncio.ensure_future(client.chat(HELLO, sampling=SamplingParams()))
            while not pool._waiters:  # the second waits for that connection
                await asyncio.sleep(0)
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            hold.open()
            assert (await first)[0].message["content"] == "olleh"
            assert (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"] == "olleh"
            assert pool._count == 1 and not pool._waiters
        finally:
            await client.close()


async def test_reuse_after_close_and_on_a_new_loop(url: str) -> None:
    client = OpenAIClient(url, "echo-model")
    assert not client.connected
    await client.chat(HELLO, sampling=SamplingParams())
    assert client.connected  # kept alive
    await client.close()
    assert not client.connected
    assert (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"] == "olleh"

    def on_another_loop() -> str:
        async def call() -> str:
            return (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"]

        return asyncio.run(call())

    result = await asyncio.get_running_loop().run_in_executor(None, on_another_loop)
    assert result == "olleh"
    assert (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"] == "olleh"
    await client.close()
    assert not client.connected


# ----- hand-scripted servers ---------------------------------------------------------------------
async def test_a_kept_alive_connection_the_server_closed_is_replaced() -> None:
    """The server answers one request per connection without saying `Connection: close`, then
    closes on reading the next one (its keep-alive ran out): that request goes again, on a new
    connection, and the caller sees only the answer."""
    requests_seen: list[int] = []

    async def one_answer_per_connection(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        await read_request(reader)
        requests_seen.append(n)
        writer.write(response(REPLY))
        await writer.drain()
        await read_request(reader)  # the client reuses the connection: close it unanswered

    async with raw_server(one_answer_per_connection) as base_url:
        client = OpenAIClient(base_url, "m", max_connections=1)
        try:
            for _ in range(3):
                assert (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"] == "hi"
        finally:
            await client.close()
    assert requests_seen == [1, 2, 3]


async def test_a_fresh_connection_closed_unanswered_is_an_error_not_a_loop() -> None:
    async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)

    async with raw_server(close_at_once) as base_url:
        error = await first_chat_error(base_url)
    assert error.transient and "closed the connection before answering" in str(error)


async def test_a_half_sent_answer_is_an_error_and_not_sent_again() -> None:
    connections: list[int] = []

    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        connections.append(n)
        if n == 1:  # a first, complete answer: the connection is kept alive
            await read_request(reader)
            writer.write(response(REPLY))
            await writer.drain()
        await read_request(reader)
        writer.write(response(REPLY)[:-5])  # then an answer cut short

    async with raw_server(half) as base_url:
        client = OpenAIClient(base_url, "m", max_connections=1)
        try:
            await client.chat(HELLO, sampling=SamplingParams())
            with pytest.raises(InferenceError, match="closed the connection") as info:
                await client.chat(HELLO, sampling=SamplingParams())
        finally:
            await client.close()
    assert info.value.transient and connections == [1]


@pytest.mark.parametrize("style", ["chunked", "gzip", "http10", "connection-close", "continue"])
async def test_answer_framings(style: str) -> None:
    connections: list[int] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        connections.append(n)
        while await read_request(reader) is not None:
            if style == "chunked":
                body = (
                    b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (REPLY[:7], REPLY[7:]))
                    + b"0\r\n\r\n"
                )
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
            elif style == "gzip":
                writer.write(response(gzip.compress(REPLY), extra=b"Content-Encoding: gzip\r\n"))
            elif style == "http10":  # no length, no keep-alive: the body ends when the server closes
                writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + REPLY)
                return
            elif style == "connection-close":
                writer.write(response(REPLY, extra=b"Connection: close\r\n"))
                return
            else:  # an interim 100 Continue before the answer
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + response(REPLY))
            await writer.drain()

    async with raw_server(answer) as base_url:
        client = OpenAIClient(base_url, "m", max_connections=1)
        try:
            for _ in range(2):
                assert (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"] == "hi"
        finally:
            await client.close()
    closing = style in ("http10", "connection-close")
    assert connections == ([1, 2] if closing else [1])  # reused unless the server said it would close


async def test_a_redirect_is_followed_by_aiohttp_from_then_on() -> None:
    """The lean client does not follow redirects; aiohttp does (a 307 keeps the POST), so a URL
    that redirects is sent through aiohttp, as every request was before the lean client."""
    paths: list[bytes] = []

    async def redirect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (request := await read_request(reader)) is not None:
            line = request.split(b"\r\n", 1)[0]
            paths.append(line)
            if line.startswith(b"POST /old/"):
                writer.write(
                    response(
                        b"", status="307 Temporary Redirect", extra=b"Location: /new/v1/chat/completions\r\n"
                    )
                )
            else:
                writer.write(response(REPLY))
            await writer.drain()

    async with raw_server(redirect) as base_url:
        client = OpenAIClient(f"{base_url}/old/v1", "m")
        try:
            for _ in range(2):
                assert (await client.chat(HELLO, sampling=SamplingParams()))[0].message["content"] == "hi"
        finally:
            await client.close()
    old, new = b"POST /old/v1/chat/completions HTTP/1.1", b"POST /new/v1/chat/completions HTTP/1.1"
    assert paths == [old, old, new, old, new]  # lean once, then aiohttp (which follows) for that URL


async def test_garbage_is_a_transient_bad_response() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with raw_server(garbage) as base_url:
        error = await first_chat_error(base_url)
    assert error.transient and "bad HTTP response" in str(error)


async def test_request_head_carries_headers_and_path() -> None:
    heads: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (request := await read_request(reader)) is not None:
            heads.append(request.split(b"\r\n\r\n", 1)[0])
            writer.write(response(REPLY))
            await writer.drain()

    async with raw_server(record) as base_url:
        client = OpenAIClient(f"{base_url}/prefix/v1", "m", api_key="sk-x", extra_headers={"X-Team": "rl"})
        try:
            await client.chat(HELLO, sampling=SamplingParams())
            await client.ping()
        finally:
            await client.close()
    lines = heads[0].split(b"\r\n")
    assert lines[0] == b"POST /prefix/v1/chat/completions HTTP/1.1"
    assert any(line.startswith(b"Content-Length: ") for line in lines)
    get = heads[1].split(b"\r\n")
    assert get[0] == b"GET /prefix/v1/models HTTP/1.1" and not any(
        line.startswith(b"Content-Length") for line in get
    )
    port = base_url.rsplit(":", 1)[1]
    assert {
        b"Host: 127.0.0.1:" + port.encode(),
        b"Authorization: Bearer sk-x",
        b"X-Team: rl",
        b"Content-Type: application/json",
    } <= set(lines)


# ----- the lean echo endpoint --------------------------------------------------------------------
def _without_ids(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in ("id", "created")}


async def test_lean_echo_server_answers_as_workbench_serve() -> None:
    bodies = [
        {
            "model": "echo-model",
            "messages": HELLO,
            "logprobs": True,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "max_tokens": 3,
            "n": 2,
        },
        {
            "model": "echo-model",
            "messages": HELLO,
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        {"model": "other", "messages": HELLO},  # 404 model_not_found
        {"model": "echo-model", "messages": []},  # 400
    ]
    answers: dict[str, list[tuple[int, Any]]] = {}
    for kind, serving in (
        ("aiohttp", serve_in_thread(make_app(EchoClient("echo-model")))),
        ("lean", lean_echo_in_thread()),
    ):
        with serving as base_url:
            pool = HttpPool(base_url, {"Content-Type": "application/json"})
            got = [
                await pool.request("POST", f"{base_url}/v1/chat/completions", orjson.dumps(b)) for b in bodies
            ]
            got.append(await pool.request("POST", f"{base_url}/v1/chat/completions", b"not json"))
            got.append(await pool.request("GET", f"{base_url}/v1/models"))
            got.append(await pool.request("GET", f"{base_url}/health"))
            got.append(await pool.request("GET", f"{base_url}/nowhere"))
            got.append(
                await pool.request(
                    "POST",
                    f"{base_url}/v1/completions",
                    orjson.dumps({"prompt": [1, 2], "echo": True, "logprobs": 0}),
                )
            )
            await pool.close()
        answers[kind] = [(status, _without_ids(orjson.loads(body))) for status, body in got]
    assert answers["lean"] == answers["aiohttp"]
    assert [status for status, _ in answers["lean"]] == [200, 200, 404, 400, 400, 200, 200, 404, 400]


async def test_lean_echo_server_keep_alive_close_and_pipelining() -> None:
    with lean_echo_in_thread() as base_url:
        host, port = base_url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        body = orjson.dumps({"messages": HELLO})
        one = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
            len(body),
            body,
        )
        last = one.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")
        writer.write(one + one + last)  # three requests in one write: answered in order, then closed
        await writer.drain()
        data = await reader.read()  # EOF: the server closed after the third answer
        writer.close()
        statuses = [part.split(b"\r\n", 1)[0] for part in data.split(b"HTTP/1.1 ")[1:]]
        assert statuses == [b"200 OK"] * 3
        assert data.count(b'"content":"olleh"') == 3 and data.count(b"Connection: close") == 1

        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        await writer.drain()
        assert (await reader.read()).startswith(b"HTTP/1.1 411 ")
        writer.close()


async def test_openai_client_against_the_lean_echo_server_concurrently() -> None:
    with lean_echo_in_thread() as base_url:
        client = OpenAIClient(base_url, "echo-model", max_connections=8, return_tokens=True)
        try:
            await client.ping()
            results = await asyncio.gather(
                *(
                    client.chat([{"role": "user", "content": f"q{i}"}], sampling=SamplingParams())
                    for i in range(100)
                )
            )
        finally:
            await client.close()
    assert [r[0].message["content"] for r in results] == [f"q{i}"[::-1] for i in range(100)]
    assert results[0][0].tokens is not None and results[0][0].tokens.completion_ids == list(b"0q")
