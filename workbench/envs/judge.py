"""`JudgeRubric`: a rubric whose reward asks a judge model whether a response matches the answer.

For answers that exact match grades too harshly ("Lake Orvin" vs "the lake called Orvin"). The
judge is either any workbench `Client` (made from `judge_model`: an OpenAI model, an endpoint from
configs/endpoints.toml, a local server), or — verifiers' classic signature — an `openai.AsyncOpenAI`
instance passed as `judge_client`, called as verifiers calls it (`judge_model`, and only
`judge_sampling_args`). `judge_reward` scores 1.0 on "yes". As in verifiers, reward functions may
also name a `judge` argument (or `judge_client`, `judge_model`, ...) to ask the judge themselves:

    rubric = JudgeRubric(judge_model="gpt-4.1-mini")
    rubric.add_reward_func(rubric.judge_reward)

    rubric = vf.JudgeRubric(judge_client=AsyncOpenAI(base_url=..., api_key=...), judge_model="m",
                            judge_prompt="... {question} ... {answer} ... {response} ...")

Replies are cached per rollout in `state["judge_response"]`, keyed by the judge prompt, so asking
twice about the same response costs one call. A failed judge call raises inside the reward
function, so the rollout scores 0 with the error recorded (see rubric.py) and the run goes on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.envs.parsers import Parser, content_text, last_assistant_text, message_field
from workbench.envs.rubric import RewardFunc, Rubric
from workbench.errors import UserError
from workbench.inference.client import Client
from workbench.types import Messages, SamplingParams, State

if TYPE_CHECKING:
    from openai import AsyncOpenAI

DEFAULT_JUDGE_PROMPT = """Given a ground truth answer and a response, determine if the response is correct.

Question:
```
{question}
```

Ground truth answer:
```
{answer}
```

Response:
```
{response}
```

