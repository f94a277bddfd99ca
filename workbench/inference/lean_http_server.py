"""A minimal HTTP/1.1 server on asyncio protocols, for an endpoint whose per-request cost is the
whole measurement (the instant echo endpoint, echo_server.py).

Why not aiohttp's server: with an instant backend, aiohttp's request/response machinery was most
of the server's CPU per request, and on a 2-core machine the server shares the cores with the
engine being measured. This speaks just what OpenAI-compatible clients send: `Content-Length`
bodies (a chunked request body gets 411), keep-alive (HTTP/1.1 default, `Connection: close`
honoured, HTTP/1.0 closes), `Expect: 100-continue`, requests on one connection answered in order.
Every answer is JSON with a `Content-Length`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus

import orjson

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024  # as `workbench serve`: long multi-turn prompts with tool output


@dataclass(slots=True)
class Request:
    method: str
    path: str  # without the query string
    body: bytes


Handler = Callable[[Request], Awaitable[tuple[int, bytes]]]


def json_error(status: int, message: str) -> tuple[int, bytes]:
    """An OpenAI-style error answer."""
    return status, orjson.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": status}}
    )


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


_STATUS_LINES = {status.value: _status_line(status.value) for status in HTTPStatus}


class _ServerConnection(asyncio.Protocol):
    """One client connection: parse a request, await the handler, answer, repeat."""

    def __init__(self, handler: Handler, connections: set[_ServerConnection]) -> None:
        self._handler = handler
        self._connections = connections
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._busy = False  # a request is being handled: later bytes wait in the buffer
        self._task: asyncio.Future[None] | None = None
        self._closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._busy:
            self._next_request()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _next_request(self) -> None:
        buf = self._buffer
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                self._answer(*json_error(431, "request head too large"), keep_alive=False)
            return
        try:
            method, target, version = bytes(buf[:end].split(b"\r\n", 1)[0]).decode("latin-1").split(" ")
        except ValueError:
            self._answer(*json_error(400, "malformed request line"), keep_alive=False)
            return
        keep_alive = version == "HTTP/1.1"
        length, chunked, expect_continue = 0, False, False
        for line in bytes(buf[:end]).split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    self._answer(*json_error(400, "bad Content-Length"), keep_alive=False)
                    return
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"connection":
                token = value.strip().lower()
                keep_alive = token == b"keep-alive" or (keep_alive and token != b"close")
            elif name == b"expect":
                expect_continue = value.strip().lower() == b"100-continue"
        if chunked:
            self._answer(*json_error(411, "send the body with a Content-Length"), keep_alive=False)
            return
        if length > MAX_BODY_BYTES:
            self._answer(*json_error(413, f"body over {MAX_BODY_BYTES} bytes"), keep_alive=False)
            return
        if len(buf) < end + 4 + length:
            if expect_continue and len(buf) == end + 4 and self._transport is not None:
                self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        body = bytes(buf[end + 4 : end + 4 + length])
        del buf[: end + 4 + length]
        self._busy = True
        request = Request(method, target.split("?", 1)[0], body)
        # Held here: the loop keeps only a weak reference to a task.
        self._task = asyncio.ensure_future(self._handle(request, keep_alive))

    async def _handle(self, request: Request, keep_alive: bool) -> None:
        try:
            status, body = await self._handler(request)
        except Exception as exc:  # a handler bug answers 500; the server goes on
            status, body = json_error(500, f"{type(exc).__name__}: {exc}")
        self._answer(status, body, keep_alive=keep_alive)
        self._busy = False
        if keep_alive and self._buffer and self._transport is not None:
            self._next_request()

    def _answer(self, status: int, body: bytes, *, keep_alive: bool) -> None:
        transport = self._transport
        if transport is None or self._closing:
            return
        head = _STATUS_LINES.get(status) or _status_line(status)
        close = b"" if keep_alive else b"Connection: close\r\n"
        transport.write(
            b"".join(
                (
                    head,
                    b"Content-Type: application/json\r\nContent-Length: ",
                    str(len(body)).encode(),
                    b"\r\n",
                    close,
                    b"\r\n",
                    body,
                )
            )
        )
        if not keep_alive:
            self._closing = True
            transport.close()


async def serve(
    handler: Handler,
    *,
    host: str,
    port: int,
    stop: asyncio.Event,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve `handler` on host:port until `stop` is set; `on_ready` gets `http://host:PORT`."""
    loop = asyncio.get_running_loop()
    connections: set[_ServerConnection] = set()
    server = await loop.create_server(lambda: _ServerConnection(handler, connections), host, port)
    try:
        bound_port = server.sockets[0].getsockname()[1]
        url_host = f"[{host}]" if ":" in host else host
        if on_ready is not None:
            on_ready(f"http://{url_host}:{bound_port}")
        await stop.wait()
    finally:
        server.close()
        for conn in list(connections):
            conn.close()
        await server.wait_closed()
