"""Benchmark: LocalClient vs. `model.generate` (one padded call, and one call per request).

    python benchmarks/local_generation.py [--model outputs/models/tiny] [--requests 64]

Sends `--requests` concurrent chat requests (reverse-text prompts, temperature 1,
`--max-tokens` each) through `LocalClient`; runs the same prompts, with the same settings, as
ONE left-padded `model.generate` call, and one at a time through `model.generate` (what a user
would naively do: one `generate` per request). The three alternate, `--repeats` rounds of each
(medians reported), so machine load hits all of them alike: on a shared machine the load can
change severalfold within a minute, and a baseline measured at another moment than the client
says more about the neighbours than about either. Prints completion tokens/s of each and
LocalClient's speedup over both (the ratio of the medians, and "paired": the median of each
round's own ratio), with the load average. Completion tokens of `generate` are
counted as the client counts them: up to and including the first EOS of each row.
Without a built model at `--model`, a quick one is built in a temp folder.

`--floor` also prints the most any decoder of these rows could gain over the padded call on this
machine: every forward pass must at least run the model's linear layers (each weight read once,
each row's arithmetic), so the client's passes x the time of one pass through all the model's
`nn.Linear`s at the client's mean rows per pass (a bound that grants attention, sampling and
all dispatch for free) is the least time its tokens can take. On a small model on a CPU that
pass is bounded by memory bandwidth below ~64 rows, so the padded call's wasted rows cost it
little, and the bound says how far any cut of the client's own overhead can still go.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

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
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds of client / padded generate / generate loop; medians are reported",
    )
    parser.add_argument(
        "--baseline-requests", type=int, default=None, help="requests in the generate loop (default: all)"
    )
    parser.add_argument(
        "--continuous-batching",
        action="store_true",
        help="also time transformers' own continuous batching (model.generate_batch) on the same prompts",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own)")
    parser.add_argument(
        "--hf-decode", action="store_true", help="LocalClient on the Hugging Face forward (no lean engine)"
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also print the zero-overhead bound: the client's passes timed as linear layers alone",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="weights of both sides (bfloat16 is fast on CPUs with AMX / AVX512-BF16)",
    )
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        model_path: Path | str = args.model  # a folder, or a hub id when no such folder exists
        if not Path(args.model).exists() and args.model == parser.get_default("model"):
            model_path = _quick_model(Path(tmp))
        prompts = [demo[:2] for demo in reverse_text_demonstrations(args.requests, seed=1234)]
        sampling = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
        baseline_prompts = prompts[: args.baseline_requests or len(prompts)]
        client_rates, padded_rates, loop_rates, cb_rates, floor_rates = asyncio.run(
            _run_interleaved(
                str(model_path),
                prompts,
                baseline_prompts,
                sampling,
                args.repeats,
                hf_decode=args.hf_decode,
                dtype=args.dtype,
                continuous_batching=args.continuous_batching,
                floor=args.floor,
            )
        )
    load_after = os.getloadavg()[0]

    client, padded = statistics.median(client_rates), statistics.median(padded_rates)
    loop_rate = statistics.median(loop_rates)
    print(
        f"\nmodel: {model_path}  requests: {args.requests}  max_tokens: {args.max_tokens}  "
        f"temperature: {args.temperature}  dtype: {args.dtype}  torch threads: {torch.get_num_threads()}  "
        f"load average: {load_before:.1f} -> {load_after:.1f} ({os.cpu_count()} CPUs)"
    )
    # "paired": the median of each round's own ratio (the three paths of a round run back to back),
    # which load drifting between rounds moves less than the ratio of the medians.
    paired_padded = statistics.median(c / p for c, p in zip(client_rates, padded_rates))
    paired_loop = statistics.median(c / r for c, r in zip(client_rates, loop_rates))
    print(f"{'':34} {'tokens/s':>10}  {'LocalClient speedup':>20}  {'paired':>7}")
    name = "LocalClient (HF forward)" if args.hf_decode else "LocalClient"
    print(f"{name:34} {client:10.1f}  {'':>20}")
    print(
        f"{'model.generate, one padded call':34} {padded:10.1f}  {client / padded:19.1f}x  {paired_padded:6.1f}x"
    )
    print(
        f"{'model.generate, one call/request':34} {loop_rate:10.1f}  {client / loop_rate:19.1f}x  {paired_loop:6.1f}x"
    )
    if cb_rates:
        cb_rate = statistics.median(cb_rates)
        paired_cb = statistics.median(c / b for c, b in zip(client_rates, cb_rates))
        print(
            f"{'model.generate_batch (continuous)':34} {cb_rate:10.1f}  {client / cb_rate:19.1f}x  {paired_cb:6.1f}x"
        )
    if floor_rates:
        bound = statistics.median(floor_rates)
        paired_bound = statistics.median(f / p for f, p in zip(floor_rates, padded_rates))
        print(
            f"{'bound: client passes, linears only':34} {bound:10.1f}  "
            f"{'(most speedup:':>11} {bound / padded:5.1f}x) {paired_bound:6.1f}x"
        )


def _quick_model(tmp: Path) -> Path:
    print("no model found; building a quick tiny model in a temp folder ...", flush=True)
    spec = TinyModelSpec(steps=60)  # format only: throughput does not depend on quality
    return build_tiny_model(tmp / "tiny", reverse_text_demonstrations(500), spec)


async def _run_interleaved(
    model_path: str,
    prompts: list[Messages],
    loop_prompts: list[Messages],
    sampling: SamplingParams,
    repeats: int,
    *,
    hf_decode: bool,
    dtype: str,
    continuous_batching: bool,
    floor: bool,
) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
    """Alternate LocalClient runs, padded-generate runs, per-request generate loops and (with
    `continuous_batching`) transformers' `generate_batch`; returns the lists of tokens/s, and
    with `floor` each client run's zero-overhead bound (`_linear_pass_seconds`).

    The `generate` side runs in a child process (`_baseline_worker`), as each side runs for a
    user: alone in its process. In one process, the client's decode thread and the thread calling
    `generate` each keep an OpenMP thread team, and with more OpenMP threads than cores GNU
    OpenMP stops spinning between parallel regions: measured on 2 cores, 2 threads, float32,
    the client fell from ~400 to ~290 tokens/s and the padded call from 176 to 142."""
    import multiprocessing

    client = LocalClient(model_path, max_batch_size=len(prompts), dtype=dtype)
    client.lean_decode = not hf_decode
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no OpenMP state shared
    baseline, child_end = context.Pipe()
    child = context.Process(
        target=_baseline_worker,
        args=(child_end, model_path, dtype, prompts, loop_prompts, sampling, _torch_threads()),
        daemon=True,
    )
    child.start()

    def ask(*command: object) -> Any:
        baseline.send(command)
        answer = baseline.recv()
        if isinstance(answer, BaseException):
            raise answer
        return answer

    try:
        # Warm-up, each path at its own unit of work: the client's and the padded call's whole batch
        # (first-call kernel setup, the client's KV cache sized for all rows), the loop's one request.
        await asyncio.gather(*[client.chat(p, sampling=sampling) for p in prompts])
        ask("warmup", continuous_batching)
        client_rates, padded_rates, loop_rates, cb_rates, floor_rates = [], [], [], [], []
        for _ in range(repeats):
            passes_before = client.stats.forward_passes
            start = time.perf_counter()
            results = await asyncio.gather(*[client.chat(p, sampling=sampling) for p in prompts])
            elapsed = time.perf_counter() - start
            tokens = sum(c.completion_tokens for r in results for c in r)
            client_rates.append(tokens / elapsed)
            print(
                f"  LocalClient:   {tokens} tokens in {elapsed:.2f}s ({client.stats.batches} batches so far)",
                flush=True,
            )
            if floor:
                passes = client.stats.forward_passes - passes_before
                least = passes * ask("linears", round(tokens / passes))
                floor_rates.append(tokens / least)
            tokens, elapsed = ask("padded")
            padded_rates.append(tokens / elapsed)
            print(f"  padded call:   {tokens} tokens in {elapsed:.2f}s", flush=True)
            tokens, elapsed = ask("loop")
            loop_rates.append(tokens / elapsed)
            print(f"  generate loop: {tokens} tokens in {elapsed:.2f}s", flush=True)
            if continuous_batching:
                tokens, elapsed = ask("batch")
                cb_rates.append(tokens / elapsed)
                print(f"  generate_batch: {tokens} tokens in {elapsed:.2f}s", flush=True)
        return client_rates, padded_rates, loop_rates, cb_rates, floor_rates
    finally:
        baseline.send(("stop",))
        child.join(timeout=60)
        await client.close()


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _baseline_worker(
    pipe: Any,
    model_path: str,
    dtype: str,
    prompts: list[Messages],
    loop_prompts: list[Messages],
    sampling: SamplingParams,
    threads: int,
) -> None:
    """The `generate` side, in its own process: answers ("padded",), ("loop",), ("batch",) with
    (completion tokens, seconds), ("linears", rows) with `_linear_pass_seconds`, ("warmup",
    with_batch) with None; ("stop",) ends it. An exception is sent back, not raised."""
    import torch

    torch.set_num_threads(threads)  # the parent's count (`--threads` or torch's default)
    model, tokenizer = _load(model_path, dtype)
    padded_inputs = _padded_inputs(tokenizer, prompts)
    loop_inputs = [_torch_ids(_prompt_ids(tokenizer, messages)) for messages in loop_prompts]
    batch_inputs = [_prompt_ids(tokenizer, messages) for messages in prompts]
    while True:
        command, *args = pipe.recv()
        try:
            if command == "stop":
                return
            if command == "warmup":
                _padded_generate(model, tokenizer, padded_inputs, sampling)
                _generate_loop(model, tokenizer, loop_inputs[:1], sampling)
                if args[0]:
                    _continuous_batch(model, tokenizer, batch_inputs, sampling, warmup=True)
                pipe.send(None)
            elif command == "padded":
                pipe.send(_padded_generate(model, tokenizer, padded_inputs, sampling))
            elif command == "loop":
                pipe.send(_generate_loop(model, tokenizer, loop_inputs, sampling))
            elif command == "batch":
                pipe.send(_continuous_batch(model, tokenizer, batch_inputs, sampling, warmup=False))
            elif command == "linears":
                pipe.send(_linear_pass_seconds(model, args[0]))
            else:  # a reply all the same: the parent is waiting for one
                pipe.send(ValueError(f"unknown command {command!r}"))
        except Exception as exc:  # the parent re-raises it
            pipe.send(exc)


def _load(model_path: str, dtype: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()
    return model, tokenizer


def _prompt_ids(tokenizer: Any, messages: Messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def _generate_settings(tokenizer: Any, sampling: SamplingParams) -> dict[str, Any]:
    return dict(
        max_new_tokens=sampling.max_tokens,
        do_sample=sampling.temperature > 0,
        temperature=sampling.temperature or None,
        top_p=1.0,
        top_k=0,
        pad_token_id=tokenizer.pad_token_id,
    )


def _padded_inputs(tokenizer: Any, prompts: list[Messages]) -> tuple[Any, Any]:
    """All prompts left-padded into one batch: (input_ids, attention_mask)."""
    import torch

    encoded = [_prompt_ids(tokenizer, messages) for messages in prompts]
    width = max(len(ids) for ids in encoded)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(encoded), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, ids in enumerate(encoded):
        input_ids[i, width - len(ids) :] = torch.tensor(ids)
        attention_mask[i, width - len(ids) :] = 1
    return input_ids, attention_mask


def _padded_generate(
    model: Any, tokenizer: Any, inputs: tuple[Any, Any], sampling: SamplingParams
) -> tuple[int, float]:
    """One `generate` call over the whole padded batch; returns (completion tokens, seconds)."""
    import torch

    input_ids, attention_mask = inputs
    eos = _eos_ids(model, tokenizer)
    with torch.inference_mode():
        start = time.perf_counter()
        output = model.generate(
            input_ids, attention_mask=attention_mask, **_generate_settings(tokenizer, sampling)
        )
        elapsed = time.perf_counter() - start
    tokens = 0
    for row in output[:, input_ids.shape[1] :].tolist():
        ends = [i for i, token in enumerate(row) if token in eos]
        tokens += ends[0] + 1 if ends else len(row)  # rows that finished early are padded after their EOS
    return tokens, elapsed


def _continuous_batch(
    model: Any, tokenizer: Any, encoded: list[list[int]], sampling: SamplingParams, *, warmup: bool
) -> tuple[int, float]:
    """All requests through transformers' continuous batching (`generate_batch`, paged KV cache);
    returns (completion tokens, seconds). `warmup` runs the library's own warm-up pass first."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    # Sized for this workload: left to itself on a CPU the library sizes its paged KV cache from
    # free memory and ran 13 tokens/s on the tiny model (8 requests); pages of 64 tokens, enough
    # blocks for every request's prompt + completion, and one forward of at most 2,048 tokens.
    page = 64
    blocks = sum(-(-(len(ids) + sampling.max_tokens) // page) for ids in encoded) + 8
    batching = ContinuousBatchingConfig(num_blocks=blocks, page_size=page, max_batch_tokens=2048)
    config = GenerationConfig(
        eos_token_id=sorted(_eos_ids(model, tokenizer)), **_generate_settings(tokenizer, sampling)
    )
    start = time.perf_counter()
    outputs = model.generate_batch(
        inputs=encoded, generation_config=config, continuous_batching_config=batching, warmup=warmup
    )
    elapsed = time.perf_counter() - start
    return sum(len(output.generated_tokens) for output in outputs.values()), elapsed


def _linear_pass_seconds(model: Any, rows: int) -> float:
    """Seconds for `rows` rows through every `nn.Linear` of `model` once, in module order (the
    weights streamed as a forward pass streams them): the median of three passes after one."""
    import torch

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(rows, m.in_features, dtype=m.weight.dtype) for m in linears}
    times = []
    with torch.inference_mode():
        for _ in range(4):
            start = time.perf_counter()
            for module in linears:
                module(inputs[module.in_features])
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    value = model.generation_config.eos_token_id
    if value is None:
        value = tokenizer.eos_token_id
    return set(value) if isinstance(value, (list, tuple)) else {value}


def _torch_ids(ids: list[int]) -> Any:
    import torch

    return torch.tensor([ids])


def _generate_loop(
    model: Any, tokenizer: Any, encoded: list[Any], sampling: SamplingParams
) -> tuple[int, float]:
    """One `generate` call per request, in turn; returns (completion tokens, seconds)."""
    import torch

    settings = _generate_settings(tokenizer, sampling)
    with torch.inference_mode():
        start = time.perf_counter()
        tokens = 0
        for input_ids in encoded:
            output = model.generate(input_ids, **settings)
            tokens += output.shape[1] - input_ids.shape[1]  # generate stops a lone row at its EOS
        elapsed = time.perf_counter() - start
    return tokens, elapsed


if __name__ == "__main__":
    main()
