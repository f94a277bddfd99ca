"""`HttpSession`: how `OpenAIClient` moves bytes, for every URL: one `aiohttp.ClientSession`.

One session (a `TCPConnector`: at most `max_connections` sockets, kept alive between requests)
per event loop, made lazily inside the running loop on the first request. A session belongs to
the loop it was made in, so a request from another loop (a second `asyncio.run`) gets a new one;
the old one cannot be closed from there and is dropped.

No request timeout of its own and no retries: `OpenAIClient` times a request out by its server's
silence (silence_watch.py) and the engine retries transient errors. One exception, at the
connection level: a POST whose connection the server closed before any byte of an answer came
back (typically a kept-alive socket whose keep-alive ran out on the server just as the request
went out) is sent once more, on a fresh connection. aiohttp does this itself for idempotent
methods only (RFC 9112 section 9.3.1); a chat completion is safe to send again, as the engine's
retry would anyway, and this way the race costs neither a try nor a backoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp
from yarl import URL

# Seconds an idle kept-alive socket is held: longer than any pause within a run's request stream.
KEEPALIVE_S = 60.0


class HttpSession:
    def __init__(self, headers: Mapping[str, str], *, max_connections: int, connect_timeout_s: float) -> None:
        self._headers = dict(headers)
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"HttpSession(max_connections={self.max_connections})"  # never the headers (the key)

    def _current(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_S
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                # No total timeout: OpenAIClient times a request out by the server's silence instead.
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
            )
            self._loop = loop
        return self._session

    async def request(self, method: str, url: URL, body: bytes | None = None) -> tuple[int, bytes]:
        """Send one request; the (status, body) of its answer, redirects followed. Transport
        failures are raised as aiohttp raises them (`openai_client.error_for_exception`)."""
        session = self._current()
        try:
            response = await session.request(method, url, data=body)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if method != "POST" or isinstance(exc, aiohttp.ClientConnectorError):
                raise  # a failed connect was never sent; GETs aiohttp has sent again already
            response = await session.request(method, url, data=body)  # see the module doc
        async with response:
            return response.status, await response.read()

    def is_open(self) -> bool:
        """Whether a session (and so possibly a kept-alive socket) is open."""
        return self._session is not None and not self._session.closed

    async def close(self) -> None:
        """Close the session and its sockets; the next request opens a new one."""
        if (
            self._session is not None
            and not self._session.closed
            and self._loop is asyncio.get_running_loop()
        ):
            await self._session.close()
        self._session = None
        self._loop = None
