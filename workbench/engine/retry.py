"""Retries for transient inference faults (connection errors, timeouts, 429/5xx).

`RetryingClient` wraps any `Client`: a transient `InferenceError` is retried with exponential
backoff and full jitter (so many rollouts failing at once do not retry in lockstep); a
permanent one, or the last failed attempt, is raised for the rollout to record.

Each retry can be told to the user (`notify`, at most one line per problem every
`NOTICE_INTERVAL_S`, however many requests hit it). A request that fails every try when no
request through the client has been answered during its tries, nor for the client's timeout
(the silence that defines a stall; 60 s by default) — or whose last try was refused outright (no
server listens any more) — is `ServerGone`: from then on every
request fails at once with it, and the engine stops the run instead of failing all that is
left. A blip (a prompt the server keeps failing, a restart) only fails the rollouts it hits.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from workbench.errors import InferenceError, ServerGone, UserError
from workbench.inference.client import Client, TokensInClient
from workbench.inference.openai_client import DEFAULT_TIMEOUT_S, DEFAULT_TRIES
from workbench.types import Completion, Messages, SamplingParams, TokenData

NOTICE_INTERVAL_S = 10.0  # one line per problem per this many seconds: 64 rollouts retrying is one line

Notify = Callable[[str], None]


@dataclass
class RetryPolicy:
    max_attempts: int = DEFAULT_TRIES
    base_delay_s: float = 0.25
    max_delay_s: float = 8.0
    gone_after_s: float = DEFAULT_TIMEOUT_S  # silence that, with a request out of tries, means gone

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.max_delay_s, self.base_delay_s * 2**attempt))


def policy_for(client: Client) -> RetryPolicy:
    """The client's own tries and timeout (from --tries/--timeout or the endpoint registry) with
    the usual backoff. In-process clients have neither: they fail for good or not at all."""
    return RetryPolicy(
        max_attempts=getattr(client, "tries", DEFAULT_TRIES),
        gone_after_s=getattr(client, "timeout_s", DEFAULT_TIMEOUT_S),
    )


class RetryingClient:
    """A `Client` that retries its wrapped client's transient failures. See the module doc."""

    def __init__(
        self, inner: Client, policy: RetryPolicy | None = None, seed: int = 0, notify: Notify | None = None
    ) -> None:
        self.inner = inner
        self.model = inner.model
        self.policy = policy or policy_for(inner)
        self.retries = 0
        self.gone: ServerGone | None = None
        self._notify = notify
        self._noticed: dict[str, float] = {}
        self._last_answer = time.monotonic()  # the run starts after the server answered its preflight
        self._rng = random.Random(seed)
        # A runtime Protocol check walks the protocol's members every time (on Python 3.11 it was
        # several percent of the engine's CPU, asked once per rollout); the wrapped client's kind
        # does not change, so it is checked once.
        self._tokens_in_inner = inner if isinstance(inner, TokensInClient) else None

    @property
    def tokens_in(self) -> bool:
        """Whether multi-turn rollouts continue by token ids (the wrapped client's setting)."""
        return self._tokens_in_inner is not None and self._tokens_in_inner.tokens_in

    async def chat(
        self, messages: Messages, *, sampling: SamplingParams, tools: list[dict[str, Any]] | None = None
    ) -> list[Completion]:
        return await self._with_retries(lambda: self.inner.chat(messages, sampling=sampling, tools=tools))

    async def continue_chat(
        self,
        previous: TokenData,
        new_messages: Messages,
        *,
        sampling: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[Completion]:
        inner = self._tokens_in_inner
        if inner is None:
            raise InferenceError(
                f"{type(self.inner).__name__} cannot continue a conversation by token ids", transient=False
            )
        return await self._with_retries(
            lambda: inner.continue_chat(previous, new_messages, sampling=sampling, tools=tools)
        )

    async def _with_retries(self, call: Callable[[], Awaitable[list[Completion]]]) -> list[Completion]:
        first_try = time.monotonic()
        attempt = 0
        while True:
            if self.gone is not None:
                raise self.gone
            try:
                completions = await call()
            except InferenceError as exc:
                attempt += 1
                if not exc.transient:
                    raise
                if attempt >= self.policy.max_attempts:
                    now = time.monotonic()
                    # Gone: nothing answered during this request's tries and, unless every try was
                    # refused (no process listens: a dead server gives up within the backoff, ~8 s),
                    # for the whole stall timeout either.
                    silent_since = first_try if exc.refused else now - self.policy.gone_after_s
                    if self._last_answer < min(first_try, silent_since):
                        self.gone = ServerGone(
                            f"{exc} ({attempt} tries over {now - first_try:.0f} s, and nothing "
                            "answered meanwhile)"
                        )
                        raise self.gone from exc
                    raise
                self.retries += 1
                self._tell(f"{exc}, retrying {attempt + 1}/{self.policy.max_attempts}", str(exc))
                await asyncio.sleep(self.policy.delay(attempt, self._rng))
            else:
                self._last_answer = time.monotonic()
                return completions

    def _tell(self, line: str, problem: str) -> None:
        now = time.monotonic()
        if self._notify is not None and now - self._noticed.get(problem, float("-inf")) >= NOTICE_INTERVAL_S:
            self._noticed[problem] = now
            self._notify(line)

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
