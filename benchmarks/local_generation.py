"""Benchmark: LocalClient dynamic batching vs. one `model.generate` call per request.

    python benchmarks/local_generation.py [--model outputs/models/tiny] [--requests 64]

Sends `--requests` concurrent chat requests (reverse-text prompts, temperature 1,
`--max-tokens` each) through `LocalClient`, then runs the same prompts one at a time through
`model.generate` with the same settings, and prints completion tokens/s of both and the
speedup. Without a built model at `--model`, a quick one is built in a temp folder.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from workbench.inference.local_client import LocalClient
from workbench.models.synthetic import reverse_text_demonstrations
from workbench.models.tiny import TinyModelSpec, build_tiny_model
from workbench.types import Messages, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="outputs/models/tiny", help="model folder or hub id")
    parser.add_argument("--requests", type=int, default=64, help="concurrent requests")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3, help="batched runs; the median is reported")
    parser.add_argument("--baseline-requests", type=int, default=None, help="requests in the generate loop (default: all)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_path: Path | str = args.model  # a folder, or a hub id when no such folder exists
        if not Path(args.model).exists() and args.model == parser.get_default("model"):
            model_path = _quick_model(Path(tmp))
        prompts = [demo[:2] for demo in reverse_text_demonstrations(args.requests, seed=1234)]
        sampling = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
        batched = asyncio.run(_run_client(str(model_path), prompts, sampling, args.repeats))
        baseline_prompts = prompts[: args.baseline_requests or len(prompts)]
        baseline = _run_generate_loop(str(model_path), baseline_prompts, sampling)

    print(f"model: {model_path}  requests: {args.requests}  max_tokens: {args.max_tokens}  temperature: {args.temperature}")
    print(f"LocalClient (batched): {batched:8.1f} completion tokens/s")
    print(f"model.generate loop:   {baseline:8.1f} completion tokens/s")
    print(f"speedup: {batched / baseline:.1f}x")


def _quick_model(tmp: Path) -> Path:
    print("no model found; building a quick tiny model in a temp folder ...", flush=True)
    spec = TinyModelSpec(steps=60)  # format only: throughput does not depend on quality
    return build_tiny_model(tmp / "tiny", reverse_text_demonstrations(500), spec)


async def _run_client(model: str, prompts: list[Messages], sampling: SamplingParams, repeats: int) -> float:
    client = LocalClient(model, max_batch_size=len(prompts))
    try:
        await client.chat(prompts[0], sampling=sampling)  # warm-up: first-call kernel setup
        rates = []
        for _ in range(repeats):
            start = time.perf_counter()
            results = await asyncio.gather(*[client.chat(p, sampling=sampling) for p in prompts])
            elapsed = time.perf_counter() - start
            tokens = sum(c.completion_tokens for r in results for c in r)
            rates.append(tokens / elapsed)
            print(f"  batched run: {tokens} tokens in {elapsed:.2f}s ({client.stats.batches} batches so far)", flush=True)
        return statistics.median(rates)
    finally:
        await client.close()


def _run_generate_loop(model_path: str, prompts: list[Messages], sampling: SamplingParams) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    encoded = []
    for messages in prompts:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        encoded.append(torch.tensor([tokenizer.encode(text, add_special_tokens=False)]))
    settings = dict(
        max_new_tokens=sampling.max_tokens,
        do_sample=sampling.temperature > 0,
        temperature=sampling.temperature or None,
        top_p=1.0,
        top_k=0,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.inference_mode():
        model.generate(encoded[0], **settings)  # warm-up, as for the client
        start = time.perf_counter()
        tokens = 0
        for input_ids in encoded:
            output = model.generate(input_ids, **settings)
            tokens += output.shape[1] - input_ids.shape[1]
        elapsed = time.perf_counter() - start
    print(f"  generate loop: {tokens} tokens in {elapsed:.2f}s", flush=True)
    return tokens / elapsed


if __name__ == "__main__":
    main()
