"""Weight-update routes of `workbench serve`, shaped like the servers a trainer talks to on a GPU.

vLLM's runtime LoRA API (vLLM needs `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`;
here `--enable-lora` is enough):

- `POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"?: false}` → 200 with
  the plain-text body `Success: LoRA adapter 'NAME' added successfully.` Errors are JSON
  `{"error": {"message", "type", "param", "code": STATUS}}`: 400 when LoRA is not enabled, a
  field is missing, the name is already loaded without `load_inplace` (or names the base
  model), or the adapter does not fit (bad config, rank above `--max-lora-rank`, another
  base model's shapes); 404 when there is no adapter at `lora_path`.
- `POST /v1/unload_lora_adapter {"lora_name"}` → 200 `Success: LoRA adapter 'NAME' removed
  successfully.`; 404 for a name that is not loaded.

prime-rl's full-weights reload (its vLLM server adds this route through a worker extension):

- `POST /update_weights {"weight_dir": FOLDER}` → 200 `{"status": "ok"}`: the base weights
  are replaced in place from a `save_pretrained` folder; requests that start after the reply
  use them. 404 when the folder does not exist, 400 when it does not fit the served model.

Loaded adapters are listed by `/v1/models` with `parent` = the base model, and a chat
request with `"model": NAME` generates with that adapter. A failed change leaves the served
weights and earlier adapters as they were. Loading runs in a thread, so requests for other
models keep being answered by the event loop while weights are read from disk.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import orjson
from aiohttp import web

from workbench.errors import InferenceError
from workbench.inference.server import error_response

if TYPE_CHECKING:
    from workbench.inference.server import Handler, OpenAIServer

logger = logging.getLogger(__name__)

LORA_NOT_ENABLED = "LoRA is not enabled. Use --enable-lora to enable LoRA."  # vLLM's message


@runtime_checkable
class WeightBackend(Protocol):
    """A backend whose weights can change while it serves (`LocalClient`)."""

    def load_adapter(self, name: str, path: str | Path, *, max_rank: int | None = None) -> None: ...

    def unload_adapter(self, name: str) -> None: ...

    def update_weights(self, weight_dir: str | Path) -> int: ...


def _error(status: int, message: str, type_: str) -> web.Response:
    return error_response(status, message, type_=type_, code=status)


def _failure(exc: InferenceError) -> tuple[int, str, str]:
    """(status, message, vLLM error type) for a failed weight change."""
    if exc.status == 404:
        return 404, str(exc), "NotFoundError"
    return 400, str(exc), "BadRequestError"


async def _json_object(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return _error(400, f"request body is not valid JSON: {exc}", "BadRequestError")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object", "BadRequestError")
    return body


class WeightRoutes:
    """The handlers above, over one `OpenAIServer` (whose `lora_paths` they keep current)."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server = server
        backend = server.client
        self.backend: WeightBackend | None = backend if isinstance(backend, WeightBackend) else None

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {
            ("POST", "/v1/load_lora_adapter"): self.load_lora_adapter,
            ("POST", "/v1/unload_lora_adapter"): self.unload_lora_adapter,
            ("POST", "/update_weights"): self.update_weights,
        }

    async def load(self, name: str, path: str, *, load_inplace: bool) -> tuple[int, str, str]:
        """Load adapter `path` as `name`: (HTTP status, message, error type) as vLLM answers."""
        server = self.server
        if not server.enable_lora:
            return 400, LORA_NOT_ENABLED, "BadRequestError"
        if self.backend is None:
            return (
                400,
                f"this server's backend ({type(server.client).__name__}) cannot load LoRA adapters",
                "BadRequestError",
            )
        if name in server.model_names:
            return 400, f"'{name}' is the base model's name; choose another lora_name", "InvalidUserInput"
        async with server.weights_admin_lock:
            if name in server.lora_paths and not load_inplace:
                return (
                    400,
                    (
                        f"The lora adapter '{name}' has already been loaded. If you want to load the "
                        "adapter in place, set 'load_inplace' to True."
                    ),
                    "InvalidUserInput",
                )
            try:
                await asyncio.to_thread(self.backend.load_adapter, name, path, max_rank=server.max_lora_rank)
            except InferenceError as exc:
                return _failure(exc)
            except Exception as exc:  # a backend bug: the client sees 500, the server lives on
                logger.exception("loading LoRA adapter %s from %s failed", name, path)
                return 500, f"Loading lora {name} failed: {type(exc).__name__}: {exc}", "InternalServerError"
            server.lora_paths[name] = path
        return 200, f"Success: LoRA adapter '{name}' added successfully.", ""

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        name, path, inplace = body.get("lora_name"), body.get("lora_path"), body.get("load_inplace", False)
        if not (isinstance(name, str) and name and isinstance(path, str) and path):
            return _error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if not isinstance(inplace, bool):
            return _error(400, "'load_inplace' must be true or false", "InvalidUserInput")
        status, message, kind = await self.load(name, path, load_inplace=inplace)
        if status != 200:
            return _error(status, message, kind)
        return web.Response(text=message, status=200)

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        server = self.server
        name = body.get("lora_name")
        if not server.enable_lora:
            return _error(400, LORA_NOT_ENABLED, "BadRequestError")
        if not isinstance(name, str) or not name:
            return _error(
                400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput"
            )
        async with server.weights_admin_lock:
            if name not in server.lora_paths or self.backend is None:
                return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            try:
                await asyncio.to_thread(self.backend.unload_adapter, name)
            except InferenceError as exc:
                return _error(*_failure(exc))
            del server.lora_paths[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.", status=200)

    async def update_weights(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        weight_dir = body.get("weight_dir")
        if not isinstance(weight_dir, str) or not weight_dir:
            return _error(400, "'weight_dir' (a model folder) must be provided.", "InvalidUserInput")
        if self.backend is None:
            return _error(
                400,
                f"this server's backend ({type(self.server.client).__name__}) cannot reload weights",
                "BadRequestError",
            )
        async with self.server.weights_admin_lock:
            try:
                await asyncio.to_thread(self.backend.update_weights, weight_dir)
            except InferenceError as exc:
                return _error(*_failure(exc))
            except Exception as exc:  # e.g. a corrupt safetensors file: 500, the server lives on
                logger.exception("reloading weights from %s failed", weight_dir)
                return _error(
                    500,
                    f"reloading weights from {weight_dir} failed: {type(exc).__name__}: {exc}",
                    "InternalServerError",
                )
        return web.Response(body=orjson.dumps({"status": "ok"}), content_type="application/json")
