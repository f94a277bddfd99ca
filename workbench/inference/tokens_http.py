"""Tokens in over HTTP: a trainer's rollouts against a server (vLLM, `workbench serve`) without
re-tokenization.

Through the chat API the server renders the whole conversation again every turn, and the ids
it renders for earlier assistant turns are not always the ids it sampled (a BPE tokenizer
merges "he" + "llo" into "hello"; templates reformat tool calls and drop earlier thinking).
The trainer then sees a turn's prompt that does not extend the previous turn's ids, and
`trajectory_strategy = "interleaved"` has to split the rollout into several samples.

`TokensInServer` renders prompts here, with the trainer's own tokenizer, and sends ids to the
server's tokens-in route (vLLM's `POST /inference/v1/generate`, `server_tokens.py`): turn 1 is
the chat template's rendering of the prompt, turn k+1 is turn k's prompt + sampled ids + the
template's rendering of the environment's reply (`chat_tokens.continuation_ids`). One sample
per rollout, every sampled token trained exactly as sampled: the guarantee colocated training
has with `LocalClient`.

Servers without the route (an older vLLM, OpenAI, llama.cpp) are found by `probe` before the
run: the client then sends everything through the chat API, as before, and says so once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import orjson

from workbench.errors import InferenceError
from workbench.inference.chat_tokens import continuation_ids, prompt_ids
from workbench.inference.openai_client import OpenAIClient, RoundRobinClient, error_for_status
from workbench.inference.reasoning import prompt_ends_in_thinking, reasoning_message, think_token_ids
from workbench.inference.server_tokens import GENERATE_ROUTE, NOT_SUPPORTED
from workbench.inference.tool_parsing import parse_hermes_tool_calls
from workbench.types import Completion, Messages, SamplingParams, TokenData


class TokensInServer:
    """A `TokensInClient` over one OpenAI-compatible server that offers tokens in.

    `tokens_in` is True until `probe` finds the server lacks the route; from then on `chat`
    is the wrapped `OpenAIClient`'s (and `continue_chat` is never called: the multi-turn loop
    reads `tokens_in` before each rollout)."""

    def __init__(self, server: OpenAIClient, tokenizer: Any, *, reasoning_parser: str | None = None) -> None:
        self.server = server
        self.tokenizer = tokenizer
        self.reasoning_parser = reasoning_parser
        self.tokens_in = True
        self._think_ids = think_token_ids(tokenizer) if reasoning_parser else None
        # Fast tokenizers are not safe to share between threads (rollouts may run beside a
        # trainer thread that also tokenizes).
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TokensInServer({self.server!r}, tokens_in={self.tokens_in})"

    @property
    def model(self) -> str:
        return self.server.model

    @property
    def tries(self) -> int:
        return self.server.tries

    @property
    def timeout_s(self) -> float:
        return self.server.timeout_s

    def use_model(self, name: str) -> None:
        self.server.use_model(name)

    async def probe(self, warn: Callable[[str], None]) -> bool:
        """Whether the server answers the tokens-in route (one 1-token generation). A server
        without it is used through the chat API from now on, and `warn` gets one line saying so.
        Raises `InferenceError` when the server cannot be reached at all."""
        eos = self.tokenizer.eos_token_id
        body = {
            "token_ids": [eos if isinstance(eos, int) else 0],
            "sampling_params": {"max_tokens": 1, "temperature": 0.0},
            "model": self.server.model,
        }
        status, payload = await self.server.post(GENERATE_ROUTE, orjson.dumps(body))
        if status < 400:
            return True
        if status in (404, 405) or (
            status == 400 and NOT_SUPPORTED.lower() in payload.decode(errors="replace").lower()
        ):
            self.tokens_in = False
            warn(
                f"{self.server.base_url} has no tokens-in route ({GENERATE_ROUTE}): training rollouts go "
                "through the chat API, which re-renders each conversation, so multi-turn rollouts may "
                "become several samples (recent vLLM releases answer it)"
            )
            return False
        raise error_for_status(status, payload, self.server.server_root + GENERATE_ROUTE)

    async def chat(
        self,
        messages: Messages,
        *,
        sampling: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[Completion]:
        if not self.tokens_in:
            return await self.server.chat(messages, sampling=sampling, tools=tools)
        try:
            with self._lock:
                ids = prompt_ids(self.tokenizer, messages, tools, _template_kwargs(sampling))
        except Exception as exc:  # a template error is the caller's input, not a transient fault
            raise InferenceError(f"could not apply the chat template: {exc}", transient=False) from exc
        return await self.generate(ids, sampling, parse_tools=bool(tools))

    async def continue_chat(
        self,
        previous: TokenData,
        new_messages: Messages,
        *,
        sampling: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[Completion]:
        """Turn k+1 from turn k's ids (see the module doc)."""
        try:
            with self._lock:
                bridge = continuation_ids(self.tokenizer, previous.completion_ids, new_messages, tools)
        except Exception as exc:
            raise InferenceError(f"could not apply the chat template: {exc}", transient=False) from exc
        ids = previous.prompt_ids + previous.completion_ids + bridge
        return await self.generate(ids, sampling, parse_tools=bool(tools))

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, parse_tools: bool
    ) -> list[Completion]:
        """Sample from `prompt_ids` as given; completions carry the ids and their logprobs."""
        url = self.server.server_root + GENERATE_ROUTE
        status, payload = await self.server.post(
            GENERATE_ROUTE, orjson.dumps(self.request_body(prompt_ids, sampling))
        )
        if status >= 400:
            raise error_for_status(status, payload, url)
        try:
            answer = orjson.loads(payload)
            choices = sorted(answer["choices"], key=lambda c: c.get("index", 0))
            if not choices:
                raise ValueError("the answer has no choices")
            return [self._completion(prompt_ids, choice, sampling, parse_tools) for choice in choices]
        except (orjson.JSONDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InferenceError(
                f"malformed response from {url}: {type(exc).__name__}: {exc}", transient=False, status=status
            ) from exc

    def request_body(self, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
        """vLLM's `GenerateRequest` for one prompt (public so tests can inspect it)."""
        params: dict[str, Any] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "max_tokens": sampling.max_tokens,
            "n": sampling.n,
            "logprobs": 0,  # the sampled token's own logprob: what importance ratios need
        }
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        # min_p, repetition_penalty, ... as vLLM names them; the template's own settings were
        # used here, where the prompt was rendered.
        params.update({k: v for k, v in sampling.extra.items() if k != "chat_template_kwargs"})
        return {"token_ids": prompt_ids, "sampling_params": params, "model": self.server.model}

    def _completion(
        self, prompt_ids: list[int], choice: dict[str, Any], sampling: SamplingParams, parse_tools: bool
    ) -> Completion:
        ids = [int(t) for t in choice["token_ids"]]
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [float(entry["logprob"]) for entry in content]
        if len(logprobs) != len(ids):
            raise ValueError(f"{len(logprobs)} logprobs for {len(ids)} sampled tokens")
        with self._lock:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        text = _cut_at_stop(text, sampling.stop)
        prompt_open = prompt_ends_in_thinking(prompt_ids, self._think_ids)
        message = reasoning_message(text, self.reasoning_parser, prompt_open=prompt_open)
        finish_reason = choice.get("finish_reason") or "stop"
        if parse_tools:
            rest, tool_calls = parse_hermes_tool_calls(message["content"])
            if tool_calls:
                message.update(content=rest, tool_calls=tool_calls)
                finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
        return Completion(
            message=message,
            finish_reason=finish_reason,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(ids),
            tokens=TokenData(list(prompt_ids), ids, logprobs),
        )

    async def close(self) -> None:
        await self.server.close()


def _template_kwargs(sampling: SamplingParams) -> dict[str, Any]:
    """vLLM's `chat_template_kwargs` (e.g. `enable_thinking`): applied where the prompt is rendered."""
    kwargs = sampling.extra.get("chat_template_kwargs")
    return dict(kwargs) if isinstance(kwargs, dict) else {}


def _cut_at_stop(text: str, stops: list[str]) -> str:
    """The text before the first stop string (vLLM leaves stop strings out of the text)."""
    cut = min((i for i in (text.find(stop) for stop in stops if stop) if i >= 0), default=-1)
    return text[:cut] if cut >= 0 else text


async def probe_tokens_in(pool: RoundRobinClient, warn: Callable[[str], None]) -> bool:
    """Ask every replica of `pool` whether it offers tokens in (`TokensInServer.probe`); the pool
    continues rollouts by token ids only when all of them do (a rollout's turns may land on any
    replica), else every replica goes through the chat API. Returns the pool's `tokens_in`."""
    servers = [client for client in pool.clients if isinstance(client, TokensInServer)]
    offered = [await server.probe(warn) for server in servers]
    if servers and not all(offered):
        for server in servers:
            server.tokens_in = False
    pool.tokens_in = bool(servers) and all(offered) and len(servers) == len(pool.clients)
    return pool.tokens_in
