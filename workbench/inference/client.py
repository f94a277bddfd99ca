"""The one async `Client` protocol every backend implements.

`chat` takes OpenAI-style messages (and optional tool schemas) and returns `sampling.n`
completions. Backends that can also return token ids and sampled logprobs fill
`Completion.tokens`; RL needs them, eval does not.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from workbench.types import Completion, Messages, SamplingParams


@runtime_checkable
class Client(Protocol):
    """Anything that can answer a chat request."""

    model: str

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
