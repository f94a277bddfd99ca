"""`MultiTurnEnv`: model turn, environment turn, until a stop condition; `SingleTurnEnv` is one turn.

Override `env_response(messages, state)` to answer the model, and `is_completed(messages, state)`
for extra stop conditions. Model errors (after the engine's retries) and env errors end the
rollout with the error recorded; whatever was generated so far is kept.
"""

from __future__ import annotations

import time

from workbench.envs.environment import Environment, RolloutOutput
from workbench.envs.rubric import maybe_await
from workbench.errors import ContextLengthError, InferenceError
from workbench.inference.client import Client
from workbench.types import Example, Messages, RolloutError, SamplingParams, State, TokenData


class MultiTurnEnv(Environment):
    """Alternates model and environment turns, at most `max_turns` model turns."""

    def __init__(self, *, max_turns: int = 10, **kwargs) -> None:  # kwargs: Environment's named arguments
        super().__init__(**kwargs)
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.max_turns = max_turns

    async def env_response(self, messages: Messages, state: State) -> Messages:
        """The environment's reply to the model's last message (new messages to append)."""
        raise NotImplementedError(f"{type(self).__name__} must implement env_response")

    async def is_completed(self, messages: Messages, state: State) -> bool:
        """Extra stop condition checked after each model turn; `max_turns` is always enforced."""
        return False

    async def rollout(self, client: Client, example: Example, sampling: SamplingParams) -> RolloutOutput:
        state = self.init_state(example)
        await maybe_await(self.setup_state(state))
        messages: Messages = list(example.prompt)
        out = RolloutOutput(completion=state["completion"], state=state)
        single = sampling if sampling.n == 1 else sampling.merged({"n": 1})
        while True:
            started = time.perf_counter()
            try:
                choice = (await client.chat(messages, sampling=single, tools=self.oai_tools))[0]
            except ContextLengthError:  # the conversation outgrew the context window: truncated, not failed
                out.is_truncated, out.stop_condition = True, "prompt_too_long"
                break
            except InferenceError as exc:
                out.error = RolloutError.from_exception(exc, "inference")
                out.stop_condition = "error"
                break
            finally:
                out.generation_ms += (time.perf_counter() - started) * 1000
            state["responses"].append(choice)
            out.usage["prompt_tokens"] += choice.prompt_tokens
            out.usage["completion_tokens"] += choice.completion_tokens
            messages.append(choice.message)
            out.completion.append(choice.message)
            out.num_turns += 1
            state["turn"] = out.num_turns
            if choice.finish_reason == "length":
                out.is_truncated, out.stop_condition = True, "length"
                break
            try:
                if await self.is_completed(messages, state):
                    out.stop_condition = out.stop_condition or "completed"
                    break
                if out.num_turns >= self.max_turns:
                    out.stop_condition = "max_turns"
                    break
                replies = await self.env_response(messages, state)
            except Exception as exc:  # an env bug ends this rollout only
                out.error = RolloutError.from_exception(exc, "env")
                out.stop_condition = "error"
                break
            messages.extend(replies)
            out.completion.extend(replies)
        out.tokens = assemble_tokens([c.tokens for c in state["responses"]])
        return out

    def setup_state(self, state: State) -> None:
        """Hook: add env-specific keys to a fresh rollout state (may be async)."""


def assemble_tokens(turns: list[TokenData | None]) -> TokenData | None:
    """One token sequence for a whole multi-turn rollout, for RL.

    Each turn's prompt ids are the previous turns re-rendered by the chat template, so turn k's
    sampled tokens sit at offset len(turn_k.prompt_ids) of the final sequence when the template
    reproduces earlier turns exactly (true for byte-level tokenizers and ChatML). Sampled tokens
    get mask 1 and their logprobs; the environment's tokens between turns get mask 0. A turn
    whose tokens cannot be found at their place is masked out rather than trained on wrongly.
    """
    if not turns or any(t is None for t in turns):
        return None
    first, last = turns[0], turns[-1]
    assert first is not None and last is not None
    sequence = last.prompt_ids + last.completion_ids
    start = len(first.prompt_ids)
    mask = [0] * (len(sequence) - start)
    logprobs = [0.0] * (len(sequence) - start)
    for turn in turns:
        assert turn is not None
        offset = len(turn.prompt_ids)
        if sequence[offset:offset + len(turn.completion_ids)] != turn.completion_ids or offset < start:
            continue
        for i, logprob in enumerate(turn.completion_logprobs):
            mask[offset - start + i] = 1
            logprobs[offset - start + i] = logprob
    if sequence[:start] != first.prompt_ids:
        return None
    return TokenData(prompt_ids=first.prompt_ids, completion_ids=sequence[start:],
                     completion_logprobs=logprobs, completion_mask=mask)


class SingleTurnEnv(MultiTurnEnv):
    """One model turn, then scoring."""

    def __init__(self, **kwargs) -> None:  # kwargs: Environment's named arguments
        kwargs.pop("max_turns", None)
        super().__init__(max_turns=1, **kwargs)

    async def is_completed(self, messages: Messages, state: State) -> bool:
        return True
