"""The instant endpoint: `EchoClient` behind `workbench serve`'s own route handlers
(`OpenAIServer`: the same request validation, the same OpenAI-format JSON, vLLM's token-id
extras) on the lean HTTP server (lean_http_server.py) instead of aiohttp's.

What it is for: measuring the engine's own overhead (benchmarks/engine_overhead.py). With an
instant backend the server's HTTP layer is most of its CPU, and on a small machine that CPU is
taken from the engine being measured. Served routes: GET /health, GET /v1/models,
POST /v1/chat/completions, POST /v1/completions; anything else is the server's JSON 404. (LoRA
and weight-update routes are `workbench serve`'s only.)

    python -m workbench.inference.echo_server [--host 127.0.0.1] [--port 8000] [--model echo]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import Literal, cast

from aiohttp import web

from workbench.inference.client import Client
from workbench.inference.echo import EchoClient
from workbench.inference.lean_http_server import Request, serve
from workbench.inference.server import OpenAIServer

RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _BodyOnlyRequest:
    """What the served routes read of aiohttp's `web.Request`: the method, the path and the body."""

    __slots__ = ("method", "path", "_body")

    def __init__(self, request: Request) -> None:
        self.method = request.method
        self.path = request.path
        self._body = request.body

    async def read(self) -> bytes:
        return self._body


class EchoEndpoint:
    """A lean-server handler answering with `OpenAIServer`'s routes over `client`."""

    def __init__(self, client: Client, served_model_name: str) -> None:
        self.server = OpenAIServer(client, served_model_name)
        self._routes: dict[tuple[str, str], RouteHandler] = {
            ("GET", "/health"): self.server.health,
            ("GET", "/v1/models"): self.server.list_models,
            ("POST", "/v1/chat/completions"): self.server.chat_completions,
            ("POST", "/v1/completions"): self.server.completions,
        }

    async def __call__(self, request: Request) -> tuple[int, bytes]:
        handler = self._routes.get((request.method, request.path), self.server.not_found)
        # These routes touch nothing of the request but method, path and `read()` (tests/test_http_client.py
        # serves each of them through here), so a full aiohttp Request is not built.
        response = await handler(cast(web.Request, _BodyOnlyRequest(request)))
        body = cast(web.Response, response).body
        return response.status, body if isinstance(body, bytes) else b""


async def serve_echo(
    client: Client,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    stop: asyncio.Event,
    on_ready: Callable[[str], None] | None = None,
    served_model_name: str | None = None,
) -> None:
    """Serve `client` (normally an `EchoClient`) until `stop` is set; `on_ready` gets the base URL."""
    await serve(
        EchoEndpoint(client, served_model_name or client.model),
        host=host,
        port=port,
        stop=stop,
        on_ready=on_ready,
    )


def run_echo_server(
    host: str = "127.0.0.1",
    port: int = 8000,
    model: str = "echo",
    mode: Literal["reverse", "echo"] = "reverse",
) -> None:
    """Serve an `EchoClient` until SIGINT/SIGTERM (blocking); prints the URL once ready."""

    def announce(url: str) -> None:
        print(f"Serving model '{model}' at {url}/v1 (instant echo endpoint; Ctrl-C to stop)", flush=True)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_echo(EchoClient(model, mode=mode), host=host, port=port, stop=stop, on_ready=announce)

    asyncio.run(main())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the instant echo endpoint (OpenAI-compatible).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="echo")
    parser.add_argument("--mode", choices=["reverse", "echo"], default="reverse")
    args = parser.parse_args(argv)
    run_echo_server(args.host, args.port, args.model, args.mode)


if __name__ == "__main__":
    main()
