"""OpenAIClient at the connection level (its one aiohttp session, http_session.py), against real
servers on 127.0.0.1: `workbench serve`'s aiohttp app, and, for what a well-behaved server never
does (garbage, answers cut short, resets, HTTP/1.0), small hand-scripted asyncio servers.

Covered: keep-alive (one socket for many requests, error answers included), concurrency within
`max_connections`, the silence timeout and a ping timeout freeing their connection (servers the
test holds with a `Gate`, never a sleep), a cancel while waiting for a connection, reuse after
`close()` and from another event loop, a server that closes a kept-alive connection as the next
request arrives (sent again, once, on a fresh one), closes or resets before answering, or cuts an
answer short (transient errors), chunked / gzip / HTTP/1.0 / `Connection: close` / 100-continue
answers, redirects, garbage, and the request's path and headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.servers import EchoBackend, FaultInjector, Gate, after_first, make_app, serve_in_thread
from workbench.errors import InferenceError
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
    """One request's head and body from a raw connection (None at EOF or a reset)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionResetError):
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


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (RST), not an orderly FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


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


async def chat_text(client: OpenAIClient, text: str = "hello") -> str:
    [completion] = await client.chat([{"role": "user", "content": text}], sampling=SamplingParams())
    return str(completion.message["content"])


async def first_chat_error(base_url: str) -> InferenceError:
    """The InferenceError a fresh client's first chat to `base_url` raises."""
    client = OpenAIClient(base_url, "m")
    try:
        with pytest.raises(InferenceError) as info:
            await client.chat(HELLO, sampling=SamplingParams())
    finally:
        await client.close()
    return info.value


def peer_recorder(peers: list[Any]) -> Any:
    """An aiohttp middleware appending each request's client socket (host, port) to `peers`."""

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        return await handler(request)

    return record


# ----- against the real (aiohttp) server --------------------------------------------------------
async def test_answers_tokens_and_keep_alive(echo: EchoBackend) -> None:
    peers: list[Any] = []
    with serve_in_thread(make_app(echo, middlewares=(peer_recorder(peers),))) as base_url:
        client = OpenAIClient(f"{base_url}/v1", "echo-model", return_tokens=True)
        try:
            for _ in range(5):
                [completion] = await client.chat(HELLO, sampling=SamplingParams())
            await client.ping()
        finally:
            await client.close()
    assert completion.message == {"role": "assistant", "content": "olleh"}
    assert completion.tokens is not None and completion.tokens.completion_ids == list(b"olleh")
    assert len(peers) == 6 and len(set(peers)) == 1  # one socket, kept alive across six requests


@pytest.mark.parametrize(("status", "transient"), [(503, True), (401, False), (422, False)])
async def test_an_error_answer_keeps_the_connection(echo: EchoBackend, status: int, transient: bool) -> None:
    faults = FaultInjector(fail_first=1, status=status)
    peers: list[Any] = []
    app = make_app(echo, middlewares=(peer_recorder(peers), faults.middleware))
    with serve_in_thread(app) as base_url:
        client = OpenAIClient(base_url, "echo-model")
        try:
            with pytest.raises(InferenceError) as info:
                await client.chat(HELLO, sampling=SamplingParams())
            assert await chat_text(client) == "olleh"
        finally:
            await client.close()
    assert info.value.status == status and info.value.transient is transient
    assert f"HTTP {status}" in str(info.value) and "injected fault" in str(info.value)
    assert len(peers) == 2 and len(set(peers)) == 1  # the error answer did not end the connection


async def test_connection_refused_is_transient_and_in_words() -> None:
    async with raw_server(lambda r, w, n: asyncio.sleep(0)) as base_url:
        pass  # closed: nothing listens on its port any more
    error = await first_chat_error(base_url)
    assert error.transient and f"cannot connect to {base_url}/v1/chat/completions: connection refused" in str(
        error
    )
    assert isinstance(error.__cause__, aiohttp.ClientConnectorError)


async def test_silence_timeout_frees_the_connection(echo: EchoBackend) -> None:
    stall = Gate(after_first(1))  # the first request is never answered
    with serve_in_thread(make_app(echo, middlewares=(stall.middleware,))) as base_url, stall:
        client = OpenAIClient(base_url, "echo-model", timeout_s=0.3, max_connections=1)
        try:
            with pytest.raises(InferenceError, match="no response from") as info:
                await client.chat(HELLO, sampling=SamplingParams())
            assert info.value.transient
            client.timeout_s = 60  # however slow the machine, the next answer is not a timeout
            # The only connection slot was given back: the next request gets through.
            assert await chat_text(client) == "olleh"
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
    peers: list[Any] = []
    with serve_in_thread(make_app(echo, middlewares=(peer_recorder(peers),))) as base_url:
        client = OpenAIClient(base_url, "echo-model", max_connections=4)
        try:
            results = await asyncio.gather(*(chat_text(client, f"m{i}") for i in range(150)))
        finally:
            await client.close()
    assert results == [f"m{i}"[::-1] for i in range(150)]
    assert 1 <= len(set(peers)) <= 4


