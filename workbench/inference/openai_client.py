"""`OpenAIClient` for any OpenAI-compatible server (vLLM, OpenAI, `workbench serve`), and
`RoundRobinClient` to spread calls over replicas.

Failures become `InferenceError`s classified as transient (connection refused/reset, DNS,
timeouts, 408/409/429/5xx) or permanent (other 4xx, malformed responses). This module
never retries: the engine retries transient errors (`tries` per request) with backoff, and
with a `RoundRobinClient` the retry naturally lands on another replica.

A request times out when its server has been *silent* for `timeout_s`: no answer to this
request nor to any other since it was sent. A busy server that answers others (a long queue,
a big batch) never times a request out; a stalled one (it may still answer `/v1/models`) is
noticed within `timeout_s` however many requests wait on it.

HTTP is aiohttp for every URL (`http_session.HttpSession`: one session, keep-alive).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

import aiohttp
import orjson
from yarl import URL

from workbench.errors import CONTEXT_LENGTH_MARKERS, ContextLengthError, InferenceError
from workbench.inference.client import Client, TokensInClient
from workbench.inference.http_session import HttpSession
from workbench.inference.reasoning import check_reasoning_parser, split_reasoning
from workbench.inference.silence_watch import SilenceWatch
from workbench.types import Completion, Messages, SamplingParams, TokenData

TRANSIENT_STATUSES = frozenset({408, 409, 429})  # plus every 5xx
# Seconds of silence after which a request is given up and retried: long enough for any server
# that is merely slow to answer *something*, short enough that a stall shows within a minute.
# Raise it (--timeout, or `timeout` in the endpoint registry) for one-at-a-time long generations.
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_TRIES = 5  # tries per request: enough to ride out a server restart of a few seconds
_TOKEN_ID_PREFIX = "token_id:"


def is_transient_status(status: int) -> bool:
    """Whether an HTTP error status is worth retrying."""
    return status in TRANSIENT_STATUSES or status >= 500


def error_for_status(status: int, body: bytes, url: str) -> InferenceError:
    """An `InferenceError` for an HTTP error response, carrying the server's own message."""
    message = _server_message(body)
    if status == 400 and any(marker in message.lower() for marker in CONTEXT_LENGTH_MARKERS):
        return ContextLengthError(f"HTTP {status} from {url}: {message}", status=status)
    return InferenceError(
        f"HTTP {status} from {url}: {message}",
        transient=is_transient_status(status),
        status=status,
    )


def error_for_exception(exc: BaseException, url: str) -> InferenceError:
    """Classify a transport-level failure. Only certificate problems and bad URLs are
    permanent: a refused, reset or timed-out connection may well work on the next try."""
    if isinstance(exc, (aiohttp.ClientSSLError, aiohttp.InvalidURL)):
        return InferenceError(f"{type(exc).__name__} calling {url}: {exc}", transient=False)
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return InferenceError(f"no response from {url} (timed out)", transient=True)
    if isinstance(exc, aiohttp.ClientConnectorError):  # says why in words, not aiohttp's repr
        refused = isinstance(exc.os_error, ConnectionRefusedError)
        return InferenceError(
            f"cannot connect to {url}: {_connect_failure(exc.os_error)}", transient=True, refused=refused
        )
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return InferenceError(f"{url} closed the connection before answering", transient=True)
    if isinstance(exc, aiohttp.ClientPayloadError):  # cut short, or a broken chunked/gzip body
        return InferenceError(f"incomplete answer from {url}: {exc}", transient=True)
    if isinstance(exc, aiohttp.ClientResponseError):  # garbled HTTP (we never raise for a status)
        return InferenceError(f"bad HTTP response from {url}: {exc.message}", transient=True)
    if isinstance(exc, (aiohttp.ClientError, OSError)):
        return InferenceError(f"{type(exc).__name__} calling {url}: {exc}", transient=True)
    return InferenceError(f"{type(exc).__name__} calling {url}: {exc}", transient=False)


def _connect_failure(error: OSError) -> str:
    """Why a connect failed, in words: "connection refused", "name or service not known"."""
    if isinstance(error, socket.gaierror) or not error.errno:
        return (error.strerror or str(error)).lower()
    return os.strerror(error.errno).lower()


