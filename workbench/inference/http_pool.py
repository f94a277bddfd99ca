"""`HttpPool`: a lean keep-alive HTTP/1.1 client for plain-`http://` servers (a local vLLM,
`workbench serve`, the echo endpoint), built on asyncio protocols.

Why not aiohttp here: against a fast server the engine's CPU per rollout was mostly aiohttp's
request machinery (~0.3 ms of ~0.4 ms per request: multidict headers, payload objects, tracing
hooks, a reader/writer pair per response). This client does one `write` per request (head and
body in one buffer), parses only the response headers it needs (length, chunking, keep-alive,
encoding) and hands the body back as bytes. `OpenAIClient` uses it for `http://` URLs and keeps
aiohttp for everything else (TLS, credentials in the URL); see `http_transport.transport_for`. The
connection itself (protocol, response parser, errors) is http_connection.py.

Semantics kept from the aiohttp path: at most `max_connections` sockets, reused while the server
keeps them alive; a connect timeout; no request timeout of its own (the caller cancels, which
closes that request's socket). One thing added: a request sent on a *reused* connection that the
server had already closed (its keep-alive ran out while the socket sat idle) fails before any
byte comes back; it is sent again on a fresh connection instead of failing a rollout.

Failures are raised as `OSError`s (refused, reset, `ConnectError` for a failed connect,
`ConnectionClosed` for a close before the answer), `TimeoutError` (connect) or `BadResponse`;
`openai_client.error_for_exception` classifies them.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections import deque
from collections.abc import Mapping

from yarl import URL

from workbench.inference.http_connection import ConnectError, Connection, ConnectionClosed


def supports(url: str, headers: Mapping[str, str]) -> bool:
    """Whether `HttpPool` can serve requests to `url` with `headers`: plain http, no user info
    in the URL (aiohttp turns that into basic auth), and header lines that cannot break the head."""
    parsed = URL(url)
    if parsed.scheme != "http" or not parsed.host or parsed.user is not None or parsed.password is not None:
        return False
    return all(_safe(k) and _safe(v) for k, v in headers.items())


def _safe(text: str) -> bool:
    return "\r" not in text and "\n" not in text and text.isascii()


def _host_header(url: URL) -> str:
    host = url.raw_host or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return host if url.port == 80 else f"{host}:{url.port}"


class HttpPool:
    """Keep-alive connections to one `http://host:port`, at most `max_connections` at a time.

    Bound to the event loop of its first request; a later loop (a second `asyncio.run`) starts
    afresh, as the old loop's sockets cannot be used from it. See the module doc."""

    def __init__(
        self,
        origin: str,
        headers: Mapping[str, str],
        *,
        max_connections: int = 256,
        connect_timeout_s: float = 30.0,
    ) -> None:
        url = URL(origin)
        self.host = url.raw_host or ""
        self.port = url.port or 80
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s
        lines = [f"Host: {_host_header(url)}"] if not any(k.lower() == "host" for k in headers) else []
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self._header_block = ("\r\n".join(lines) + "\r\n").encode("ascii")
        self._heads: dict[tuple[str, str], bytes] = {}  # (method, url) -> request head but its Content-Length
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[Connection] = []
        self._waiters: deque[asyncio.Future[Connection | None]] = deque()
        self._count = 0  # connections open or being opened
        self._generation = 0  # bumped by close(): connections of an older one are closed when released

    def __repr__(self) -> str:
        return f"HttpPool(http://{self.host}:{self.port}, max_connections={self.max_connections})"  # never the headers

    async def request(self, method: str, url: str, body: bytes = b"") -> tuple[int, bytes]:
        """Send one request to `url` (on this pool's origin); (status, body) of the answer."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._reset(loop)
        head = self._heads.get((method, url))
        if head is None:
            head = self._heads[(method, url)] = self._head(method, url)
        if body or method != "GET":
            data = b"".join((head, b"Content-Length: %d\r\n\r\n" % len(body), body))
        else:  # as aiohttp: no Content-Length on a GET without a body
            data = head + b"\r\n"
        while True:
            conn, reused = await self._acquire()
            try:
                result = await conn.send(data)
            except ConnectionClosed as exc:
                self._release(conn)
                if reused and not exc.received_any:  # a keep-alive the server had ended: try a fresh socket
                    continue
                raise
            except BaseException:  # a cancel (the caller's timeout, Ctrl-C) or a bad answer
                conn.abort()
                self._release(conn)
                raise
            self._release(conn)
            return result

    def is_open(self) -> bool:
        """Whether any connection is open (or being opened)."""
        return self._count > 0

    async def close(self) -> None:
        """Close every idle connection; those in use close when their request ends. The pool
        stays usable: a later request opens a new connection."""
        self._generation += 1
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.idle = False
            conn.close()
            self._count -= 1

    # ----- the pool -----------------------------------------------------------------------
    def _head(self, method: str, url: str) -> bytes:
        target = URL(url).raw_path_qs or "/"
        return f"{method} {target} HTTP/1.1\r\n".encode("ascii") + self._header_block

    def _reset(self, loop: asyncio.AbstractEventLoop) -> None:
        # Connections of another (finished) loop cannot be closed from here: they are dropped
        # and closed by the garbage collector, as aiohttp does with a session of a dead loop.
        self._loop = loop
        self._idle = []
        self._waiters = deque()
        self._count = 0
        self._generation += 1

    async def _acquire(self) -> tuple[Connection, bool]:
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the least likely to have timed out
            conn.idle = False
            if conn.usable:
                return conn, True
            self._free_slot()
        if self._count < self.max_connections:
            self._count += 1
            return await self._connect(), False
        assert self._loop is not None
        waiter: asyncio.Future[Connection | None] = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            handed = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed over just as we were cancelled
                got = waiter.result()
                if got is not None:
                    self._release(got)
                else:
                    self._free_slot()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        if handed is not None and handed.usable:
            return handed, True
        if handed is not None:
            handed.close()
        return await self._connect(), False  # the slot is ours

    async def _connect(self) -> Connection:
        """A new connection in a slot already counted; the slot is given back on failure."""
        assert self._loop is not None
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await self._loop.create_connection(
                    lambda: Connection(self._loop, self._idle_closed), self.host, self.port
                )
            conn.generation = self._generation
        except BaseException as exc:
            self._free_slot()
            if isinstance(exc, OSError) and not isinstance(exc, ConnectError):
                raise ConnectError(_reason(exc), exc.errno) from exc
            raise
        return conn

    def _release(self, conn: Connection) -> None:
        if conn.generation != self._generation:  # opened before close() or on an older loop
            conn.close()
            if conn.loop is self._loop:
                self._free_slot()
            return
        if not conn.usable:
            if not conn.closed:
                conn.close()
            self._free_slot()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        conn.idle = True
        self._idle.append(conn)

    def _free_slot(self) -> None:
        """A connection is gone: its slot goes to the first waiter (to connect anew), else back."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._count -= 1

    def _idle_closed(self, conn: Connection) -> None:
        if conn.idle:
            conn.idle = False
            self._idle.remove(conn)
            self._free_slot()


def _reason(exc: OSError) -> str:
    """Why a connect failed, in words ("connection refused", "name or service not known"). asyncio's
    own message ("Connect call failed (host, port)") says only that it failed."""
    if isinstance(exc, socket.gaierror) or not exc.errno or exc.errno < 0:
        return (exc.strerror or str(exc) or type(exc).__name__).lower()
    return os.strerror(exc.errno).lower()
