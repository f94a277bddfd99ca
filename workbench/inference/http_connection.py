"""One keep-alive HTTP/1.1 client connection (`Connection`, an asyncio protocol) and the errors
the lean client raises; `HttpPool` (http_pool.py) keeps these connections. See http_pool.py for why.

A connection carries one request at a time (no pipelining). Its response parser reads only what
framing needs: the status, `Content-Length`, `Transfer-Encoding: chunked`, `Connection`, and
`Content-Encoding` (gzip/deflate are decoded; nothing asks for them, but a server may send them).
A body without a length ends when the server closes (HTTP/1.0 style).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable

MAX_HEAD_BYTES = 64 * 1024  # a response head larger than this is not an OpenAI server's
_NO_BODY_STATUSES = frozenset({204, 304})


class ConnectError(OSError):
    """The connection could not be made (refused, unreachable, DNS). `reason` says why in words."""

    def __init__(self, reason: str, errno: int | None = None) -> None:
        super().__init__(errno, reason)
        self.reason = reason


class ConnectionClosed(ConnectionError):
    """The server closed the connection before its answer was complete."""

    def __init__(self, received_any: bool) -> None:
        super().__init__("the server closed the connection before answering")
        self.received_any = received_any  # False: not one byte of an answer came back


class BadResponse(Exception):
    """The bytes that came back are not an HTTP/1.x response this client can read."""


class Connection(asyncio.Protocol):
    """One socket and the response to the one request in flight on it (no pipelining)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_idle_close: Callable[[Connection], None]) -> None:
        self.loop = loop
        self._on_idle_close = on_idle_close
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle = False  # sitting in the pool (set by the pool)
        self.generation = 0  # the pool's generation it was opened in (set by the pool)
        self.keep_alive = True  # the last response allows reuse
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._buffer = bytearray()
        self._received_any = False
        self._status = 0  # 0: the response head is not read yet
        self._length = -1  # Content-Length, -1 when absent
        self._chunked = False
        self._encoding = b""
        self._body = bytearray()  # chunked bodies only

    @property
    def usable(self) -> bool:
        return (
            not self.closed
            and self.keep_alive
            and self.transport is not None
            and not self.transport.is_closing()
        )

    # ----- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():  # nothing asked: a 408 on idle, or junk
            self.close()
            return
        self._received_any = True
        self._buffer += data
        try:
            self._parse()
        except (BadResponse, ValueError, zlib.error) as exc:
            self._fail(exc if isinstance(exc, BadResponse) else BadResponse(str(exc)))

    def eof_received(self) -> bool:
        return False  # let the transport close itself: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._status and self._length < 0 and not self._chunked:  # a body that ends at close
                self._finish(bytes(self._buffer))
            else:
                waiter.set_exception(ConnectionClosed(self._received_any))
        self._waiter = None
        if self.idle:
            self._on_idle_close(self)

    # ----- one exchange -------------------------------------------------------------------
    def send(self, data: bytes) -> asyncio.Future[tuple[int, bytes]]:
        """Write one whole request; the future gets (status, body)."""
        assert self.transport is not None
        self._waiter = waiter = self.loop.create_future()
        self._buffer.clear()
        self._received_any = False
        self._status = 0
        self.transport.write(data)
        return waiter

    def close(self) -> None:
        self.keep_alive = False
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Drop the socket at once (the caller gave up on the answer: its state is unknown)."""
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()

    def _parse(self) -> None:
        buf = self._buffer
        while not self._status:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise BadResponse("response head too large")
                return
            head = bytes(buf[:end])
            del buf[: end + 4]
            self._read_head(head)
        if self._chunked:
            self._parse_chunks()
        elif self._length >= 0:
            if len(buf) >= self._length:
                if len(buf) > self._length:  # bytes after the answer to a request not sent: not trusted
                    self.keep_alive = False
                self._finish(bytes(buf[: self._length]))
        elif self._status in _NO_BODY_STATUSES:
            self._finish(b"")
        # else: the body runs until the server closes (connection_lost finishes it)

    def _read_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status_line = lines[0]
        if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12:
            raise BadResponse(f"not an HTTP/1.x response: {status_line[:40]!r}")
        status = int(status_line[9:12])
        if 100 <= status < 200:  # 100 Continue and friends: a final answer follows
            return
        keep_alive = status_line[7:8] == b"1"  # HTTP/1.1 keeps alive unless told; 1.0 closes unless told
        length, chunked, encoding = -1, False, b""
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                token = value.strip().lower()
                keep_alive = token == b"keep-alive" or (keep_alive and token != b"close")
            elif name == b"content-encoding":
                encoding = value.strip().lower()
        self._status, self._chunked, self._encoding = status, chunked, encoding
        self._length = -1 if chunked else length
        self.keep_alive = keep_alive and (chunked or length >= 0 or status in _NO_BODY_STATUSES)
        self._body.clear()

    def _parse_chunks(self) -> None:
        buf = self._buffer
        while True:
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                return
            size = int(bytes(buf[:line_end]).split(b";", 1)[0].strip(), 16)
            if size == 0:  # the last chunk, then optional trailers, then an empty line
                rest = buf[line_end + 2 :]
                if rest.startswith(b"\r\n"):
                    trailing = 2
                else:
                    trailing = rest.find(b"\r\n\r\n")
                    if trailing < 0:
                        return
                    trailing += 4
                if len(rest) > trailing:
                    self.keep_alive = False
                self._finish(bytes(self._body))
                return
            if len(buf) < line_end + 2 + size + 2:
                return
            start = line_end + 2
            self._body += buf[start : start + size]
            del buf[: start + size + 2]

    def _finish(self, body: bytes) -> None:
        if self._encoding in (b"gzip", b"x-gzip", b"deflate"):
            body = zlib.decompress(body, 47)  # 32+15: zlib or gzip header, detected
        elif self._encoding not in (b"", b"identity"):
            raise BadResponse(f"unsupported content-encoding {self._encoding.decode(errors='replace')!r}")
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, body))
        if not self.keep_alive:
            self.close()

    def _fail(self, exc: BaseException) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.abort()
