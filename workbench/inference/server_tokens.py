"""Tokens in, tokens out over HTTP: `POST /inference/v1/generate`, the route vLLM's
OpenAI-compatible server answers for prime-rl-style trainers (vLLM's
`vllm/entrypoints/serve/disagg`: "Tokens IN <> Tokens OUT").

Request (vLLM's `GenerateRequest`):

    {"token_ids": [...], "sampling_params": {"max_tokens": 64, "temperature": 1.0, "n": 1,
     "logprobs": 0, "seed": 7, "stop": [...], ...}, "model": "NAME", "stream": false}

`sampling_params` is vLLM's `SamplingParams`: `logprobs` is how many alternatives per token
(0: the sampled token's logprob only; absent: none). Answer (`GenerateResponse`):

    {"request_id": ..., "choices": [{"index": 0, "token_ids": [...], "finish_reason": "stop",
     "logprobs": {"content": [{"token": "token_id:42", "logprob": -0.3, "top_logprobs": [...]}]}}],
     "usage": {...}, "prompt_logprobs": null}

As vLLM, tokens are named `token_id:N` (this route never detokenizes) and there is no text:
the client holds the tokenizer. The prompt is used exactly as given, so a trainer that builds
each turn's prompt from the previous turn's ids (`chat_tokens`) trains on exactly what was
sampled. A backend that cannot take token ids answers 400 with vLLM's message.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from aiohttp import web

from workbench.errors import InferenceError
from workbench.inference.server import BadRequest, error_response, json_response, parse_sampling
from workbench.types import Completion, SamplingParams

if TYPE_CHECKING:
    from workbench.inference.server import Handler, OpenAIServer

logger = logging.getLogger(__name__)

GENERATE_ROUTE = "/inference/v1/generate"
NOT_SUPPORTED = "The model does not support generate tokens API"  # vLLM's message
# vLLM's SamplingParams keys that mean nothing to a backend that never detokenizes on this route.
_IGNORED = frozenset({"detokenize", "skip_special_tokens", "spaces_between_special_tokens", "output_kind"})


@runtime_checkable
class TokenBackend(Protocol):
    """A backend that continues a prompt given as token ids (`LocalClient`)."""

    async def complete_ids(
        self,
        prompt_ids: list[int],
        *,
        sampling: SamplingParams,
        parse_tools: bool = False,
        adapter: str | None = None,
    ) -> list[Completion]: ...


def parse_generate(body: dict[str, Any]) -> tuple[list[int], SamplingParams, int | None]:
    """(prompt ids, sampling, logprobs wanted: alternatives per token, None for none)."""
    ids = body.get("token_ids")
    if not isinstance(ids, list) or not ids or not all(type(t) is int and t >= 0 for t in ids):
        raise BadRequest("'token_ids' must be a non-empty list of token ids", "token_ids")
    params = body.get("sampling_params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise BadRequest("'sampling_params' must be an object", "sampling_params")
    logprobs = params.get("logprobs")
    if logprobs is not None and (type(logprobs) is not int or logprobs < 0):
        raise BadRequest("'sampling_params.logprobs' must be a number of alternatives >= 0", "logprobs")
    # Our sampling parser reads the chat API's names: `logprobs` + `top_logprobs`.
    chat_form = {k: v for k, v in params.items() if k not in _IGNORED and k != "logprobs"}
    if logprobs:
        chat_form.update(logprobs=True, top_logprobs=logprobs)
    return ids, parse_sampling(chat_form), logprobs


class TokenRoutes:
    """`POST /inference/v1/generate` of one `OpenAIServer`."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server = server
        self._ids = itertools.count()

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {("POST", GENERATE_ROUTE): self.generate}

    async def generate(self, request: web.Request) -> web.Response:
        body = await self.server.read_body(request)
        if isinstance(body, web.Response):
            return body
        backend = self.server.client
        if not isinstance(backend, TokenBackend):
            return error_response(400, NOT_SUPPORTED)
        if body.get("stream") is True:
            return error_response(400, "this server's /inference/v1/generate does not stream", param="stream")
        model = body.get("model")
        server = self.server
        adapter = server.served_adapter(model)
        if isinstance(adapter, web.Response):
            return adapter
        try:
            ids, sampling, logprobs = parse_generate(body)
        except BadRequest as exc:
            return error_response(400, str(exc), param=exc.param)
        try:
            completions = await backend.complete_ids(ids, sampling=sampling, adapter=adapter)
        except InferenceError as exc:
            if exc.transient:
                return error_response(503, str(exc), type_="server_error")
            if exc.status == 404:
                return error_response(404, str(exc), param="model", code=404)
            return error_response(400, str(exc))
        except Exception as exc:  # a backend bug must not kill the server; the client sees 500
            logger.exception("backend failed on %s", GENERATE_ROUTE)
            return error_response(500, f"{type(exc).__name__}: {exc}", type_="server_error")
        return json_response(
            self._answer(body, model or server.served_model_name, ids, completions, logprobs)
        )

    def _answer(
        self,
        body: dict[str, Any],
        model: str,
        prompt_ids: list[int],
        completions: list[Completion],
        logprobs: int | None,
    ) -> dict[str, Any]:
        choices = []
        for index, completion in enumerate(completions):
            tokens = completion.tokens
            completion_ids = tokens.completion_ids if tokens is not None else []
            choice: dict[str, Any] = {
                "index": index,
                "logprobs": None,
                # This route never parses tool calls: a finish is "stop" or "length", as vLLM's.
                "finish_reason": "length" if completion.finish_reason == "length" else "stop",
                "token_ids": completion_ids,
            }
            if logprobs is not None and tokens is not None:
                top = tokens.top_logprobs
                choice["logprobs"] = {
                    "content": [
                        {
                            "token": f"token_id:{tid}",
                            "logprob": lp,
                            "top_logprobs": [
                                {"token": f"token_id:{alt}", "logprob": alt_lp}
                                for alt, alt_lp in (top[i] if top is not None and i < len(top) else [])
                            ],
                        }
                        for i, (tid, lp) in enumerate(zip(completion_ids, tokens.completion_logprobs))
                    ]
                }
            choices.append(choice)
        generated = sum(len(c["token_ids"]) for c in choices)
        request_id = body.get("request_id")
        return {
            "request_id": request_id if isinstance(request_id, str) else f"generate-tokens-{next(self._ids)}",
            "object": "generate",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": generated,
                "total_tokens": len(prompt_ids) + generated,
            },
            "prompt_logprobs": None,
        }
