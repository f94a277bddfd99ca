"""Weight publishing, the last stage of an RL step: the new weights reach whoever generates.

Colocated, the trainer's own model generates: publishing only moves the policy clock, which
lets the next step's rollouts start (`publish_weights`).

Server mode: the trainer's side of in-flight weight updates.

After each optimizer step the new weights are written under `<run>/weights/step_N` (the LoRA
adapter, a few MB; or the whole model with full fine-tuning) and every inference server is
told to load them (`/v1/load_lora_adapter`, as vLLM does with runtime LoRA updating, or a
full reload). New requests then name the new adapter; requests already running finish on
the weights they started with. The servers need to read the run folder: one machine, or a
shared filesystem across nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.inference.client import Client
from workbench.inference.openai_client import OpenAIClient, RoundRobinClient
from workbench.inference.tokens_http import TokensInServer, probe_tokens_in
from workbench.inference.weight_sync import WeightSync, WeightSyncError
from workbench.train.rollout_source import PolicyClock
from workbench.train.schema import TrainConfig

KEEP_PUBLISHED = 2  # the newest weights, and the previous ones requests may still be running on
# Seconds a training server may stay silent before its requests are retried. Longer than an eval's
# 60: a step's rollouts start together and, with long max_tokens, all may end minutes later.
TRAIN_REQUEST_TIMEOUT_S = 600.0


async def publish_weights(publisher: WeightPublisher | None, clock: PolicyClock, step: int) -> float:
    """After step `step`'s optimizer step: the weights it made are the ones rollouts use from now on.
    Returns the seconds the trainer waited for that (0 colocated)."""
    if publisher is None:
        await clock.advance(step)
        return 0.0
    return await publisher.publish(step)  # the servers get the new weights while the next step trains


def served_model_name(config: TrainConfig) -> str:
    return config.inference.model or config.model


def server_client(
    config: TrainConfig, extra_urls: Sequence[str] = (), tokenizer: Any = None
) -> RoundRobinClient:
    """One client per server (base URLs, or endpoint ids from configs/endpoints.toml), asked
    for token ids and sampled logprobs so training needs no re-tokenization.

    With the "interleaved" trajectory strategy and the policy's `tokenizer`, each server is
    reached through its tokens-in route (`tokens_http.TokensInServer`; the run's start probes
    it and falls back to the chat API with one warning where a server lacks it)."""
    from workbench.inference.endpoints import client_for_endpoint, load_endpoints
    from workbench.workspace import endpoints_path

    name = served_model_name(config)
    parser = config.inference.reasoning_parser  # split <think> a server left inline in the content
    api_key = None
    if config.inference.api_key_var:
        api_key = os.environ.get(config.inference.api_key_var)
        if not api_key:
            raise UserError(
                f"environment variable {config.inference.api_key_var} (inference.api_key_var) is not set"
            )
    clients: list[Client] = []
    registry: dict[str, Any] | None = None
    for ref in [*config.inference.base_urls, *extra_urls]:
        if ref.startswith(("http://", "https://")):
            clients.append(
                OpenAIClient(
                    ref,
                    name,
                    api_key=api_key,
                    return_tokens=True,
                    timeout_s=TRAIN_REQUEST_TIMEOUT_S,
                    reasoning_parser=parser,
                )
            )
            continue
        registry = load_endpoints(endpoints_path()) if registry is None else registry
        if ref not in registry:
            raise UserError(
                f"inference.base_urls: '{ref}' is neither a URL nor an endpoint id in {endpoints_path()}"
            )
        # Its replicas, with their keys (and their own timeout, if the registry gives one).
        client = client_for_endpoint(
            registry[ref],
            return_tokens=True,
            default_timeout_s=TRAIN_REQUEST_TIMEOUT_S,
            reasoning_parser=parser,
        )
        clients.extend(client.clients if isinstance(client, RoundRobinClient) else [client])
    if not clients:
        raise UserError("inference.mode = 'server' needs inference.base_urls")
    if tokenizer is not None and config.trajectory_strategy == "interleaved":
        clients = [
            TokensInServer(client, tokenizer, reasoning_parser=client.reasoning_parser)
            if isinstance(client, OpenAIClient)
            else client
            for client in clients
        ]
    return RoundRobinClient(clients)


def http_server(member: Client) -> OpenAIClient | None:
    """The HTTP client behind a pool member (`server_client`'s kinds)."""
    if isinstance(member, TokensInServer):
        return member.server
    return member if isinstance(member, OpenAIClient) else None


class WeightPublisher:
    """Writes the policy's weights after a step and makes every server use them.

    A server that fails the update (after `WeightSync`'s retries of transient errors) is taken
    out of the request pool, so no rollout comes from a stale policy; the run goes on with the
    others. When every server fails, `WeightSyncError` stops the step: the previous checkpoint
    is intact and `--resume` re-publishes its weights first.
    """

    def __init__(
        self,
        policy: Any,
        run_dir: Path,
        config: TrainConfig,
        client: RoundRobinClient,
        clock: PolicyClock,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.policy = policy
        self.folder = run_dir.resolve() / "weights"  # servers get absolute paths
        self.lora = config.lora.enabled
        self.base_name = served_model_name(config)
        self.run_name = run_dir.name  # adapter names are unique per run: servers outlive runs
        self.client = client
        self.clock = clock
        self.log = log
        self.published: list[tuple[int, str]] = []  # (step, served name), oldest first
        self.last_push_s = 0.0  # how long the newest completed push took on the servers
        self._push_task: asyncio.Task[None] | None = None

    async def start(self, step: int, say: Callable[[str], None] = lambda line: None) -> None:
        """Servers start on the base model (= policy version 0: a fresh LoRA adapter is a no-op).
        A resumed run first makes them serve its checkpoint's weights. Before that, the servers
        are asked whether they take token ids (`tokens_http`); `say` (and the run log) gets the
        one line about any that do not."""

        def warn(line: str) -> None:
            self.log(f"warning: {line}")
            say(f"warning: {line}")

        await probe_tokens_in(self.client, warn)
        if step > 0:
            await self.publish(step)
            await self.wait()

    async def publish(self, step: int) -> float:
        """Write the step's weights and start pushing them to the servers; returns the seconds
        the trainer was held up (the previous push, if still running, plus the write).

        The push runs in the background: the next step trains on a batch that is already
        being generated, and the rollout source waits on the clock, which advances when every
        server has the new weights."""
        started = time.perf_counter()
        await self.wait()
        target = self.folder / f"step_{step:06d}"
        await asyncio.to_thread(self._save, target)
        self._push_task = asyncio.create_task(self._push(step, target))
        return time.perf_counter() - started

    async def wait(self) -> None:
        """Until the newest push is done (re-raises its failure)."""
        task, self._push_task = self._push_task, None
        if task is not None:
            await task

    async def cancel(self) -> None:
        task, self._push_task = self._push_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _push(self, step: int, target: Path) -> None:
        started = time.perf_counter()
        name = f"{self.run_name}-step-{step}" if self.lora else self.base_name
        servers = self._servers()
        outcomes = await asyncio.gather(
            *(self._load(server, name, target) for server in servers), return_exceptions=True
        )
        failed = {
            server: outcome for server, outcome in zip(servers, outcomes) if isinstance(outcome, Exception)
        }
        if len(failed) == len(servers):
            error = next(iter(failed.values()))
            await self.clock.fail(error)
            raise error
        for server, error in failed.items():
            member = self._member(server)
            self.client.drop(member)
            await member.close()  # its connections: a request still on it fails over to the others
            self.log(
                f"server {server.base_url} dropped from the pool: weight update for step {step} failed ({error})"
            )
        self.client.use_model(name)
        await self.clock.advance(step)
        self.published.append((step, name))
        self.last_push_s = time.perf_counter() - started
        await self._prune()

    def _servers(self) -> list[OpenAIClient]:
        """The servers still in the pool (each an OpenAIClient, or one behind `TokensInServer`)."""
        servers = (http_server(member) for member in self.client.clients)
        return [server for server in servers if server is not None]

    def _member(self, server: OpenAIClient) -> Client:
        """The pool's member that talks to `server`."""
        return next(member for member in self.client.clients if http_server(member) is server)

    async def _load(self, server: OpenAIClient, name: str, target: Path) -> None:
        sync = WeightSync([server.base_url], api_key=server.api_key)
        if self.lora:
            await sync.load_lora(name, str(target), load_inplace=True)  # a resumed run re-publishes its step
        else:
            await sync.update_weights(str(target))

    def _save(self, target: Path) -> None:
        tmp = target.with_name(f".tmp_{target.name}")
        shutil.rmtree(tmp, ignore_errors=True)
        self.policy.save_pretrained(tmp)
        if not self.lora:
            self.policy.tokenizer.save_pretrained(tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)

    async def _prune(self) -> None:
        """Unload and delete all but the newest KEEP_PUBLISHED weights (requests that started
        on the previous adapter may still be running)."""
        while len(self.published) > KEEP_PUBLISHED:
            step, name = self.published.pop(0)
            if self.lora:
                for server in self._servers():
                    try:
                        await WeightSync([server.base_url], api_key=server.api_key).unload_lora(name)
                    except WeightSyncError as exc:  # memory on that server, not correctness
                        self.log(f"could not unload {name} from {server.base_url}: {exc}")
            shutil.rmtree(self.folder / f"step_{step:06d}", ignore_errors=True)
