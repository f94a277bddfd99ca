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
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import orjson
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


def make_app(
    client: Any, *, served_model_name: str | None = None, middlewares: tuple[Any, ...] = ()
) -> web.Application:
    return create_app(client, served_model_name=served_model_name or client.model, middlewares=middlewares)


def wait_until(predicate: Callable[[], Any], timeout: float = 300, what: str = "condition") -> None:
    """Poll for a state the test has arranged to come (e.g. a file its held run must write);
    the timeout only bounds a failure, it never decides an outcome."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout}s")
        time.sleep(0.02)


_PASS, _DROP = "pass", "drop"


class Gate:
    """aiohttp middleware: a server the test holds open, so a run is provably mid-flight when the
    test interrupts it (never "slow enough", whatever the machine's load).

    Each request to a path ending in `path` (chat completions by default) has its JSON body
    (`{}` for a GET) go to `admit(body)`: admitted requests reach the backend at
    once; the others wait, without an answer, until the test lets them through (`allow`, `open`).
    `admit` may be an int k: the first k chat requests. A test waits for `held` (how many have had
    to wait) with `wait_held`, then signals the run; leaving the `with gate:` block answers every
    request still waiting with a 503 that never reaches the backend (their client is gone), so
    a backend's own request count stays exact.
    """

    def __init__(
        self, admit: Callable[[dict[str, Any]], bool] | int = 0, *, path: str = "/chat/completions"
    ) -> None:
        self._admit = first_requests(admit) if isinstance(admit, int) else admit
        self.path = path
        self._cond = threading.Condition()
        self._waiting: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[str]]] = deque()
        self._open = False
        self._credits = 0
        self.passed = 0  # requests that reached the backend
        self.held = 0  # requests that had to wait (in total)
        self.dropped = 0  # waiting requests answered 503 by `open(drop_held=True)`

    @property
    def waiting(self) -> int:
        """Requests waiting now."""
        with self._cond:
            return len(self._waiting)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        if not request.path.endswith(self.path):
            return await handler(request)
        try:
            raw = await request.read()  # aiohttp keeps the bytes for the handler
            body = orjson.loads(raw) if raw else {}  # {}: a GET (e.g. the client's /v1/models preflight)
        except (ConnectionResetError, orjson.JSONDecodeError):
            return await handler(request)  # the server's own answer to a broken request
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[str] | None = None
        with self._cond:
            if self._open or (isinstance(body, dict) and self._admit(body)):
                verdict = _PASS
            elif self._credits > 0:
                self._credits -= 1
                verdict = _PASS
            else:
                waiter = loop.create_future()
                self._waiting.append((loop, waiter))
                self.held += 1
                self._cond.notify_all()
        if waiter is not None:
            try:
                verdict = await waiter
            finally:
                with self._cond:
                    if (loop, waiter) in self._waiting:
                        self._waiting.remove((loop, waiter))
        if verdict == _DROP:
            with self._cond:
                self.dropped += 1
            return error_response(503, "dropped by the test's gate", type_="server_error")
        with self._cond:
            self.passed += 1
            self._cond.notify_all()
        return await handler(request)

    def wait_held(
        self, count: int = 1, timeout: float = 300, *, proc: subprocess.Popen[Any] | None = None
    ) -> None:
        """Block until `count` requests in total have had to wait (the run is stuck at the gate).
        With `proc` (the run), fail at once, with its output, if it exits first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.held < count:
                if proc is not None and proc.poll() is not None:
                    out, err = proc.communicate()
                    raise AssertionError(
                        f"the run exited with {proc.returncode} before {count} request(s) reached "
                        f"the gate (passed {self.passed}):\n{out or ''}{err or ''}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{count} request(s) never reached the gate within {timeout}s "
                        f"(passed {self.passed}, held {self.held})"
                    )
                self._cond.wait(min(left, 0.1))

    def allow(self, count: int) -> None:
        """Let `count` more requests through: the oldest waiting ones first, then the next arrivals."""
        with self._cond:
            while count and self._waiting:
                self._resolve(self._waiting.popleft(), _PASS)
                count -= 1
            self._credits += count

    def open(self, *, drop_held: bool = False) -> None:
        """Let every request through from now on; those waiting are answered (or dropped: 503)."""
        with self._cond:
            self._open = True
            while self._waiting:
                self._resolve(self._waiting.popleft(), _DROP if drop_held else _PASS)

    @staticmethod
    def _resolve(entry: tuple[asyncio.AbstractEventLoop, asyncio.Future[str]], verdict: str) -> None:
        loop, waiter = entry

        def settle() -> None:
            if not waiter.done():
                waiter.set_result(verdict)

        with contextlib.suppress(RuntimeError):  # the server's loop is already closed
            loop.call_soon_threadsafe(settle)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.open(drop_held=True)


def first_requests(count: int) -> Callable[[dict[str, Any]], bool]:
    """`Gate` admission: the first `count` chat requests."""
    seen = 0

    def admit(body: dict[str, Any]) -> bool:
        nonlocal seen
        seen += 1
        return seen <= count

    return admit


def after_first(count: int) -> Callable[[dict[str, Any]], bool]:
    """`Gate` admission: every chat request but the first `count` (which never get an answer:
    a stalled server, to trigger client timeouts whatever the machine's load)."""
    seen = 0

    def admit(body: dict[str, Any]) -> bool:
        nonlocal seen
        seen += 1
        return seen > count

    return admit


def last_user_text(body: dict[str, Any]) -> str:
    """The text of a chat request's last user message."""
    users = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    return content if isinstance(content, str) else orjson.dumps(content).decode()


def first_prompts(count: int) -> Callable[[dict[str, Any]], bool]:
    """`Gate` admission: every request whose last user message is one of the first `count`
    distinct ones seen, i.e. all rollouts of the first `count` examples (groups) to arrive."""
    prompts: list[str] = []

    def admit(body: dict[str, Any]) -> bool:
        text = last_user_text(body)
        if text not in prompts and len(prompts) < count:
            prompts.append(text)
        return text in prompts

    return admit


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
    parser.add_argument(
        "--backend",
        choices=["echo", "model"],
        default="echo",
        help="echo: workbench's EchoClient; model: a LocalClient over --model-path (LoRA enabled)",
    )
    parser.add_argument("--model-path", default=None, help="model folder for --backend model")
    parser.add_argument(
        "--delay-s", type=float, default=0.0, help="added latency per chat request (a slow network)"
    )
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
