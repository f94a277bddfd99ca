"""Push new policy weights to every inference server after a training step.

The trainer writes a checkpoint (a LoRA adapter folder, or a full model folder) where the
servers can read it, then calls one of:

    sync = WeightSync(["http://gpu1:8000", "http://gpu2:8000"], api_key=key)
    report = await sync.switch_lora("step_12", "/runs/x/checkpoints/step_000012",
                                    client=rollout_client, previous="step_11")
    report = await sync.update_weights("/runs/x/checkpoints/step_000012")   # full fine-tuning
    metrics["time/weight_sync"] = report.seconds

LoRA uses vLLM's runtime API (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`), full
weights prime-rl's `POST /update_weights {"weight_dir"}`; `workbench serve` speaks both.
Servers are updated concurrently. Transient failures (connection refused/reset, timeouts,
408/409/429/5xx) are retried with exponential backoff and jitter; anything else fails at
once. If any server fails, `WeightSyncError` names each failed server and its reason
(servers that succeeded keep the new weights: the caller decides whether to go on).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson
from yarl import URL

from workbench.errors import InferenceError
from workbench.inference.openai_client import error_for_exception, error_for_status

_ALREADY_LOADED = "has already been loaded"
_NOT_FOUND = 404


class WeightSyncError(InferenceError):
    """Some servers did not take the new weights; `failures` maps base URL -> reason."""

    def __init__(self, action: str, failures: dict[str, str], report: SyncReport) -> None:
        detail = "; ".join(f"{url}: {reason}" for url, reason in failures.items())
        super().__init__(
            f"{action} failed on {len(failures)} of {len(report.servers) + len(failures)} "
            f"server(s): {detail}",
            transient=False,
        )
        self.failures = failures
        self.report = report


@dataclass
class ServerSync:
    """How one server took an update."""

    base_url: str
    seconds: float  # from the first request to the last reply, retries included
    attempts: int


@dataclass
class SyncReport:
    """One update across all servers. `seconds` is the wall time of the whole update
    (what the trainer logs as `time/weight_sync`); `servers` the successful ones."""

    action: str
    seconds: float = 0.0
    servers: list[ServerSync] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        slowest = max((s.seconds for s in self.servers), default=0.0)
        return {"time/weight_sync": self.seconds, "time/weight_sync_slowest_server": slowest}


class ModelSwitchable(Protocol):
    """A client whose requests can be pointed at another served model name."""

    def use_model(self, name: str) -> None: ...


def server_root(base_url: str) -> str:
    """`http://host:8000/v1` and `http://host:8000/` both mean the server `http://host:8000`."""
    url = base_url.rstrip("/")
    if URL(url).path.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


class WeightSync:
    """Sends weight updates to a fixed set of OpenAI-compatible servers (see module docstring)."""

    def __init__(
        self,
        base_urls: list[str],
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        retries: int = 3,
        backoff_s: float = 1.0,
    ) -> None:
        if not base_urls:
            raise ValueError("WeightSync needs at least one server URL")
        self.roots = [server_root(u) for u in base_urls]
        self.timeout_s = timeout_s  # per request: a large full-weights load can take minutes
        self.retries = retries  # extra attempts after the first, for transient failures only
        self.backoff_s = backoff_s
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    def __repr__(self) -> str:  # never the key
        return f"WeightSync({self.roots!r})"

    async def load_lora(self, name: str, path: str, *, load_inplace: bool = False) -> SyncReport:
        """Load adapter folder `path` as `name` on every server. With `load_inplace` an
        existing adapter of that name is replaced (vLLM's semantics)."""
        body = {"lora_name": name, "lora_path": str(path), "load_inplace": load_inplace}
        return await self._everywhere(f"loading LoRA '{name}'", "/v1/load_lora_adapter", body, lora_load=True)

    async def unload_lora(self, name: str, *, missing_ok: bool = True) -> SyncReport:
        """Unload adapter `name` everywhere; a server that does not have it counts as done
        unless `missing_ok` is False (a restarted server has forgotten its adapters)."""
        return await self._everywhere(
            f"unloading LoRA '{name}'",
            "/v1/unload_lora_adapter",
            {"lora_name": name},
            ok_statuses=(_NOT_FOUND,) if missing_ok else (),
        )

    async def switch_lora(
        self,
        name: str,
        path: str,
        *,
        client: ModelSwitchable | None = None,
        previous: str | None = None,
        load_inplace: bool = False,
    ) -> SyncReport:
        """Load `path` as `name` everywhere, point `client` at it, then unload `previous`.
        In that order, a rollout never names an adapter that is already gone."""
        report = await self.load_lora(name, path, load_inplace=load_inplace)
        if client is not None:
            client.use_model(name)
        if previous is not None and previous != name:
            unload = await self.unload_lora(previous)
            report.seconds += unload.seconds
        return report

    async def update_weights(self, weight_dir: str) -> SyncReport:
        """Replace the served base weights with the model folder `weight_dir` everywhere."""
        return await self._everywhere(
            f"reloading weights from {weight_dir}", "/update_weights", {"weight_dir": str(weight_dir)}
        )

    async def _everywhere(
        self,
        action: str,
        path: str,
        body: dict[str, Any],
        *,
        lora_load: bool = False,
        ok_statuses: tuple[int, ...] = (),
    ) -> SyncReport:
        start = time.perf_counter()
        data = orjson.dumps(body)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=min(self.timeout_s, 30.0))
        async with aiohttp.ClientSession(headers=self._headers, timeout=timeout) as session:
            outcomes = await asyncio.gather(
                *(self._one(session, root, path, data, lora_load, ok_statuses) for root in self.roots),
                return_exceptions=True,
            )
        report = SyncReport(action, seconds=time.perf_counter() - start)
        failures: dict[str, str] = {}
        for root, outcome in zip(self.roots, outcomes):
            if isinstance(outcome, ServerSync):
                report.servers.append(outcome)
            elif isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome  # CancelledError, KeyboardInterrupt: not a server's failure
                failures[root] = str(outcome)
        if failures:
            raise WeightSyncError(action, failures, report)
        return report

    async def _one(
        self,
        session: aiohttp.ClientSession,
        root: str,
        path: str,
        data: bytes,
        lora_load: bool,
        ok_statuses: tuple[int, ...],
    ) -> ServerSync:
        url = f"{root}{path}"
        start = time.perf_counter()
        attempt = 0
        while True:
            attempt += 1
            try:
                async with session.post(url, data=data) as response:
                    payload = await response.read()
                    status = response.status
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                error = error_for_exception(exc, url)
            else:
                if status < 300 or status in ok_statuses:
                    return ServerSync(root, time.perf_counter() - start, attempt)
                error = error_for_status(status, payload, url)
                # A retried load whose first try did land (the reply was lost) finds the name taken.
                if lora_load and attempt > 1 and status == 400 and _ALREADY_LOADED in str(error):
                    return ServerSync(root, time.perf_counter() - start, attempt)
            if not error.transient or attempt > self.retries:
                raise InferenceError(
                    f"{error} (after {attempt} attempt{'s' if attempt > 1 else ''})",
                    transient=error.transient,
                    status=error.status,
                )
            delay = self.backoff_s * 2 ** (attempt - 1)
            await asyncio.sleep(delay * (0.5 + random.random()))  # jitter: replicas don't retry in lockstep
