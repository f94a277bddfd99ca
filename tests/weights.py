"""Test helpers for weight updates: LoRA adapters and perturbed full-weight copies of a model,
reference forward passes with plain transformers + peft, and `workbench serve` processes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from tests.servers import ServerProcess, start_processes

MESSAGES = [{"role": "user", "content": "hello world"}]


def make_adapter(
    base: Path,
    out: Path,
    *,
    seed: int,
    r: int = 4,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    scale: float = 0.2,
) -> Path:
    """A LoRA adapter for `base` with random non-zero weights (a fresh one is a no-op: B = 0)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base),
        LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(targets)),
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    model.save_pretrained(out)
    return out


def make_perturbed_model(base: Path, out: Path, *, seed: int, scale: float = 0.05) -> Path:
    """A full copy of `base` with noise on every weight (a stand-in for a fine-tuned checkpoint)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def reference_model(base: Path, adapter: Path | None = None) -> Any:
    """`base` (plus `adapter`) loaded the ordinary way, for reference forward passes."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    return model.eval()


def teacher_forced(
    model: Any, prompt_ids: list[int], completion_ids: list[int]
) -> tuple[list[int], list[float]]:
    """(greedy token, logprob of the given token) at each completion position."""
    import torch

    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    positions = range(len(prompt_ids) - 1, len(prompt_ids) + len(completion_ids) - 1)
    greedy = [int(logprobs[p].argmax()) for p in positions]
    given = [float(logprobs[p, t]) for p, t in zip(positions, completion_ids)]
    return greedy, given


async def chat(
    url: str, model: str, *, max_tokens: int = 16, messages: list[dict[str, str]] | None = None
) -> tuple[int, dict[str, Any]]:
    """A greedy chat request asking for token ids and logprobs (as RL does)."""
    body = {
        "model": model,
        "messages": messages or MESSAGES,
        "temperature": 0,
        "max_tokens": max_tokens,
        "logprobs": True,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            return response.status, await response.json()


async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST JSON; the reply as JSON when it is JSON, else as text (vLLM's success bodies)."""
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}{path}", json=body) as response:
            if response.content_type == "application/json":
                return response.status, await response.json()
            return response.status, await response.text()


def completion(body: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, completion ids, logprobs) of a chat response's first choice."""
    choice = body["choices"][0]
    return (
        body["prompt_token_ids"],
        choice["token_ids"],
        [e["logprob"] for e in choice["logprobs"]["content"]],
    )


@contextlib.contextmanager
def workbench_servers(model: Path, count: int, *extra: str) -> Iterator[list[ServerProcess]]:
    """`count` real `workbench serve MODEL --served-model-name tiny` processes on free ports,
    started concurrently (each one imports torch: seconds on a busy machine)."""
    servers = start_processes(
        ["-m", "workbench", "serve", str(model), "--served-model-name", "tiny", "--port", "0", *extra], count
    )
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()