def _server_message(body: bytes) -> str:
    """The human message of an error body (OpenAI, vLLM and FastAPI shapes), else the raw text."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:500].decode("utf-8", errors="replace").strip() or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if data.get(key):
                return str(data[key])
    return str(data)[:500]


def _normalize_base_url(base_url: str) -> str:
    """`http://host:8000` and `http://host:8000/v1/` both mean `http://host:8000/v1`."""
    url = base_url.rstrip("/")
    if URL(url).path in ("", "/"):
        url += "/v1"
    return url


class OpenAIClient:
    """A `Client` over one OpenAI-compatible `/v1/chat/completions` endpoint.

    With `return_tokens=True` it asks for sampled logprobs and token ids the vLLM way and
    fills `Completion.tokens` (what RL trains on). Connections are made lazily inside the
    running event loop and reused (one aiohttp session, keep-alive, at most `max_connections`
    sockets; see http_session.py).

    Thinking: a server's `reasoning_content` (vLLM) or `reasoning` (newer vLLM, OpenRouter)
    becomes the message's `reasoning_content`. With `reasoning_parser` set, a reply that still
    has `<think>` inline in its content (a server started without a reasoning parser) is split
    here, as that parser would have split it on the server.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        tries: int = DEFAULT_TRIES,
        max_connections: int = 256,
        extra_headers: dict[str, str] | None = None,
        return_tokens: bool = False,
        max_tokens_field: str = "max_tokens",
        reasoning_parser: str | None = None,
    ) -> None:
        self.base_url = _normalize_base_url(base_url)
        self.reasoning_parser = check_reasoning_parser(reasoning_parser)
        self.model = model
        self.return_tokens = return_tokens
        # Seconds of silence from the server before a request is retried (`timeout_s`, kept by the watch).
        self._watch = SilenceWatch(timeout_s)
        self.tries = tries  # read by the engine's RetryingClient (engine.retry.policy_for)
        self.max_connections = max_connections
        # OpenAI's reasoning models only accept `max_completion_tokens`; vLLM takes both.
        self.max_tokens_field = max_tokens_field
        self._url = f"{self.base_url}/chat/completions"
        self._chat_url = URL(self._url)  # parsed once: the hot path passes it as is
        self._headers = {"Content-Type": "application/json", **(extra_headers or {})}
        self.api_key = api_key  # for weight updates to the same server; never in repr or logs
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._http = HttpSession(
            self._headers, max_connections=max_connections, connect_timeout_s=min(self.timeout_s, 30.0)
        )

    def __repr__(self) -> str:
        # Never the key nor the headers (which carry it).
        return f"OpenAIClient(base_url={self.base_url!r}, model={self.model!r}, return_tokens={self.return_tokens})"

    __str__ = __repr__

    @property
    def timeout_s(self) -> float:
        """Seconds of server silence after which a request is given up (and retried by the engine)."""
        return self._watch.timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        self._watch.timeout_s = value

    def use_model(self, name: str) -> None:
        """Send requests from now on with `"model": name` (e.g. a LoRA adapter just loaded by
        `weight_sync`). Requests already sent are unaffected; the next turn of a running
        rollout uses the new name."""
        self.model = name

    def request_body(
        self, messages: Messages, sampling: SamplingParams, tools: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        """The JSON body for one chat request (public so callers and tests can inspect it)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": _with_reasoning_keys(messages),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            self.max_tokens_field: sampling.max_tokens,
            "n": sampling.n,
        }
        if sampling.top_k != -1:
            body["top_k"] = sampling.top_k
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if tools:
            body["tools"] = tools
        if self.return_tokens:
            body["logprobs"] = True
            body["return_tokens_as_token_ids"] = True
            body["return_token_ids"] = True
        # Like vLLM's extra_body: whatever the user put in `extra` wins.
        body.update(sampling.extra)
        return body

    async def chat(
        self,
        messages: Messages,
        *,
        sampling: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[Completion]:
        data = orjson.dumps(self.request_body(messages, sampling, tools))
        status, payload = await self._answer(data)
        if status >= 400:
            raise error_for_status(status, payload, self._url)
        try:
            answer = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:  # a login page, a proxy's error page, a cut-off body
            start = bytes(payload[:120]).decode("utf-8", "replace")
            raise InferenceError(
                f"the answer from {self._url} is not JSON (HTTP {status}): {start!r}",
                transient=False,
                status=status,
            ) from exc
        try:
            return parse_chat_response(answer, reasoning_parser=self.reasoning_parser)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise InferenceError(
                f"malformed response from {self._url}: {type(exc).__name__}: {exc}",
                transient=False,
                status=status,
            ) from exc

    async def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """log p(ids[t] | ids[:t]) for every t (0.0 for the first) from the server's
        `/v1/completions` with `echo` (vLLM's prompt scoring; at temperature 1): a distillation
        teacher's scores. One try: the caller retries or gives up."""
        url = f"{self.base_url}/completions"
        data = orjson.dumps(
            {
                "model": self.model,
                "prompt": ids,
                "max_tokens": 1,
                "echo": True,
                "logprobs": 0,
                "temperature": 1.0,
            }
        )
        status, payload = await self._answer(data, url)
        if status >= 400:
            raise error_for_status(status, payload, url)
        try:
            values = orjson.loads(payload)["choices"][0]["logprobs"]["token_logprobs"][: len(ids)]
            if len(values) != len(ids):
                raise ValueError(f"{len(values)} logprobs for {len(ids)} prompt tokens")
            return [0.0 if v is None else float(v) for v in values]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise InferenceError(
                f"malformed response from {url}: {type(exc).__name__}: {exc}", transient=False, status=status
            ) from exc

    async def post(self, path: str, data: bytes) -> tuple[int, bytes]:
        """POST `data` to another route of this server (`path` from the server root, e.g.
        `/inference/v1/generate`), watched for silence as chat requests are: (status, body).
        Raises `InferenceError` for transport failures; the caller reads the status."""
        return await self._answer(data, self.server_root + path)

    @property
    def server_root(self) -> str:
        """The server's URL without the `/v1` of its OpenAI routes."""
        return self.base_url.removesuffix("/v1")

    async def _post(self, data: bytes, url: str | None = None) -> tuple[int, bytes]:
        try:
            status, payload = await self._http.request("POST", URL(url) if url else self._chat_url, data)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise error_for_exception(exc, url or self._url) from exc
        self._watch.answered()  # any reply, even an error, shows the server is alive
        return status, payload

    async def _answer(self, data: bytes, url: str | None = None) -> tuple[int, bytes]:
        """POST `data`: the (status, body). Given up only once the server has answered nothing at
        all for `timeout_s` since the request was sent (see the module doc).

        The request runs in the caller's own task, watched by the client's `SilenceWatch` (one
        timer for all requests); on silence it cancels the request, which closes its connection.
        (A task per request plus `asyncio.wait` did the same at several percent of the engine's
        CPU against a fast server, and so did a timer per request.)"""
        task = asyncio.current_task()
        assert task is not None
        watch = self._watch
        watch.watch(task)
        try:
            return await self._post(data, url)
        except asyncio.CancelledError:
            if watch.done(task) and task.uncancel() == 0:  # our own cancel, and no one else's
                raise InferenceError(
                    f"no response from {url or self._url} for {self.timeout_s:g} s", transient=True
                ) from None
            raise
        finally:
            watch.done(task)

    async def ping(self, timeout_s: float = 10.0) -> None:
        """Check the server answers at all (GET /models) before a run starts.

        Raises InferenceError for a connection failure, a timeout or an auth error; a server
        without /models (404) counts as reachable.
        """
        url = f"{self.base_url}/models"
        try:
            async with asyncio.timeout(timeout_s):
                status, payload = await self._http.request("GET", URL(url))
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise error_for_exception(exc, url) from exc
        if status >= 400 and status != 404:
            raise error_for_status(status, payload, url)

    @property
    def connected(self) -> bool:
        """Whether any connection to the server is held open (none after `close()` with nothing in flight)."""
        return self._http.is_open()

    async def close(self) -> None:
        await self._http.close()


def _token_ids_from_logprobs(content: list[dict[str, Any]]) -> list[int] | None:
    """Ids from vLLM's `return_tokens_as_token_ids` token strings (`"token_id:42"`)."""
    ids = []
    for entry in content:
        token = entry.get("token", "")
        if not token.startswith(_TOKEN_ID_PREFIX):
            return None
        ids.append(int(token[len(_TOKEN_ID_PREFIX) :]))
    return ids


def _with_reasoning_keys(messages: Messages) -> Messages:
    """`messages` with each earlier turn's thinking under both keys servers read: vLLM hands
    `reasoning` to the chat template (as `reasoning_content` too) and drops `reasoning_content`
    on current main; older releases and other servers read `reasoning_content`. Copies only
    the messages that change."""
    out: Messages | None = None
    for i, message in enumerate(messages):
        thinking = message.get("reasoning_content") if isinstance(message, dict) else None
        if isinstance(thinking, str) and "reasoning" not in message:
            out = out if out is not None else list(messages)
            out[i] = {**message, "reasoning": thinking}
    return out if out is not None else messages


def _message(raw: dict[str, Any], reasoning_parser: str | None = None) -> dict[str, Any]:
    """The assistant message in our form: content always a string, tool_calls only when present,
    `reasoning_content` when the server (or `reasoning_parser`, here) split off thinking."""
    content = raw.get("content") or ""
    server_split = [raw[k] for k in ("reasoning_content", "reasoning") if isinstance(raw.get(k), str)]
    reasoning: str | None = None
    if server_split:
        # Newlines around the block, as `split_reasoning` drops them: every path gives one message.
        reasoning, content = max(server_split, key=len).strip("\n") or None, content.lstrip("\n")
    elif reasoning_parser is not None and isinstance(content, str):
        reasoning, content = split_reasoning(content, reasoning_parser)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if raw.get("tool_calls"):
        message["tool_calls"] = raw["tool_calls"]
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def parse_chat_response(data: dict[str, Any], *, reasoning_parser: str | None = None) -> list[Completion]:
    """Completions from a chat completion response body.

    Usage is per request; each completion gets the full prompt count (each choice did see
    the whole prompt) and its own completion count: exact from token ids when present,
    otherwise the total split evenly.
    """
    if not data.get("choices"):
        raise ValueError("the answer has no choices")
    raw_choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
    usage = data.get("usage") or {}
    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    total_completion = int(usage.get("completion_tokens") or 0)
    prompt_ids = data.get("prompt_token_ids")
    n = len(raw_choices)

    completions = []
    for i, choice in enumerate(raw_choices):
        content = (choice.get("logprobs") or {}).get("content") or []
        completion_ids = choice.get("token_ids")
        if completion_ids is None and content:
            completion_ids = _token_ids_from_logprobs(content)
        tokens = None
        if prompt_ids is not None and completion_ids is not None:
            logprobs = [float(entry["logprob"]) for entry in content]
            if len(logprobs) != len(completion_ids):
                # Misaligned logprobs would corrupt importance ratios; better none than wrong.
                logprobs = []
            tokens = TokenData(list(prompt_ids), list(completion_ids), logprobs)
        if completion_ids is not None:
            completion_tokens = len(completion_ids)
        else:
            completion_tokens = total_completion // n + (1 if i < total_completion % n else 0)
        completions.append(
            Completion(
                message=_message(choice["message"], reasoning_parser),
                finish_reason=choice.get("finish_reason") or "stop",
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                tokens=tokens,
            )
        )
    return completions


class RoundRobinClient:
    """Spreads calls over replicas of one model, in turn.

    A replica that just failed transiently is skipped for `cooldown_s` (unless every replica
    is cooling down), so the engine's retry lands on a healthy one.
    """

    def __init__(self, clients: list[Client], *, cooldown_s: float = 5.0) -> None:
        if not clients:
            raise ValueError("RoundRobinClient needs at least one client")
        self.clients = list(clients)
        self.model = clients[0].model
        self.cooldown_s = cooldown_s
        # Tries per request (see OpenAIClient.tries): the most any replica asks for, since a retry
        # may land on another replica.
        self.tries = max(getattr(client, "tries", DEFAULT_TRIES) for client in clients)
        self.timeout_s = max(getattr(client, "timeout_s", DEFAULT_TIMEOUT_S) for client in clients)
        self._next = 0
        self._down_until = [0.0] * len(self.clients)
        # Continue multi-turn rollouts by token ids: only when every replica can (a rollout's
        # turns may land on different replicas). `tokens_http.probe_tokens_in` sets it.
        self.tokens_in = all(getattr(client, "tokens_in", False) is True for client in clients)

    def __repr__(self) -> str:
        return f"RoundRobinClient({self.clients!r})"

    def drop(self, client: Client) -> None:
        """Stop sending requests to `client` (a server that missed a weight update would serve
        a stale policy). The last replica cannot be dropped."""
        if len(self.clients) == 1:
            raise ValueError("cannot drop the last replica")
        index = self.clients.index(client)
        del self.clients[index]
        del self._down_until[index]
        self._next %= len(self.clients)

    def use_model(self, name: str) -> None:
        """Point every replica at the served model `name` (see `OpenAIClient.use_model`)."""
        for client in self.clients:
            client.use_model(name)  # type: ignore[attr-defined]
        self.model = name

    def _pick(self) -> int:
        now = time.monotonic()
        count = len(self.clients)
        for offset in range(count):
            index = (self._next + offset) % count
            if self._down_until[index] <= now:
                self._next = index + 1
                return index
        index = self._next % count
        self._next = index + 1
        return index

    async def chat(
        self,
        messages: Messages,
        *,
        sampling: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[Completion]:
        index = self._pick()
        try:
            return await self.clients[index].chat(messages, sampling=sampling, tools=tools)
        except InferenceError as exc:
            if exc.transient:
                self._down_until[index] = time.monotonic() + self.cooldown_s
            raise

    async def continue_chat(
        self,
        previous: TokenData,
        new_messages: Messages,
        *,
        sampling: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[Completion]:
        """The next turn by token ids (`TokensInClient`), on the next replica in turn: the ids
        carry the whole conversation, so any replica continues it exactly."""
        index = self._pick()
        client = self.clients[index]
        if not isinstance(client, TokensInClient):
            raise InferenceError(f"{client!r} cannot continue a conversation by token ids", transient=False)
        try:
            return await client.continue_chat(previous, new_messages, sampling=sampling, tools=tools)
        except InferenceError as exc:
            if exc.transient:
                self._down_until[index] = time.monotonic() + self.cooldown_s
            raise

    async def close(self) -> None:
        await asyncio.gather(*(client.close() for client in self.clients))