Respond either "yes" or "no" only."""

DEFAULT_JUDGE_MODEL = "gpt-4.1-nano"  # verifiers' default
OPENAI_BASE_URL = "https://api.openai.com/v1"
OPENAI_KEY_VAR = "OPENAI_API_KEY"


def make_judge_client(model: str, base_url: str | None = None, api_key_var: str | None = None) -> Client:
    """The judge's client: `base_url` if given; else an endpoint id from configs/endpoints.toml;
    else a named model ('tiny', 'smollm2-135m', ...) or a local model folder; else the OpenAI API (key in $OPENAI_API_KEY)."""
    from workbench.inference.endpoints import load_endpoints
    from workbench.inference.resolve import make_client
    from workbench.workspace import NAMED_MODELS, endpoints_path

    embedded = model in NAMED_MODELS
    if base_url is None and (model in load_endpoints(endpoints_path()) or embedded or Path(model).exists()):
        return make_client(model)
    var = api_key_var or (OPENAI_KEY_VAR if base_url is None else None)
    if var is not None and not os.environ.get(var):
        where = "the OpenAI API" if base_url is None else base_url
        raise UserError(
            f"judge model '{model}' on {where} needs an API key in ${var}: set it, or set judge_base_url "
            "(and judge_api_key_var) for another server, or name an endpoint from configs/endpoints.toml"
        )
    return make_client(model, base_url=base_url or OPENAI_BASE_URL, api_key_var=var)


def is_openai_sdk_client(client: object) -> bool:
    """True for an `openai.AsyncOpenAI` (it has `chat.completions`); False for a Workbench `Client`,
    whose `chat` is a method."""
    return hasattr(getattr(client, "chat", None), "completions")


def sdk_request_args(sampling_args: dict[str, Any]) -> dict[str, Any]:
    """`judge_sampling_args` as verifiers sends them to the SDK: `max_tokens` renamed to
    `max_completion_tokens` (what the chat API now takes), None values left out."""
    args = dict(sampling_args)
    if "max_tokens" in args:
        args["max_completion_tokens"] = args.pop("max_tokens")
    return {k: v for k, v in args.items() if v is not None}


def question_text(prompt: Messages | str) -> str:
    """What the judge is told the question was: the prompt text, or its last user message."""
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if message_field(m, "role") == "user"] or list(prompt)
    return content_text(message_field(users[-1], "content")) if users else ""


class JudgeRubric(Rubric):
    """A `Rubric` with a judge model. Add `judge_reward` (or your own function taking `judge`)."""

    def __init__(
        self,
        funcs: Sequence[RewardFunc] | Parser | None = None,
        weights: Sequence[float] | None = None,
        parser: Parser | None = None,
        *,
        parallelize_scoring: bool = False,
        judge_client: Client | AsyncOpenAI | None = None,
        judge_model: str = DEFAULT_JUDGE_MODEL,
        judge_base_url: str | None = None,
        judge_api_key_var: str | None = None,
        judge_prompt: str = DEFAULT_JUDGE_PROMPT,
        judge_sampling_args: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(funcs, Parser):  # verifiers' JudgeRubric takes the parser first
            funcs, parser = None, funcs
        super().__init__(funcs, weights, parser)
        # Resolved now, so a missing key or a bad URL fails when the environment loads.
        self.judge_client: Client | AsyncOpenAI = judge_client or make_judge_client(
            judge_model, judge_base_url, judge_api_key_var
        )
        self._sdk = is_openai_sdk_client(self.judge_client)
        self.judge_model = judge_model if self._sdk else self.judge_client.model  # type: ignore[union-attr]
        # Nothing tells a rubric that the run is over, so a client made here is closed whenever
        # no judge call is in flight (and reopens on the next): no connection outlives the run.
        # A client the caller passed in is theirs to close.
        self._owns_client = judge_client is None
        self._in_flight = 0
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self.judge_prompt = judge_prompt
        self.judge_sampling_args: dict[str, Any] = dict(judge_sampling_args or {})
        # A yes/no verdict needs a few tokens; a custom prompt may ask the judge to reason first.
        default_max_tokens = 64 if judge_prompt == DEFAULT_JUDGE_PROMPT else 1024
        self.judge_sampling = SamplingParams(temperature=0.0, max_tokens=default_max_tokens).merged(
            self.judge_sampling_args
        )
        for name, value in (
            ("judge", self.judge),
            ("judge_client", self.judge_client),
            ("judge_model", self.judge_model),
            ("judge_prompt", self.judge_prompt),
            ("judge_sampling_args", self.judge_sampling_args),
        ):
            self.add_class_object(name, value)

    def judge_messages(self, prompt: Messages | str, completion: Messages | str, answer: str) -> Messages:
        """The one user message the judge gets: `judge_prompt` filled in for this rollout."""
        response = self.parser.parse_answer(completion) or last_assistant_text(completion)
        text = self.judge_prompt.format(question=question_text(prompt), answer=answer, response=response)
        return [{"role": "user", "content": text}]

    async def judge(
        self, prompt: Messages | str, completion: Messages | str, answer: str, state: State | None = None
    ) -> str:
        """The judge's reply for this rollout (asked once per judge prompt, then read from
        `state["judge_response"]`)."""
        messages = self.judge_messages(prompt, completion, answer)
        key = str(messages[0]["content"])
        cache = state.get("judge_response") if state is not None else None
        if isinstance(cache, dict) and key in cache:
            return str(cache[key])
        reply = await self._ask(messages)
        if state is not None:
            if not isinstance(cache, dict):
                cache = state["judge_response"] = {}
            cache[key] = reply
        return reply

    def _closing_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:  # an asyncio.Lock belongs to one loop
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    async def _ask(self, messages: Messages) -> str:
        if self._sdk:
            return await self._ask_sdk(messages)
        client: Client = self.judge_client  # type: ignore[assignment]
        async with self._closing_lock():  # wait while an idle close is under way
            self._in_flight += 1
        try:
            choices = await client.chat(messages, sampling=self.judge_sampling)
            return str(choices[0].message.get("content") or "")
        finally:
            self._in_flight -= 1
            if self._owns_client and self._in_flight == 0:
                async with self._closing_lock():
                    if self._in_flight == 0:
                        await client.close()

    async def _ask_sdk(self, messages: Messages) -> str:
        """One chat completion from an `openai.AsyncOpenAI` judge, as verifiers asks it."""
        client: AsyncOpenAI = self.judge_client  # type: ignore[assignment]
        try:
            # Plain dicts in the chat API's shape; the SDK types each role as its own TypedDict.
            response = await client.chat.completions.create(
                model=self.judge_model,
                messages=messages,  # type: ignore[arg-type]
                **sdk_request_args(self.judge_sampling_args),
            )
        except Exception as exc:  # say which judge failed: the SDK's own message is often "Connection error."
            raise RuntimeError(
                f"judge '{self.judge_model}' at {client.base_url} failed: {type(exc).__name__}: {exc}"
            ) from exc
        return str(response.choices[0].message.content or "")

    async def judge_reward(
        self, prompt: Messages | str, completion: Messages | str, answer: str, state: State
    ) -> float:
        """1.0 when the judge says the response matches the answer ("yes"), else 0.0."""
        reply = await self.judge(prompt, completion, answer, state)
        first_word = reply.strip().lower().lstrip("*\"'`").split(maxsplit=1)[:1]
        return 1.0 if first_word and first_word[0].rstrip(".!,:*\"'`") == "yes" else 0.0
