"""Text completions on `workbench serve`: `POST /v1/completions` generating from a plain prompt, as
the OpenAI API and vLLM answer it (prompt scoring with `echo` stays in `server.py`).

- `prompt`: a string, a list of token ids, or a list of either (one choice set per prompt:
  choice index = prompt index * n + i, as vLLM numbers them). A string is tokenized without
  a chat template, with the tokenizer's special tokens (vLLM's `add_special_tokens=True`).
- `logprobs: k` (the legacy form): `tokens`, `token_logprobs`, `top_logprobs` (a dict of the
  k most likely per token) and `text_offset` per choice; token text unless
  `return_tokens_as_token_ids`.
- `stream: true`: `text_completion` chunks as server-sent events, usage last when
  `stream_options.include_usage`, then `data: [DONE]`. As for chat, the chunks come once the
  answer is generated (the backends generate whole answers).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import orjson
from aiohttp import web

from workbench.errors import InferenceError
from workbench.inference.server import BadRequest, error_response, json_response, parse_sampling
from workbench.types import Completion, SamplingParams

if TYPE_CHECKING:
    from workbench.inference.server import OpenAIServer

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


@runtime_checkable
class TextBackend(Protocol):
    """A backend that completes plain text (`LocalClient`)."""

    def encode_text(self, text: str) -> list[int]: ...

    def token_to_str(self, token_id: int) -> str: ...

    async def complete_ids(
        self,
        prompt_ids: list[int],
        *,
        sampling: SamplingParams,
        parse_tools: bool = False,
        adapter: str | None = None,
    ) -> list[Completion]: ...


def _prompts(body: dict[str, Any], backend: TextBackend) -> list[list[int]]:
    """The request's prompts as token ids."""
    prompt = body.get("prompt")

    def ids(value: object) -> list[int] | None:
        if isinstance(value, str):
            return backend.encode_text(value) if value else None
        if isinstance(value, list) and value and all(type(t) is int and t >= 0 for t in value):
            return list(value)
        return None

    one = ids(prompt)
    if one is not None:
        return [one]
    many = [ids(p) for p in prompt] if isinstance(prompt, list) and prompt else [None]
    if any(p is None for p in many):
        raise BadRequest(
            "'prompt' must be a non-empty string, a list of token ids, or a list of those", "prompt"
        )
    return [p for p in many if p is not None]


def _sampling(body: dict[str, Any]) -> tuple[SamplingParams, int | None]:
    """Sampling settings, and `logprobs` (alternatives per token; None: no logprobs)."""
    logprobs = body.get("logprobs")
    if logprobs is not None and (type(logprobs) is not int or not 0 <= logprobs <= MAX_LOGPROBS):
        raise BadRequest(f"'logprobs' must be a number from 0 to {MAX_LOGPROBS}", "logprobs")
    # `parse_sampling` reads the chat API's names: `logprobs` + `top_logprobs`.
    chat_form = {k: v for k, v in body.items() if k not in ("prompt", "logprobs", "echo", "suffix")}
    chat_form["max_tokens"] = body.get("max_tokens", 16)  # the completions API's default, OpenAI's and vLLM's
    if logprobs:
        chat_form.update(logprobs=True, top_logprobs=logprobs)
    return parse_sampling(chat_form), logprobs


class TextCompletions:
    """`POST /v1/completions` with generation, for one `OpenAIServer`."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server = server
        self._ids = itertools.count()

    async def answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        backend = self.server.client
        if not isinstance(backend, TextBackend):
            return error_response(400, "this backend cannot complete plain text: use /v1/chat/completions")
        model = body.get("model")
        adapter = self.server.served_adapter(model)
        if isinstance(adapter, web.Response):
            return adapter
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            return error_response(400, "'stream_options' must be an object", param="stream_options")
        try:
            prompts = _prompts(body, backend)
            sampling, logprobs = _sampling(body)
        except BadRequest as exc:
            return error_response(400, str(exc), param=exc.param)
        try:
            answers = await asyncio.gather(
                *(backend.complete_ids(ids, sampling=sampling, adapter=adapter) for ids in prompts)
            )
        except InferenceError as exc:
            if exc.transient:
                return error_response(503, str(exc), type_="server_error")
            return error_response(404 if exc.status == 404 else 400, str(exc))
        as_ids = body.get("return_tokens_as_token_ids") is True
        response = self._response(
            model or self.server.served_model_name, prompts, answers, logprobs, as_ids, backend
        )
        if body.get("stream") is True:
            return await _stream(request, response, include_usage=options.get("include_usage") is True)
        return json_response(response)

    def _response(
        self,
        model: str,
        prompts: list[list[int]],
        answers: list[list[Completion]],
        logprobs: int | None,
        as_ids: bool,
        backend: TextBackend,
    ) -> dict[str, Any]:
        def text(token_id: int) -> str:
            return f"token_id:{token_id}" if as_ids else backend.token_to_str(token_id)

        choices: list[dict[str, Any]] = []
        for completion in (c for completions in answers for c in completions):
            choice: dict[str, Any] = {
                "index": len(choices),
                "text": completion.message.get("content") or "",
                "logprobs": None,
                "finish_reason": completion.finish_reason,
            }
            tokens = completion.tokens
            if logprobs is not None and tokens is not None:
                pieces = [text(t) for t in tokens.completion_ids]
                offsets = list(itertools.accumulate((len(p) for p in pieces[:-1]), initial=0))
                top = tokens.top_logprobs or []
                choice["logprobs"] = {
                    "tokens": pieces,
                    "token_logprobs": tokens.completion_logprobs,
                    "top_logprobs": [
                        {text(alt): lp for alt, lp in (top[i] if i < len(top) else [])} if logprobs else None
                        for i in range(len(pieces))
                    ],
                    "text_offset": offsets if pieces else [],
                }
            choices.append(choice)
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(c.completion_tokens for completions in answers for c in completions)
        return {
            "id": f"cmpl-{next(self._ids)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


async def _stream(
    request: web.Request, response: dict[str, Any], *, include_usage: bool
) -> web.StreamResponse:
    """The answer as `text_completion` chunks: each choice's text (with its logprobs), then its
    finish reason; usage last when asked; `data: [DONE]`."""
    sse = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await sse.prepare(request)
    head = {k: response[k] for k in ("id", "object", "created", "model")}

    async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
        await sse.write(b"data: " + orjson.dumps({**head, "choices": choices, **extra}) + b"\n\n")

    for choice in response["choices"]:
        await send(
            [
                {
                    "index": choice["index"],
                    "text": choice["text"],
                    "logprobs": choice["logprobs"],
                    "finish_reason": None,
                }
            ]
        )
        await send(
            [
                {
                    "index": choice["index"],
                    "text": "",
                    "logprobs": None,
                    "finish_reason": choice["finish_reason"],
                }
            ]
        )
    if include_usage:
        await send([], usage=response["usage"])
    await sse.write(b"data: [DONE]\n\n")
    await sse.write_eof()
    return sse
