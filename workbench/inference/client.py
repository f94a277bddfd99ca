"""The one async `Client` protocol every backend implements.

`chat` takes OpenAI-style messages (and optional tool schemas) and returns `sampling.n`
completions. Backends that can also return token ids and sampled logprobs fill
`Completion.tokens`; RL needs them, eval does not.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from workbench.types import Completion, Messages, SamplingParams, TokenData


@runtime_checkable
class Client(Protocol):
    """Anything that can answer a chat request."""

    @property
    def model(self) -> str:
        """The model name requests go to (read-only: a loopback derives it from what it wraps)."""
        ...

    async def chat(
        self,
        messages: Messages,
        *,
        sampling: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[Completion]:
        """Return `sampling.n` completions for `messages`. Raises `InferenceError` on failure."""
        ...

    async def close(self) -> None:
        """Release connections, threads and models."""
        ...


@runtime_checkable
class TokensInClient(Client, Protocol):
    """A client that can continue a conversation from token ids (see `chat_tokens`)."""

    tokens_in: bool  # continue multi-turn rollouts this way (a trainer's "interleaved" strategy)

    async def continue_chat(
        self,
        previous: TokenData,
        new_messages: Messages,
        *,
        sampling: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[Completion]:
        """The next turn after `previous` (a turn's prompt ids and sampled ids), with the
        environment's `new_messages` rendered by the chat template in between."""
        ...
