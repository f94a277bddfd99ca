"""`AsyncBridge`: an event loop in a background thread, so synchronous code can await coroutines.

The `gepa` library is synchronous (it calls `adapter.evaluate` and the reflection LM as plain
functions) while the engine and every `Client` are async. GEPA runs on the calling thread —
so Ctrl-C lands there as KeyboardInterrupt — and each rollout batch or reflection call is
submitted to one long-lived loop, which keeps HTTP sessions and local-model workers alive
across calls (a fresh `asyncio.run` per call would close them every time). The loop and its
thread are anyio's blocking portal; this class adds what GEPA's stops need: an interrupted
caller cancels its coroutine, and `cancel_pending` releases every waiting caller at once.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from anyio.from_thread import start_blocking_portal

T = TypeVar("T")


class AsyncBridge:
    """Runs coroutines on a private event loop thread; `run` blocks the caller until done."""

    def __init__(self) -> None:
        self._exit = contextlib.ExitStack()
        self._portal = self._exit.enter_context(start_blocking_portal(name="gepa-async-bridge"))
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.RLock()  # re-entrant: cancel_pending runs in a signal handler
        self._closing = False

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """The coroutine's result (or exception). An interrupt of the caller cancels the coroutine."""
        with self._lock:
            if self._closing:  # the loop is going away: this coroutine would never run
                coro.close()
                raise concurrent.futures.CancelledError("the event loop is closing")
            future = self._portal.start_task_soon(_awaited, coro)
            self._pending.add(future)
        try:
            return future.result()
        except BaseException:
            # KeyboardInterrupt while waiting: stop the work instead of leaving it running.
            future.cancel()
            raise
        finally:
            with self._lock:
                self._pending.discard(future)

    def cancel_pending(self) -> None:
        """Cancel every coroutine `run` is waiting on, from any thread (each caller gets
        CancelledError): a stop must not wait for work other threads submitted."""
        with self._lock:
            pending = list(self._pending)
        for future in pending:
            future.cancel()

    def close(self) -> None:
        """Cancel what is still running, stop the loop and join its thread."""
        with self._lock:
            if self._closing:
                return
            self._closing = True  # from here `run` refuses new work ...
        self.cancel_pending()  # ... and threads still waiting on some are released
        with contextlib.suppress(RuntimeError):  # the portal stopped already
            self._portal.call(self._portal.stop, True)  # True: cancel the tasks still running
        self._exit.close()  # the loop's own shutdown cancels the tasks the coroutines started

    def __enter__(self) -> AsyncBridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _awaited(coro: Coroutine[Any, Any, T]) -> T:
    return await coro
