"""`AsyncBridge`: an event loop in a background thread, so synchronous code can await coroutines.

The `gepa` library is synchronous (it calls `adapter.evaluate` and the reflection LM as plain
functions) while the engine and every `Client` are async. GEPA runs on the calling thread —
so Ctrl-C lands there as KeyboardInterrupt — and each rollout batch or reflection call is
submitted to one long-lived loop, which keeps HTTP sessions and local-model workers alive
across calls (a fresh `asyncio.run` per call would close them every time).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class AsyncBridge:
    """Runs coroutines on a private event loop thread; `run` blocks the caller until done."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.RLock()  # re-entrant: cancel_pending runs in a signal handler
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="gepa-async-bridge", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """The coroutine's result (or exception). An interrupt of the caller cancels the coroutine."""
        with self._lock:
            if self._closing:  # the loop is going away: this coroutine would never run
                coro.close()
                raise concurrent.futures.CancelledError("the event loop is closing")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
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
        if self.loop.is_closed():
            return
        with self._lock:
            self._closing = True  # from here `run` refuses new work ...
        self.cancel_pending()  # ... and threads still waiting on some are released

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=10)
        except Exception:  # a stuck task must not keep the process alive
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()

    def __enter__(self) -> AsyncBridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
