"""`serve_loopback`: a `Client` served as an OpenAI-compatible endpoint on a free 127.0.0.1 port.

For libraries that only speak HTTP (DSPy's LM, verifiers' clients): they call this endpoint and
Workbench's client does the work behind it — the tiny model in-process, an endpoint id or `-b` —
with its retries, timeouts and key handling (keys never reach the library).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from workbench.inference.client import Client
from workbench.inference.server import create_app


@dataclass
class Loopback:
    base_url: str  # http://127.0.0.1:PORT/v1
    runner: web.AppRunner

    async def close(self) -> None:
        await self.runner.cleanup()


async def serve_loopback(client: Client, served_model_name: str) -> Loopback:
    """Start serving `client` in the running event loop; close() stops it."""
    runner = web.AppRunner(create_app(client, served_model_name=served_model_name), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    return Loopback(f"http://127.0.0.1:{port}/v1", runner)