async def test_cancel_while_waiting_for_a_connection(echo: EchoBackend) -> None:
    hold = Gate(0)  # every chat request waits until the test opens the gate
    with serve_in_thread(make_app(echo, middlewares=(hold.middleware,))) as base_url, hold:
        client = OpenAIClient(base_url, "echo-model", max_connections=1)
        try:
            first = asyncio.ensure_future(chat_text(client))
            while hold.held < 1:  # the first request holds the only connection, at the server
                await asyncio.sleep(0.01)
            second = asyncio.ensure_future(chat_text(client))
            for _ in range(10):  # let it reach the connection queue (wherever it is, it is cancelled)
                await asyncio.sleep(0)
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            hold.open()
            assert await first == "olleh"
            assert await chat_text(client) == "olleh"  # the cancelled waiter took no slot with it
        finally:
            await client.close()
    assert hold.held == 1  # the cancelled request never reached the server


async def test_reuse_after_close_and_on_a_new_loop(url: str) -> None:
    client = OpenAIClient(url, "echo-model")
    assert not client.connected
    await client.chat(HELLO, sampling=SamplingParams())
    assert client.connected  # kept alive
    await client.close()
    assert not client.connected
    assert await chat_text(client) == "olleh"

    def on_another_loop() -> str:
        async def call() -> str:
            try:
                return await chat_text(client)
            finally:
                await client.close()  # that loop's session, closed in that loop

        return asyncio.run(call())

    assert await asyncio.get_running_loop().run_in_executor(None, on_another_loop) == "olleh"
    assert await chat_text(client) == "olleh"
    await client.close()
    assert not client.connected


async def test_a_redirect_is_followed(echo: EchoBackend) -> None:
    @web.middleware
    async def moved(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/old/"):  # 307: the POST and its body go again, to the new place
            raise web.HTTPTemporaryRedirect(request.path.removeprefix("/old"))
        return await handler(request)

    with serve_in_thread(make_app(echo, middlewares=(moved,))) as base_url:
        client = OpenAIClient(f"{base_url}/old/v1", "echo-model")
        try:
            assert [await chat_text(client) for _ in range(2)] == ["olleh", "olleh"]
        finally:
            await client.close()
    assert len(echo.calls) == 2


@pytest.mark.parametrize("compressed", [False, True])
async def test_chunked_and_gzip_answers(echo: EchoBackend, compressed: bool) -> None:
    @web.middleware
    async def reframe(request: web.Request, handler: Any) -> web.StreamResponse:
        answer = await handler(request)
        assert isinstance(answer, web.Response) and isinstance(answer.body, bytes)
        framed = web.StreamResponse(status=answer.status, headers={"Content-Type": "application/json"})
        if compressed:
            framed.enable_compression(web.ContentCoding.gzip)
        framed.enable_chunked_encoding()
        await framed.prepare(request)
        for start in range(0, len(answer.body), 7):  # several chunks
            await framed.write(answer.body[start : start + 7])
        await framed.write_eof()
        return framed

    peers: list[Any] = []
    with serve_in_thread(make_app(echo, middlewares=(peer_recorder(peers), reframe))) as base_url:
        client = OpenAIClient(base_url, "echo-model", max_connections=1)
        try:
            assert [await chat_text(client) for _ in range(2)] == ["olleh", "olleh"]
        finally:
            await client.close()
    assert len(peers) == 2 and len(set(peers)) == 1  # a chunked answer keeps the connection


# ----- hand-scripted servers ---------------------------------------------------------------------
async def test_a_kept_alive_connection_the_server_closed_is_replaced() -> None:
    """The server answers one request per connection without saying `Connection: close`, then
    closes on reading the next one (its keep-alive ran out just as the request came): that request
    goes again, once, on a new connection, and the caller sees only the answer."""
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
            assert [await chat_text(client) for _ in range(3)] == ["hi"] * 3
        finally:
            await client.close()
    assert requests_seen == [1, 2, 3]


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_server_that_drops_every_request_is_an_error_not_a_loop(how: str) -> None:
    connections: list[int] = []

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        connections.append(n)
        await read_request(reader)
        if how == "reset":
            reset(writer)

    async with raw_server(drop) as base_url:
        error = await first_chat_error(base_url)
    assert error.transient
    if how == "close":
        assert "closed the connection before answering" in str(error)
    else:
        assert "reset by peer" in str(error)
    assert connections == [1, 2]  # sent once more on a fresh connection, then given up


async def test_a_reset_kept_alive_connection_is_replaced() -> None:
    async def reset_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(response(REPLY))
        await writer.drain()
        await read_request(reader)
        reset(writer)

    async with raw_server(reset_second) as base_url:
        client = OpenAIClient(base_url, "m", max_connections=1)
        try:
            assert [await chat_text(client) for _ in range(3)] == ["hi"] * 3
        finally:
            await client.close()


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
            with pytest.raises(InferenceError, match="incomplete answer from") as info:
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
            assert [await chat_text(client) for _ in range(2)] == ["hi", "hi"]
        finally:
            await client.close()
    closing = style in ("http10", "connection-close")
    assert connections == ([1, 2] if closing else [1])  # reused unless the server said it would close


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
    post, get = (head.split(b"\r\n") for head in heads)
    assert post[0] == b"POST /prefix/v1/chat/completions HTTP/1.1"
    assert get[0] == b"GET /prefix/v1/models HTTP/1.1"
    port = base_url.rsplit(":", 1)[1].encode()
    expected = {b"Host: 127.0.0.1:" + port, b"Authorization: Bearer sk-x", b"X-Team: rl"}
    assert expected | {b"Content-Type: application/json"} <= set(post) and expected <= set(get)
    assert any(line.startswith(b"Content-Length: ") for line in post)
