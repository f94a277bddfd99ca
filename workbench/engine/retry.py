"""Retries for transient inference faults (connection errors, timeouts, 429/5xx).

`RetryingClient` wraps any `Client`: a transient `InferenceError` is retried with exponential
backoff and full jitter (so many rollouts failing at once do not retry in lockstep); a
permanent one, or the last failed attempt, is raised for the rollout to record.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from workbench.errors import InferenceError, UserError
from workbench.inference.client import Client
from workbench.types import Completion, Messages, SamplingParams


@dataclass
class RetryPolicy:
    max_attempts: int = 5  # enough to ride out a server restart of a few seconds
    base_delay_s: float = 0.25
    max_delay_s: float = 8.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.max_delay_s, self.base_delay_s * 2**attempt))


class RetryingClient:
    """A `Client` that retries its wrapped client's transient failures."""

    def __init__(self, inner: Client, policy: RetryPolicy | None = None, seed: int = 0) -> None:
        self.inner = inner
        self.model = inner.model
        self.policy = policy or RetryPolicy()
        self.retries = 0
        self._rng = random.Random(seed)

    async def chat(self, messages: Messages, *, sampling: SamplingParams,
                   tools: list[dict[str, Any]] | None = None) -> list[Completion]:
        attempt = 0
        while True:
            try:
                return await self.inner.chat(messages, sampling=sampling, tools=tools)
            except InferenceError as exc:
                attempt += 1
                if not exc.transient or attempt >= self.policy.max_attempts:
                    raise
                self.retries += 1
                await asyncio.sleep(self.policy.delay(attempt, self._rng))

    async def close(self) -> None:
        await self.inner.close()


async def preflight(client: Client) -> None:
    """Fail fast, with one line, when the server cannot be reached (instead of N failed rollouts)."""
    ping = getattr(client, "ping", None)
    if ping is None:
        return
    try:
        await ping()
    except InferenceError as exc:
        raise UserError(f"cannot use the model server: {exc}") from exc
