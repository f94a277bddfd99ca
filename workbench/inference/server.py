"""An OpenAI-compatible HTTP server over any `Client` (what `workbench serve MODEL` runs).

Speaks the subset of the OpenAI chat API that vLLM speaks, including vLLM's RL extras
(`top_k`, `return_tokens_as_token_ids`, `return_token_ids`), so the CPU path is tested
exactly as vLLM is used on a GPU. With a backend that can change its weights (`LocalClient`)
it also serves vLLM's runtime LoRA API and prime-rl's `/update_weights` (`server_weights`).
The handler is deliberately lean (orjson, hand-rolled
validation, no middleware, no access log): the same server measures engine overhead with
an instant backend, where per-request cost is the whole measurement.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, overload

import orjson
from aiohttp import web

from workbench import startup
from workbench.errors import InferenceError, UserError
from workbench.inference.client import Client
from workbench.inference.generation import MAX_TOP_LOGPROBS
from workbench.types import Completion, SamplingParams

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Statuses a transient backend error keeps; anything else becomes 503 so clients retry.
_RETRYABLE = frozenset({408, 409, 429, 500, 502, 503, 504})
# Request keys consumed here; any other key reaches the backend through `SamplingParams.extra`.
_CONSUMED = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "top_k",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "n",
        "seed",
        "stream",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "return_tokens_as_token_ids",
        "return_token_ids",
        "user",
        "metadata",
        "store",
        "service_tier",
        "include_reasoning",
    }
)
# Long multi-turn prompts with tool output easily pass aiohttp's 1 MiB default.
_MAX_BODY_BYTES = 64 * 1024 * 1024
_HEALTH_BODY = orjson.dumps({"status": "ok"})


class BadRequest(Exception):
    """The request body is not a valid chat completion request (→ HTTP 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def error_response(
    status: int,
    message: str,
    *,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | int | None = None,
) -> web.Response:
    """An OpenAI-style error body: `{"error": {"message", "type", "param", "code"}}`
    (vLLM puts the HTTP status in `code`; OpenAI a string such as "model_not_found")."""
    return json_response({"error": {"message": message, "type": type_, "param": param, "code": code}}, status)


def _number(body: dict[str, Any], key: str, default: float, *, minimum: float | None = None) -> float:
    value = body.get(key)
    if value is None:
        return default
    # bool is an int subclass; `true` is never a valid temperature.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"'{key}' must be a number, got {value!r}", key)
    if minimum is not None and value < minimum:
        raise BadRequest(f"'{key}' must be >= {minimum}, got {value!r}", key)
    return float(value)


@overload
def _integer(body: dict[str, Any], key: str, default: int, *, minimum: int | None = None) -> int: ...
@overload
def _integer(body: dict[str, Any], key: str, default: None, *, minimum: int | None = None) -> int | None: ...
def _integer(
    body: dict[str, Any], key: str, default: int | None, *, minimum: int | None = None
) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be an integer, got {value!r}", key)
    if minimum is not None and value < minimum:
        raise BadRequest(f"'{key}' must be >= {minimum}, got {value!r}", key)
    return value


def parse_sampling(body: dict[str, Any]) -> SamplingParams:
    """The request's sampling settings; unknown keys (min_p, ...) go to `extra` for the backend."""
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise BadRequest("'stop' must be a string or a list of strings", "stop")
    max_tokens = _integer(body, "max_completion_tokens", None, minimum=1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", SamplingParams.max_tokens, minimum=1)
    extra = {k: v for k, v in body.items() if k not in _CONSUMED}
    top = _integer(body, "top_logprobs", 0, minimum=0)
    if top > MAX_TOP_LOGPROBS:
        raise BadRequest(f"'top_logprobs' must be at most {MAX_TOP_LOGPROBS}", "top_logprobs")
    if top and body.get("logprobs"):  # the alternatives come with the sampled tokens' logprobs
        extra["top_logprobs"] = top
    return SamplingParams(
        temperature=_number(body, "temperature", 1.0, minimum=0.0),
        top_p=_number(body, "top_p", 1.0, minimum=0.0),
        top_k=_integer(body, "top_k", -1, minimum=-1),
        max_tokens=max_tokens,
        stop=stop,
        n=_integer(body, "n", 1, minimum=1),
        seed=_integer(body, "seed", None),
        extra=extra,
    )


def _parse_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of messages", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]")
    return messages


def _parse_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None or body.get("tool_choice") == "none":
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadRequest("'tools' must be a list of tool objects", "tools")
    return tools or None


def _wire_tool_calls(tool_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls in OpenAI wire form: `arguments` is a JSON string, every call has an id."""
    wired = []
    for i, call in enumerate(tool_calls):
        function = dict(call.get("function") or {})
        if not isinstance(function.get("arguments", ""), str):
            function["arguments"] = orjson.dumps(function["arguments"]).decode()
        wired.append(
            {"id": call.get("id") or f"call_{i}", "type": call.get("type", "function"), "function": function}
        )
    return wired


class OpenAIServer:
    """Route handlers over one `Client`; `create_app` mounts them."""

    def __init__(
        self, client: Client, served_model_name: str, *, enable_lora: bool = False, max_lora_rank: int = 16
    ) -> None:
        self.client = client
        self.served_model_name = served_model_name
        # Names of the base model accepted in `model`.
        self.model_names: set[str] = {served_model_name}
        # Runtime LoRA adapters (name -> folder), kept by `server_weights` in step with the backend.
        self.lora_paths: dict[str, str] = {}
        self.enable_lora = enable_lora
        self.max_lora_rank = max_lora_rank
        # One weight change at a time, so "is this name loaded?" and the load agree.
        self.weights_admin_lock = asyncio.Lock()
        self.created = int(time.time())
        # Ids only need to be unique per server: a counter is cheaper than uuid4 per request.
        self._ids = itertools.count()
        self._id_prefix = f"chatcmpl-{os.getpid():x}{self.created:x}-"
        # Optional backend hook for the text of one token id (`logprobs.content[].token`).
        self._token_to_str: Callable[[int], str] | None = getattr(client, "token_to_str", None)
        from workbench.inference.server_completions import TextCompletions  # it imports this module

        self.text_completions = TextCompletions(self)

    def routes(self) -> dict[tuple[str, str], Handler]:
        """(method, path) → handler, including the weight-update routes (`server_weights`)."""
        from workbench.inference.server_tokens import TokenRoutes
        from workbench.inference.server_weights import WeightRoutes

        return {
            ("GET", "/health"): self.health,
            ("GET", "/v1/models"): self.list_models,
            ("POST", "/v1/chat/completions"): self.chat_completions,
            ("POST", "/v1/completions"): self.completions,
            **TokenRoutes(self).routes(),
            **WeightRoutes(self).routes(),
        }

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(body=_HEALTH_BODY, content_type="application/json")

    async def list_models(self, request: web.Request) -> web.Response:
        # As vLLM: base models first (parent null), then each adapter with its folder as
        # `root` and the base model as `parent`.
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "workbench",
                "root": name,
                "parent": None,
            }
            for name in sorted(self.model_names)
        ] + [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "workbench",
                "root": path,
                "parent": self.served_model_name,
            }
            for name, path in sorted(self.lora_paths.items())
        ]
        return json_response({"object": "list", "data": data})

    async def not_found(self, request: web.Request) -> web.Response:
        return error_response(404, f"no route for {request.method} {request.path}", code="not_found")

    async def read_body(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The request's JSON object, or the error response to send instead."""
        try:
            body = orjson.loads(await request.read())
        except ConnectionResetError:  # the client left mid-request (a Ctrl-C'd eval): nobody to answer
            return web.Response(status=499)
        except orjson.JSONDecodeError as exc:
            return error_response(400, f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return error_response(400, "request body must be a JSON object")
        return body

    def served_adapter(self, model: object) -> str | None | web.Response:
        """The runtime LoRA adapter a request's `model` names (None: the base model), or the
        error response for a model this server does not serve."""
        if model is not None and not isinstance(model, str):
            return error_response(400, "'model' must be a string", param="model")
        if model is None or model in self.model_names:
            return None
        if model in self.lora_paths:
            return model
        served = ", ".join(sorted(self.model_names | set(self.lora_paths)))
        return error_response(
            404,
            f"The model `{model}` does not exist (served: {served}).",
            param="model",
            code="model_not_found",
        )

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self.read_body(request)
        if isinstance(body, web.Response):
            return body
        model = body.get("model")
        adapter = self.served_adapter(model)
        if isinstance(adapter, web.Response):
            return adapter
        stream = body.get("stream") is True
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            return error_response(400, "'stream_options' must be an object", param="stream_options")
        try:
            messages = _parse_messages(body)
            tools = _parse_tools(body)
            sampling = parse_sampling(body)
        except BadRequest as exc:
            return error_response(400, str(exc), param=exc.param)

        try:
            if adapter is None:
                completions = await self.client.chat(messages, sampling=sampling, tools=tools)
            else:  # only backends with `load_adapter` ever have adapters
                completions = await self.client.chat(  # type: ignore[call-arg]
                    messages, sampling=sampling, tools=tools, adapter=adapter
                )
        except InferenceError as exc:
            if exc.transient:
                status = exc.status if exc.status in _RETRYABLE else 503
                return error_response(status, str(exc), type_="server_error")
            if exc.status == 404:  # an adapter unloaded between the name check and the batch
                return error_response(404, str(exc), param="model", code="model_not_found")
            return error_response(400, str(exc))
        except Exception as exc:  # a backend bug must not kill the server; the client sees 500
            logger.exception("backend failed on /v1/chat/completions")
            return error_response(500, f"{type(exc).__name__}: {exc}", type_="server_error")

        response = self._response(model or self.served_model_name, completions, body)
        if stream:
            return await stream_chat(request, response, include_usage=options.get("include_usage") is True)
        return json_response(response)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """`/v1/completions`: text generation (`server_completions`), or prompt scoring as a
        distillation teacher uses vLLM's: a prompt of token ids with `echo: true` and `logprobs`
        returns each prompt token's logprob (`choices[0].logprobs.token_logprobs`, the first
        null) and generates nothing."""
        body = await self.read_body(request)
        if isinstance(body, web.Response):
            return body
        if not body.get("echo"):
            return await self.text_completions.answer(request, body)
        score = getattr(self.client, "prompt_logprobs", None)
        if body.get("logprobs") is None:
            return error_response(
                400,
                "prompt scoring ('echo': true) needs 'logprobs': send a prompt of token ids with 'logprobs': 0",
            )
        if score is None:
            return error_response(400, "this backend cannot score prompts")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt = prompt[0]
        if (
            not isinstance(prompt, list)
            or not prompt
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            return error_response(400, "'prompt' must be a non-empty list of token ids", param="prompt")
        try:
            logprobs = await score(prompt)
        except InferenceError as exc:
            return error_response(503 if exc.transient else 400, str(exc))
        return json_response(
            {
                "id": f"cmpl-{next(self._ids)}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model") or self.served_model_name,
                "choices": [
                    {
                        "index": 0,
                        "text": "",
                        "finish_reason": "length",
                        "logprobs": {
                            "token_logprobs": [None, *logprobs[1:]],
                            "tokens": [f"token_id:{t}" for t in prompt],
                        },
                    }
                ],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": 0, "total_tokens": len(prompt)},
            }
        )

    async def load_static_loras(self, modules: dict[str, str]) -> None:
        """Load `--lora-modules` at startup; the first failure is a UserError."""
        from workbench.errors import UserError
        from workbench.inference.server_weights import WeightRoutes

        routes = WeightRoutes(self)
        for lora_name, lora_path in modules.items():
            status, message, _ = await routes.load(lora_name, lora_path, load_inplace=False)
            if status != 200:
                raise UserError(f"--lora-modules {lora_name}={lora_path}: {message}")

    def _response(self, model: str, completions: list[Completion], body: dict[str, Any]) -> dict[str, Any]:
        want_logprobs = bool(body.get("logprobs"))
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        want_ids = bool(body.get("return_token_ids"))
        # As vLLM: thinking is returned unless the request says `"include_reasoning": false`.
        include_reasoning = body.get("include_reasoning", True) is not False
        choices = []
        for index, completion in enumerate(completions):
            message = dict(completion.message)
            message["role"] = "assistant"
            message.setdefault("content", None)
            thinking = message.pop("reasoning_content", None)
            if thinking is not None and include_reasoning:
                # Both names, as vLLM 0.11+ (`reasoning`; `reasoning_content` kept for older clients).
                message["reasoning"] = message["reasoning_content"] = thinking
            if message.get("tool_calls"):
                message["tool_calls"] = _wire_tool_calls(message["tool_calls"])
            else:
                message.pop("tool_calls", None)
            choice: dict[str, Any] = {
                "index": index,
                "message": message,
                "logprobs": None,
                "finish_reason": completion.finish_reason,
            }
            tokens = completion.tokens
            if tokens is not None:
                if want_logprobs:
                    content = self._logprob_content(
                        tokens.completion_ids, tokens.completion_logprobs, as_ids, tokens.top_logprobs
                    )
                    choice["logprobs"] = {"content": content}
                if want_ids:
                    choice["token_ids"] = tokens.completion_ids
            choices.append(choice)

        prompt_tokens = completions[0].prompt_tokens if completions else 0
        completion_tokens = sum(c.completion_tokens for c in completions)
        response: dict[str, Any] = {
            "id": f"{self._id_prefix}{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        if want_ids and completions and completions[0].tokens is not None:
            response["prompt_token_ids"] = completions[0].tokens.prompt_ids
        return response

    def _logprob_content(
        self,
        ids: list[int],
        logprobs: list[float],
        as_ids: bool,
        top: list[list[tuple[int, float]]] | None = None,
    ) -> list[dict[str, Any]]:
        # Without a detokenizer hook the id form is the only honest token text.
        to_str = None if as_ids else self._token_to_str

        def text(tid: int) -> str:
            return to_str(tid) if to_str is not None else f"token_id:{tid}"

        return [
            {
                "token": text(tid),
                "logprob": lp,
                "bytes": None,
                "top_logprobs": [
                    {"token": text(alt), "logprob": alt_lp, "bytes": None}
                    for alt, alt_lp in (top[i] if top is not None and i < len(top) else [])
                ],
            }
            for i, (tid, lp) in enumerate(zip(ids, logprobs))
        ]


async def stream_chat(
    request: web.Request, response: dict[str, Any], *, include_usage: bool
) -> web.StreamResponse:
    """A finished chat completion sent as `stream: true` clients read it: server-sent events of
    `chat.completion.chunk`s (the role, the content with its logprobs, tool calls, the finish
    reason; usage last when `stream_options.include_usage`), then `data: [DONE]`, as vLLM sends
    them. Simplification: the backends generate whole answers, so the chunks come once the
    answer is done, not token by token."""
    sse = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await sse.prepare(request)
    head = {k: response[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
        await sse.write(b"data: " + orjson.dumps({**head, "choices": choices, **extra}) + b"\n\n")

    for choice in response["choices"]:
        index, message = choice["index"], choice["message"]
        await send(
            [
                {
                    "index": index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        )
        delta = {k: message[k] for k in ("reasoning", "reasoning_content") if message.get(k) is not None}
        if message.get("content"):
            delta["content"] = message["content"]
        if delta:
            await send(
                [{"index": index, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}]
            )
        if message.get("tool_calls"):
            calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
            await send(
                [{"index": index, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}]
            )
        await send(
            [{"index": index, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}]
        )
    if include_usage:
        await send([], usage=response["usage"])
    await sse.write(b"data: [DONE]\n\n")
    await sse.write_eof()
    return sse


SERVER_KEY = web.AppKey("workbench_server", OpenAIServer)


def create_app(
    client: Client,
    *,
    served_model_name: str,
    middlewares: Iterable[Any] = (),
    enable_lora: bool = False,
    max_lora_rank: int = 16,
) -> web.Application:
    """The aiohttp app serving `client` as `served_model_name`. `middlewares` is for tests
    (fault injection); production serving uses none, to keep per-request cost minimal.
    `enable_lora`/`max_lora_rank`: as vLLM's `--enable-lora`/`--max-lora-rank`."""
    server = OpenAIServer(client, served_model_name, enable_lora=enable_lora, max_lora_rank=max_lora_rank)
    app = web.Application(client_max_size=_MAX_BODY_BYTES, middlewares=list(middlewares))
    app[SERVER_KEY] = server
    for (method, path), handler in server.routes().items():
        app.router.add_route(method, path, handler)
    # Last: unknown paths get an OpenAI-style JSON 404 instead of aiohttp's plain text.
    app.router.add_route("*", "/{tail:.*}", server.not_found)
    return app


async def serve(
    app: web.Application,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[str], None] | None = None,
    shutdown_timeout: float = 5.0,
) -> None:
    """Serve `app` until `stop` is set (or SIGINT/SIGTERM when `stop` is None).

    `on_ready` gets the base URL (`http://host:port`) once the socket is bound, with the
    real port when `port=0`.
    """
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:  # in use, no permission, an address this machine does not have
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        bound_port = runner.addresses[0][1]
        startup.release()  # the command's start-up is over (workbench/startup.py)
        url_host = f"[{host}]" if ":" in host else host
        if on_ready is not None:
            on_ready(f"http://{url_host}:{bound_port}")
        loop = asyncio.get_running_loop()
        handled: list[signal.Signals] = []
        if stop is None:
            stop = asyncio.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, stop.set)
                    handled.append(sig)
                except (NotImplementedError, RuntimeError):  # Windows, or not the main thread
                    pass
        try:
            await stop.wait()
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)
    finally:
        await runner.cleanup()


def run_server(
    client: Client,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    *,
    close_client: bool = True,
    enable_lora: bool = False,
    max_lora_rank: int = 16,
    lora_modules: dict[str, str] | None = None,
) -> None:
    """Serve `client` over HTTP until SIGINT/SIGTERM (blocking); prints the URL once ready.
    `lora_modules` (name -> adapter folder) are loaded before the server starts, as vLLM's
    `--lora-modules`; a failure there is a UserError."""
    name = served_model_name or client.model

    def announce(url: str) -> None:
        print(f"Serving model '{name}' at {url}/v1 (OpenAI-compatible; Ctrl-C to stop)", flush=True)

    async def main() -> None:
        try:
            app = create_app(
                client, served_model_name=name, enable_lora=enable_lora, max_lora_rank=max_lora_rank
            )
            await app[SERVER_KEY].load_static_loras(lora_modules or {})
            await serve(app, host=host, port=port, on_ready=announce)
        finally:
            if close_client:
                await client.close()

    asyncio.run(main())
