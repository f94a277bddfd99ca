"""`JudgeRubric`: a rubric whose reward asks a judge model whether a response matches the answer.

For answers that exact match grades too harshly ("Lake Orvin" vs "the lake called Orvin"). The
judge is any workbench `Client` — an OpenAI model, an endpoint from configs/endpoints.toml, a
local server — asked a yes/no question; `judge_reward` scores 1.0 on "yes". As in verifiers,
reward functions may also name a `judge` argument to get the (cached) judge reply themselves:

    rubric = JudgeRubric(judge_model="gpt-4.1-mini")
    rubric.add_reward_func(rubric.judge_reward)

A failed judge call raises inside the reward function, so the rollout scores 0 with the error
recorded (see rubric.py) and the run goes on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.envs.parsers import Parser, last_assistant_text
from workbench.envs.rubric import RewardFunc, Rubric, ScoringInput, _parameters
from workbench.errors import UserError
from workbench.inference.client import Client
from workbench.types import Completion, Messages, SamplingParams, State

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

OPENAI_BASE_URL = "https://api.openai.com/v1"
OPENAI_KEY_VAR = "OPENAI_API_KEY"


def make_judge_client(model: str, base_url: str | None = None, api_key_var: str | None = None) -> Client:
    """The judge's client: `base_url` if given; else an endpoint id from configs/endpoints.toml;
    else 'tiny' or a local model folder; else the OpenAI API (key in $OPENAI_API_KEY)."""
    from workbench.inference.endpoints import load_endpoints
    from workbench.inference.resolve import make_client
    from workbench.workspace import TINY_MODEL_NAME, endpoints_path

    if base_url is None and (model in load_endpoints(endpoints_path()) or model == TINY_MODEL_NAME or Path(model).exists()):
        return make_client(model)
    var = api_key_var or (OPENAI_KEY_VAR if base_url is None else None)
    if var is not None and not os.environ.get(var):
        where = "the OpenAI API" if base_url is None else base_url
        raise UserError(f"judge model '{model}' on {where} needs an API key in ${var}: set it, or set judge_base_url "
                        "(and judge_api_key_var) for another server, or name an endpoint from configs/endpoints.toml")
    return make_client(model, base_url=base_url or OPENAI_BASE_URL, api_key_var=var)


class JudgeRubric(Rubric):
    """A `Rubric` with a judge model. Add `judge_reward` (or your own function taking `judge`)."""

    def __init__(
        self,
        funcs: Sequence[RewardFunc] = (),
        weights: Sequence[float] | None = None,
        parser: Parser | None = None,
        *,
        judge_client: Client | None = None,
        judge_model: str = "gpt-4.1-mini",
        judge_base_url: str | None = None,
        judge_api_key_var: str | None = None,
        judge_prompt: str = DEFAULT_JUDGE_PROMPT,
        judge_sampling_args: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(funcs, weights, parser)
        # Resolved now, so a missing key or a bad URL fails when the environment loads.
        self.judge_client = judge_client or make_judge_client(judge_model, judge_base_url, judge_api_key_var)
        # Nothing tells a rubric that the run is over, so a client made here is closed whenever
        # no judge call is in flight (and reopens on the next): no connection outlives the run.
        self._owns_client = judge_client is None
        self._in_flight = 0
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self.judge_prompt = judge_prompt
        self.judge_sampling = SamplingParams(temperature=0.0, max_tokens=64).merged(judge_sampling_args or {})

    def judge_messages(self, prompt: Messages, completion: Messages, answer: str) -> Messages:
        question = next((m.get("content") or "" for m in reversed(prompt) if m.get("role") == "user"), "")
        response = self.parser.parse_answer(completion) or last_assistant_text(completion)
        text = self.judge_prompt.format(question=question, answer=answer, response=response)
        return [{"role": "user", "content": text}]

    async def judge(self, prompt: Messages, completion: Messages, answer: str, state: State) -> str:
        """The judge's reply for this rollout (asked once, then cached in `state["judge_response"]`)."""
        if "judge_response" in state:
            return state["judge_response"]
        choices = await self._ask(self.judge_messages(prompt, completion, answer))
        reply = str(choices[0].message.get("content") or "")
        state["judge_response"] = reply
        return reply

    def _closing_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:  # an asyncio.Lock belongs to one loop
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    async def _ask(self, messages: Messages) -> list[Completion]:
        async with self._closing_lock():  # wait while an idle close is under way
            self._in_flight += 1
        try:
            return await self.judge_client.chat(messages, sampling=self.judge_sampling)
        finally:
            self._in_flight -= 1
            if self._owns_client and self._in_flight == 0:
                async with self._closing_lock():
                    if self._in_flight == 0:
                        await self.judge_client.close()

    async def judge_reward(self, prompt: Messages, completion: Messages, answer: str, state: State) -> float:
        """1.0 when the judge says the response matches the answer ("yes"), else 0.0."""
        reply = await self.judge(prompt, completion, answer, state)
        first_word = reply.strip().lower().lstrip("*\"'`").split(maxsplit=1)[:1]
        return 1.0 if first_word and first_word[0].rstrip(".!,:*\"'`") == "yes" else 0.0

    def _kwargs_for_rollout(self, func: RewardFunc, item: ScoringInput) -> dict[str, Any]:
        kwargs = super()._kwargs_for_rollout(func, item)
        names, takes_kwargs = _parameters(func)
        if "judge" in names or takes_kwargs:
            kwargs["judge"] = self.judge
        return kwargs
