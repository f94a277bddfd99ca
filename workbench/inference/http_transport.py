"""How `OpenAIClient` moves bytes: one `Transport` protocol, two implementations.

- `LeanTransport`: the lean keep-alive client (`HttpPool`, http_pool.py) for plain `http://`
  servers (a local vLLM, `workbench serve`, the echo endpoint), where per-request CPU decides
  rollouts/s. A URL that answers with a redirect is handed to aiohttp from then on, which follows
  it as it always did.
- `AiohttpTransport`: aiohttp, for everything else (`https://` and its certificate checks,
  credentials in the URL, header values the lean client will not write), or when asked for.

Neither retries nor times a request out: `OpenAIClient` does (silence watchdog, engine retries),
and classifies what they raise (`openai_client.error_for_exception`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Literal, Protocol

import aiohttp

from workbench.inference import http_pool

TransportKind = Literal["auto", "lean", "aiohttp"]
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class Transport(Protocol):
    async def request(self, method: str, url: str, body: bytes = b"") -> tuple[int, bytes]:
        """Send one request; the (status, body) of the answer. Raises transport errors as they are."""
        ...

    async def close(self) -> None:
        """Close idle connections; the transport stays usable."""
        ...

    def is_open(self) -> bool:
        """Whether it holds any connection (or session) open."""
        ...


class AiohttpTransport:
    """An aiohttp session made lazily in the running loop and reused (keep-alive)."""

    def __init__(self, headers: Mapping[str, str], *, max_connections: int, connect_timeout_s: float) -> None:
        self._headers = dict(headers)
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"AiohttpTransport(max_connections={self.max_connections})"  # never the headers (the key)

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            # A session is bound to the loop it was made in; a new loop (e.g. a second
            # asyncio.run) needs a new session. The old loop's session cannot be closed
            # from here, so it is dropped.
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, limit_per_host=0, keepalive_timeout=60
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                # No total timeout: OpenAIClient times a request out by the server's silence instead.
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
            )
            self._session_loop = loop
        return self._session

    async def request(self, method: str, url: str, body: bytes = b"") -> tuple[int, bytes]:
        session = self._get_session()
        async with session.request(method, url, data=body if method != "GET" else None) as response:
            return response.status, await response.read()

    def is_open(self) -> bool:
        return self._session is not None and not self._session.closed

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            if self._session_loop is asyncio.get_running_loop():
                await self._session.close()
        self._session = None
        self._session_loop = None


class LeanTransport:
    """`HttpPool`, with aiohttp behind it for the URLs that redirect (the pool does not follow)."""

    def __init__(
        self, base_url: str, headers: Mapping[str, str], *, max_connections: int, connect_timeout_s: float
    ) -> None:
        self.pool = http_pool.HttpPool(
            base_url, headers, max_connections=max_connections, connect_timeout_s=connect_timeout_s
        )
        self._fallback = AiohttpTransport(
            headers, max_connections=max_connections, connect_timeout_s=connect_timeout_s
        )
        self._redirected: set[str] = set()  # URLs sent to aiohttp

    def __repr__(self) -> str:
        return f"LeanTransport({self.pool!r})"

    async def request(self, method: str, url: str, body: bytes = b"") -> tuple[int, bytes]:
        if url not in self._redirected:
            status, payload = await self.pool.request(method, url, body)
            if status not in REDIRECTS:
                return status, payload
            self._redirected.add(url)
        return await self._fallback.request(method, url, body)

    def is_open(self) -> bool:
        return self.pool.is_open() or self._fallback.is_open()

    async def close(self) -> None:
        await self.pool.close()
        await self._fallback.close()


def transport_for(
    base_url: str,
    headers: Mapping[str, str],
    *,
    max_connections: int,
    connect_timeout_s: float,
    kind: TransportKind = "auto",
) -> Transport:
    """The lean pool where it can serve `base_url` (kind "auto"), else aiohttp. Kind "lean"
    insists on the pool (a ValueError where it cannot), "aiohttp" on aiohttp."""
    lean_ok = http_pool.supports(base_url, headers)
    if kind == "lean" and not lean_ok:
        # The URL is not shown: it may carry credentials.
        raise ValueError("the lean HTTP client serves plain http:// URLs without credentials only")
    if kind != "aiohttp" and lean_ok:
        return LeanTransport(
            base_url, headers, max_connections=max_connections, connect_timeout_s=connect_timeout_s
        )
    return AiohttpTransport(headers, max_connections=max_connections, connect_timeout_s=connect_timeout_s)
