"""Test helpers for the HTTP path: deterministic backends, fault injection, and real servers
on 127.0.0.1 (in a background thread, or in a separate process that a test can kill).

Run a server process by hand: `python -m tests.servers --port 8000 --backend echo`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from workbench.inference.echo import EchoClient
from workbench.inference.server import create_app, error_response, serve
from workbench.types import Completion, Messages, SamplingParams

REPO_ROOT = Path(__file__).resolve().parent.parent


class EchoBackend(EchoClient):
    """`EchoClient` that records every call (messages, sampling, tools) for assertions."""

    def __init__(self, model: str = "echo", *, mode: str = "reverse") -> None:
        super().__init__(model, mode=mode)  # type: ignore[arg-type]
        self.calls: list[tuple[Messages, SamplingParams, list[dict[str, Any]] | None]] = []

    async def chat(
        self, messages: Messages, *, sampling: SamplingParams, tools: list[dict[str, Any]] | None = None
    ) -> list[Completion]:
        self.calls.append((messages, sampling, tools))
        return await super().chat(messages, sampling=sampling, tools=tools)


class ScriptedBackend:
    """A `Client` whose answer (or exception) comes from `script(messages, sampling, tools)`."""

    def __init__(
        self,
        script: Callable[[Messages, SamplingParams, list[dict[str, Any]] | None], list[Completion]],
        model: str = "scripted",
    ) -> None:
        self.script = script
        self.model = model

    async def chat(
        self, messages: Messages, *, sampling: SamplingParams, tools: list[dict[str, Any]] | None = None
    ) -> list[Completion]:
        return self.script(messages, sampling, tools)

    async def close(self) -> None:
        return None


def raising(exc: BaseException) -> ScriptedBackend:
    """A backend that raises `exc` on every call."""

    def script(*_: Any) -> list[Completion]:
        raise exc

    return ScriptedBackend(script)


@dataclass
class FaultInjector:
    """aiohttp middleware that fails or stalls chat requests before the backend sees them.

    The first `fail_first` requests, then a `fail_rate` fraction (seeded), get `status`;
    the first `stall_first` requests sleep `stall_s` first (to trigger client timeouts).
    """

    fail_first: int = 0
    fail_rate: float = 0.0
    status: int = 503
    stall_first: int = 0
    stall_s: float = 30.0
    seed: int = 0
    path: str = "/v1/chat/completions"
    requests: int = 0
    failed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        if request.path != self.path:
            return await handler(request)
        self.requests += 1
        number = self.requests
        if number <= self.stall_first:
            await asyncio.sleep(self.stall_s)
        if number <= self.fail_first or (self.fail_rate and self._rng.random() < self.fail_rate):
            self.failed += 1
            return error_response(self.status, f"injected fault {self.status}", type_="server_error")
        return await handler(request)


@dataclass
class HeaderRecorder:
    """aiohttp middleware that keeps the headers of every request (to check auth)."""

    seen: list[dict[str, str]] = field(default_factory=list)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        self.seen.append(dict(request.headers))
        return await handler(request)


def make_app(client: Any, *, served_model_name: str | None = None, middlewares: tuple[Any, ...] = ()) -> web.Application:
    return create_app(client, served_model_name=served_model_name or client.model, middlewares=middlewares)


def slow_echo_app(delay_s: float) -> web.Application:
    """An echo server that takes `delay_s` per chat request (so a run is still going when stopped)."""

    @web.middleware
    async def delay(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        if request.path.endswith("/chat/completions"):
            await asyncio.sleep(delay_s)
        return await handler(request)

    return make_app(EchoBackend(), middlewares=(delay,))


@contextlib.contextmanager
def serve_in_thread(app: web.Application, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `app` on a free port from a background thread with its own event loop.
    Yields the base URL (`http://127.0.0.1:PORT`, no `/v1`)."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    def on_ready(url: str) -> None:
        box["url"] = url
        ready.set()

    async def main() -> None:
        box["loop"] = asyncio.get_running_loop()
        box["stop"] = asyncio.Event()
        await serve(app, host=host, port=0, stop=box["stop"], on_ready=on_ready, shutdown_timeout=0.5)

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced to the caller below
            box["error"] = exc
            ready.set()

    thread = threading.Thread(target=run, name="test-server", daemon=True)
    thread.start()
    if not ready.wait(15) or "error" in box:
        raise RuntimeError(f"test server did not start: {box.get('error')!r}")
    try:
        yield box["url"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(15)


@dataclass
class ServerProcess:
    """A server running in a child process; `kill()` simulates a crash."""

    proc: subprocess.Popen[str]
    base_url: str

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> int:
        """Graceful stop (SIGTERM); returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def _drain(stream: Any) -> None:
    with stream:  # closed at EOF, i.e. once the child is gone
        stream.read()


