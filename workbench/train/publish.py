"""Server mode: the trainer's side of in-flight weight updates.

After each optimizer step the new weights are written under `<run>/weights/step_N` (the LoRA
adapter, a few MB; or the whole model with full fine-tuning) and every inference server is
told to load them (`/v1/load_lora_adapter`, as vLLM does with runtime LoRA updating, or a
full reload). New requests then name the new adapter; requests already running finish on
the weights they started with. The servers need to read the run folder: one machine, or a
shared filesystem across nodes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.inference.openai_client import OpenAIClient, RoundRobinClient

KEEP_PUBLISHED = 2  # the newest weights, and the previous ones requests may still be running on


def served_model_name(config: Any) -> str:
    return config.inference.model or config.model


def server_client(config: Any) -> RoundRobinClient:
    """One client per server (base URLs, or endpoint ids from configs/endpoints.toml), asked
    for token ids and sampled logprobs so training needs no re-tokenization."""
    from workbench.inference.endpoints import load_endpoints
    from workbench.workspace import endpoints_path

    name = served_model_name(config)
    api_key = None
    if config.inference.api_key_var:
        api_key = os.environ.get(config.inference.api_key_var)
        if not api_key:
            raise UserError(f"environment variable {config.inference.api_key_var} (inference.api_key_var) is not set")
    clients: list[OpenAIClient] = []
    registry: dict[str, Any] | None = None
    for ref in config.inference.base_urls:
        if ref.startswith(("http://", "https://")):
            clients.append(OpenAIClient(ref, name, api_key=api_key, return_tokens=True))
            continue
        registry = load_endpoints(endpoints_path()) if registry is None else registry
        if ref not in registry:
            raise UserError(f"inference.base_urls: '{ref}' is neither a URL nor an endpoint id in {endpoints_path()}")
        for endpoint in registry[ref]:
            key = os.environ.get(endpoint.key) if endpoint.key else None
            clients.append(OpenAIClient(endpoint.url, endpoint.model, api_key=key, return_tokens=True))
    if not clients:
        raise UserError("inference.mode = 'server' needs inference.base_urls")
    return RoundRobinClient(clients)


class WeightPublisher:
    """Writes the policy's weights after a step and makes every server use them."""

    def __init__(self, policy: Any, run_dir: Path, config: Any, client: RoundRobinClient) -> None:
        self.policy = policy
        self.folder = run_dir / "weights"
        self.lora = config.lora.enabled
        self.base_name = served_model_name(config)
        self.client = client
        self.published: list[tuple[int, str]] = []  # (step, served name), oldest first

    async def start(self, step: int, checkpoint: Path | None) -> None:
        """Servers start on the base model (= policy version 0: a fresh LoRA adapter is a no-op).
        A resumed run first makes them serve its checkpoint's weights."""
        if step > 0:
            await self.publish(step)

    async def publish(self, step: int) -> float:
        """Save, load on every server, switch new requests; returns seconds taken."""
        from workbench.inference.weight_sync import sync_weights

        started = time.perf_counter()
        target = self.folder / f"step_{step:06d}"
        await asyncio.to_thread(self._save, target)
        name = f"{self.base_name}-step-{step}" if self.lora else self.base_name
        urls = [c.base_url for c in self.client.clients]
        keys = [c.api_key for c in self.client.clients]
        await sync_weights(urls, target, name=name, lora=self.lora, api_keys=keys)
        for client in self.client.clients:
            client.model = name
        self.published.append((step, name))
        await self._prune(urls, keys)
        return time.perf_counter() - started

    def _save(self, target: Path) -> None:
        tmp = target.with_name(f".tmp_{target.name}")
        shutil.rmtree(tmp, ignore_errors=True)
        self.policy.model.save_pretrained(tmp)
        if not self.lora:
            self.policy.tokenizer.save_pretrained(tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)

    async def _prune(self, urls: list[str], keys: list[str | None]) -> None:
        from workbench.inference.weight_sync import unload_adapter

        while len(self.published) > KEEP_PUBLISHED:
            step, name = self.published.pop(0)
            if self.lora:
                await unload_adapter(urls, name, api_keys=keys)
            shutil.rmtree(self.folder / f"step_{step:06d}", ignore_errors=True)
