"""`MultiTurnEnv`: model turn, environment turn, until a stop condition; `SingleTurnEnv` is one turn.

Override `env_response(messages, state)` to answer the model, and `is_completed(messages, state)`
for extra stop conditions — or, as in verifiers, mark methods `(self, state) -> bool` with
`@stop` (decorators.py); `@cleanup` methods run after every rollout. Model errors (after the
engine's retries) and env errors end the rollout with the error recorded; whatever was generated
so far is kept.

Environment code sees ChatMessages (dicts with attribute access, messages.py) and, besides
Workbench's own keys, the state keys verifiers' environments read: `trajectory` (one step per
model turn: `prompt`, `completion`, `response`, `tokens`, ...), `trajectory_id`,
`stop_condition`, and `final_env_response` (set it in `env_response` to end the rollout with
those messages).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import time
import uuid
from collections.abc import Callable
from typing import Any

from workbench.envs.decorators import call_with_named_args, cleanups, stop_conditions
from workbench.envs.environment import Environment, RolloutOutput
from workbench.envs.messages import ChatMessage, as_message, as_messages, plain_messages
from workbench.errors import ContextLengthError, InferenceError
from workbench.inference.client import Client, TokensInClient
from workbench.types import (
    Completion,
    Example,
    Messages,
    RolloutError,
    SamplingParams,
    State,
    TokenData,
)

NO_TURN_LIMIT = -1  # verifiers' "no limit" value of max_turns


# Trajectory ids: 32 hex characters like uuid4().hex, but a random per-process half and a counter
# (uuid4 reads the OS's random source per rollout: about 4% of the engine's CPU per rollout)
_ID_PREFIX = uuid.uuid4().hex[:16]
_ID_COUNTER = itertools.count()


def _trajectory_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


class MultiTurnEnv(Environment):
    """Alternates model and environment turns, at most `max_turns` model turns (-1: no limit,
    as in verifiers; the rollout then ends by a stop condition or the context length)."""

    def __init__(
        self, *, max_turns: int = 10, timeout_seconds: float | None = None, **kwargs: Any
    ) -> None:  # kwargs: Environment's named arguments
        super().__init__(**kwargs)
        if max_turns < 1 and max_turns != NO_TURN_LIMIT:
            raise ValueError(f"max_turns must be at least 1 (or -1 for no limit), got {max_turns}")
        if timeout_seconds is not None and timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be positive, got {timeout_seconds}")
        self.max_turns = max_turns
        # Wall-clock limit of one rollout (verifiers' argument); it ends as "timeout_reached".
        self.timeout_seconds = timeout_seconds
        self._stop_conditions = stop_conditions(self)
        self._cleanups = cleanups(self)

    async def env_response(self, messages: Messages, state: State, **kwargs: Any) -> Messages:
        """The environment's reply to the model's last message (new messages to append).

        May also return `(messages, state)`, as verifiers' older API did."""
        raise NotImplementedError(f"{type(self).__name__} must implement env_response")

    async def is_completed(self, messages: Messages, state: State) -> bool:
        """Extra stop condition checked after each model turn; `max_turns` is always enforced."""
        return False

    async def setup_state(self, state: State, **kwargs: Any) -> State:
        """Hook: add env-specific keys to a fresh rollout state. May be sync or async, and may
        return the state (verifiers' style: a returned dict becomes the state) or None."""
        return state

    # ----- the loop ---------------------------------------------------------------------
    async def rollout(self, client: Client, example: Example, sampling: SamplingParams) -> RolloutOutput:
        state = self.init_state(example)
        state["trajectory"] = []
        state["trajectory_id"] = _trajectory_id()
        out = RolloutOutput(completion=state["completion"], state=state)
        try:
            await self._run_within_timeout(client, sampling, out)
        finally:
            await self._run_cleanups(out)
        out.state["stop_condition"] = out.stop_condition
        # Records, training and chat templates get plain dicts; env code and rewards got ChatMessages.
        out.completion = plain_messages(out.state["completion"])
        turns = [c.tokens for c in out.state["responses"]]
        out.tokens = assemble_tokens(turns)
        out.turn_tokens = [t for t in turns if t is not None] if all(t is not None for t in turns) else []
        return out

    async def _run_within_timeout(self, client: Client, sampling: SamplingParams, out: RolloutOutput) -> None:
        if self.timeout_seconds is None:
            await self._run(client, sampling, out)
            return
        try:
            await asyncio.wait_for(self._run(client, sampling, out), self.timeout_seconds)
        except TimeoutError:  # what was generated so far is kept, as for any other stop
            out.stop_condition = "timeout_reached"
            out.state["timed_out"] = True

    async def _run(self, client: Client, sampling: SamplingParams, out: RolloutOutput) -> None:
        """Setup, then model and environment turns until a stop; everything lands on `out`."""
        try:
            self._adopt_state(out, await call_maybe_async(self.setup_state, out.state))
            state = out.state
            if await self._decorated_stop(
                state, lambda priority: True, out
            ):  # verifiers checks before turn 1 too
                return
        except Exception as exc:  # an env bug ends this rollout only
            out.error, out.stop_condition = RolloutError.from_exception(exc, "env"), "error"
            return
        messages: Messages = list(state["prompt"])  # ChatMessages; the hooks take Messages
        single = sampling if sampling.n == 1 else sampling.merged({"n": 1})
        # Tokens in (a trainer's "interleaved" strategy): after the first turn, continue from the
        # ids already sampled plus the template's rendering of the env's new messages, instead of
        # re-rendering (and re-tokenizing) the whole conversation.
        # The cheap attribute first: a runtime Protocol isinstance is slow (~8% of engine CPU per rollout).
        tokens_in = getattr(client, "tokens_in", False) is True and isinstance(client, TokensInClient)
        previous: TokenData | None = None
        new_messages: list[ChatMessage] = []
        while True:
            started = time.perf_counter()
            try:
                if tokens_in and previous is not None:
                    assert isinstance(client, TokensInClient)
                    replies_so_far = plain_messages(new_messages)
                    choice = (
                        await client.continue_chat(
                            previous, replies_so_far, sampling=single, tools=self.oai_tools
                        )
                    )[0]
                else:
                    choice = (
                        await client.chat(plain_messages(messages), sampling=single, tools=self.oai_tools)
                    )[0]
            except ContextLengthError:  # the conversation outgrew the context window: truncated, not failed
                out.is_truncated, out.stop_condition = True, "prompt_too_long"
                state["prompt_too_long"] = True
                return
            except InferenceError as exc:
                out.error, out.stop_condition = RolloutError.from_exception(exc, "inference"), "error"
                return
            finally:
                out.generation_ms += (time.perf_counter() - started) * 1000
            message = as_message(choice.message)
            self._record_turn(out, messages, message, choice)
            messages.append(message)
            previous = choice.tokens
            if choice.finish_reason == "length":
                out.is_truncated, out.stop_condition = True, "length"
                return
            try:
                if await self._turn_stop(messages, state, out):
                    return
                replies = await self._env_reply(messages, state)
            except Exception as exc:  # an env bug ends this rollout only
                out.error, out.stop_condition = RolloutError.from_exception(exc, "env"), "error"
                return
            if state.get("final_env_response") is not None:  # the env ends the rollout with these
                final = as_messages(state["final_env_response"])
                messages.extend(final)
                state["completion"].extend(final)
                out.stop_condition = "has_final_env_response"
                return
            messages.extend(replies)
            state["completion"].extend(replies)
            new_messages = replies

    def _record_turn(
        self, out: RolloutOutput, prompt: Messages, message: ChatMessage, choice: Completion
    ) -> None:
        state = out.state
        state["responses"].append(choice)
        state["trajectory"].append(
            {
                "prompt": list(prompt),
                "completion": [message],
                "response": choice,
                "tokens": choice.tokens,
                "reward": None,
                "advantage": None,
                "is_truncated": choice.finish_reason == "length",
                "trajectory_id": state["trajectory_id"],
                "extras": {},
            }
        )
        out.usage["prompt_tokens"] += choice.prompt_tokens
        out.usage["completion_tokens"] += choice.completion_tokens
        state["completion"].append(message)
        out.num_turns += 1
        state["turn"] = out.num_turns

    async def _turn_stop(self, messages: Messages, state: State, out: RolloutOutput) -> bool:
        """After a model turn: `@stop` conditions of priority >= 0, `is_completed`, `max_turns`,
        then `@stop` conditions of negative priority. The first that fires names the stop."""
        if await self._decorated_stop(state, lambda priority: priority >= 0, out):
            return True
        if await self.is_completed(messages, state):
            out.stop_condition = out.stop_condition or "completed"
            return True
        if self.max_turns != NO_TURN_LIMIT and out.num_turns >= self.max_turns:
            out.stop_condition = "max_turns"
            return True
        return await self._decorated_stop(state, lambda priority: priority < 0, out)

    async def _decorated_stop(self, state: State, which: Callable[[int], bool], out: RolloutOutput) -> bool:
        for priority, name, condition in self._stop_conditions:
            if which(priority) and await call_with_named_args(condition, state=state, env=self):
                out.stop_condition = name
                return True
        return False

    async def _env_reply(self, messages: Messages, state: State) -> list[ChatMessage]:
        reply = await self.env_response(messages, state)
        if isinstance(reply, tuple) and len(reply) == 2 and isinstance(reply[1], dict):
            reply, new_state = reply  # verifiers' older `-> (messages, state)`
            if new_state is not state:
                state.update(new_state)
        if not isinstance(reply, list):
            raise TypeError(f"env_response must return a list of messages, got {type(reply).__name__}")
        return as_messages(reply)

    def _adopt_state(self, out: RolloutOutput, returned: Any) -> None:
        """verifiers' setup_state returns the state; a different dict returned replaces it."""
        if returned is None or returned is out.state:
            return
        if not isinstance(returned, dict):
            raise TypeError(
                f"setup_state must return the state (a dict) or None, got {type(returned).__name__}"
            )
        for key, value in out.state.items():
            returned.setdefault(key, value)
        out.state = returned
        out.completion = returned["completion"]

    async def _run_cleanups(self, out: RolloutOutput) -> None:
        for _, _, handler in self._cleanups:
            try:
                await call_with_named_args(handler, state=out.state, env=self)
            except Exception as exc:  # a failing cleanup is this rollout's error, not the run's
                if out.error is None:
                    out.error, out.stop_condition = RolloutError.from_exception(exc, "env"), "error"


async def call_maybe_async(func: Callable[..., Any], *args: Any) -> Any:
    result = func(*args)
    return await result if inspect.isawaitable(result) else result


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
        if sequence[offset : offset + len(turn.completion_ids)] != turn.completion_ids or offset < start:
            continue
        for i, logprob in enumerate(turn.completion_logprobs):
            mask[offset - start + i] = 1
            logprobs[offset - start + i] = logprob
    if sequence[:start] != first.prompt_ids:
        return None
    return TokenData(
        prompt_ids=first.prompt_ids,
        completion_ids=sequence[start:],
        completion_logprobs=logprobs,
        completion_mask=mask,
    )


class SingleTurnEnv(MultiTurnEnv):
    """One model turn, then scoring."""

    def __init__(self, **kwargs: Any) -> None:  # kwargs: Environment's named arguments
        kwargs.pop("max_turns", None)
        super().__init__(max_turns=1, **kwargs)

    async def is_completed(self, messages: Messages, state: State) -> bool:
        return True