def start_process(args: list[str], *, env: dict[str, str] | None = None) -> ServerProcess:
    """Start `python ARGS` from the repo root and wait for the line announcing its URL."""
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), child_env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=REPO_ROOT, env=child_env, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # EOF ends the loop if the child dies first
        match = re.search(r"(http://[\w.\-\[\]:]+:\d+)", line)
        if match:
            # Drain the rest in the background so a chatty child never blocks on a full pipe.
            threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
            return ServerProcess(proc, match.group(1))
    proc.wait(10)
    proc.stdout.close()
    raise RuntimeError(f"server process exited with {proc.returncode} before announcing its URL")


def start_processes(args: list[str], count: int) -> list[ServerProcess]:
    """`count` copies of `python ARGS`, started concurrently (each imports torch: seconds)."""
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: start_process(args), range(count)))


@contextlib.contextmanager
def serve_in_subprocess(
    backend: str = "echo",
    *,
    model: str = "echo",
    port: int = 0,
    fail_first: int = 0,
    fail_rate: float = 0.0,
    fail_status: int = 503,
    stall_first: int = 0,
    stall_s: float = 30.0,
) -> Iterator[ServerProcess]:
    """Run `python -m tests.servers ...` in a child process; yields it (kill it at will)."""
    args = ["-m", "tests.servers", "--port", str(port), "--backend", backend, "--model", model,
            "--fail-first", str(fail_first), "--fail-rate", str(fail_rate), "--fail-status", str(fail_status),
            "--stall-first", str(stall_first), "--stall-s", str(stall_s)]  # fmt: skip
    server = start_process(args)
    try:
        yield server
    finally:
        server.kill()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run a test OpenAI-compatible server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--backend", choices=["echo", "model"], default="echo",
                        help="echo: workbench's EchoClient; model: a LocalClient over --model-path (LoRA enabled)")
    parser.add_argument("--model-path", default=None, help="model folder for --backend model")
    parser.add_argument("--delay-s", type=float, default=0.0, help="added latency per chat request (a slow network)")
    parser.add_argument("--fault-path", default="/v1/chat/completions", help="route the injected faults hit")
    parser.add_argument("--mode", choices=["reverse", "echo"], default="reverse", help="EchoClient mode")
    parser.add_argument("--model", default="echo")
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--fail-rate", type=float, default=0.0)
    parser.add_argument("--fail-status", type=int, default=503)
    parser.add_argument("--stall-first", type=int, default=0)
    parser.add_argument("--stall-s", type=float, default=30.0)
    args = parser.parse_args(argv)

    faults = FaultInjector(
        fail_first=args.fail_first, fail_rate=args.fail_rate, status=args.fail_status,
        stall_first=args.stall_first, stall_s=args.stall_s, path=args.fault_path,
    )  # fmt: skip
    active = args.fail_first or args.fail_rate or args.stall_first
    middlewares: list[Any] = [faults.middleware] if active else []
    if args.delay_s:

        @web.middleware
        async def delay(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
            if request.path.endswith("/chat/completions"):
                await asyncio.sleep(args.delay_s)
            return await handler(request)

        middlewares.append(delay)
    if args.backend == "model":
        from workbench.inference.local_client import LocalClient

        client: Any = LocalClient(Path(args.model_path), model_name=args.model)
        app = create_app(client, served_model_name=args.model, middlewares=middlewares, enable_lora=True)
    else:
        client = EchoClient(args.model, mode=args.mode)
        app = make_app(client, middlewares=tuple(middlewares))

    def announce(url: str) -> None:
        print(f"Serving model '{args.model}' at {url}/v1", flush=True)

    asyncio.run(serve(app, host=args.host, port=args.port, on_ready=announce))


if __name__ == "__main__":
    main()

