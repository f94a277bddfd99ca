"""`SilenceWatch`: gives up on requests to a server that has answered nothing for `timeout_s`.

A request is given up (its task cancelled, and told apart from any other cancel by `fired`) once
the server has been silent for `timeout_s` since it was sent: no answer to it nor to any other
request. A busy server that answers others never times a request out; a stalled one is noticed
within `timeout_s` however many requests wait on it.

One timer per watch, not one per request: requests are registered in the order they are sent,
so the oldest one has the earliest deadline, `max(oldest sent, last answer) + timeout_s`, and the
timer is armed for that. (A `call_later` per request, armed and cancelled around every request,
was several percent of the engine's CPU against a fast server.)
"""

from __future__ import annotations

import asyncio
import time


class SilenceWatch:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.last_answer = float("-inf")  # monotonic time the server last answered any request
        self._sent: dict[asyncio.Task[object], float] = {}  # in flight, in the order sent
        self._fired: set[asyncio.Task[object]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def answered(self) -> None:
        """The server answered something (any reply, an error included, shows it is alive)."""
        self.last_answer = time.monotonic()

    def watch(self, task: asyncio.Task[object]) -> None:
        """Start watching `task`'s request, sent now."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # requests of an earlier (finished) loop are gone with it
            self._sent.clear()
            self._fired.clear()
            self._timer = None
            self._loop = loop
        self._sent[task] = time.monotonic()
        if self._timer is None:
            self._timer = loop.call_later(self.timeout_s, self._check)

    def done(self, task: asyncio.Task[object]) -> bool:
        """Stop watching `task`; whether the watch cancelled it (the server was silent)."""
        self._sent.pop(task, None)
        if not self._fired:
            return False
        fired = task in self._fired
        self._fired.discard(task)
        return fired

    def _check(self) -> None:
        self._timer = None
        now = time.monotonic()
        while self._sent:
            task, sent = next(iter(self._sent.items()))
            deadline = max(sent, self.last_answer) + self.timeout_s
            if deadline > now:
                assert self._loop is not None
                self._timer = self._loop.call_at(self._loop.time() + (deadline - now), self._check)
                return
            del self._sent[task]
            self._fired.add(task)
            task.cancel()
