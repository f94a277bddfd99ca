"""Engine overhead: single-turn rollouts per second against an OpenAI-compatible server on
127.0.0.1 that answers instantly, in its own process, at concurrency 64. Target (issue 32): at
least 2,000 rollouts/s on an idle 2-core machine.

    python benchmarks/engine_overhead.py [--rollouts 8000] [--concurrency 64] [--repeat 3] [--in-process]

The server is `workbench serve`'s aiohttp app (`workbench.inference.server`) with workbench's
EchoClient as its model: the same routes, validation and OpenAI-format JSON as a served model,
answered instantly. The client is `OpenAIClient` (aiohttp, as for every URL).

Side by side, against the same server: verifiers' own eval loop (`Environment.generate`, what
`vf-eval` runs, through its OpenAI client) on verifiers' reverse-text environment
(tests/fixtures/verifiers_envs/reverse_text) with the same rollouts per example and concurrency
(`--verifiers-rollouts`, fewer by default as it is much slower; 0 skips it; needs the verifiers
extra). It saves no results; Workbench's run streams every group to results.jsonl.

What is measured is the whole eval path minus the model: request building, HTTP, response
parsing, scoring with the reverse-text rubric, and streaming each group to results.jsonl.
Besides the rate it prints the CPU time each side used per 1,000 rollouts: the server is a second
process, so on a 2-core machine it competes with the engine for the same cores, and a rate held
down by the server's share is not the engine's overhead. On a busy machine the CPU time per
rollout (best of --repeat) is the steadier number to compare. `--in-process` leaves HTTP out
(EchoClient called directly): the engine, the environment and the rubric alone.

Memory (peak RSS of a whole `workbench eval run` as the rollout count grows) is measured by
benchmarks/eval_memory.py.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = 2000  # rollouts/s (issue 32)

# `workbench serve`'s app over EchoClient, on a free port; it prints its URL when ready.
SERVER = (
    "from workbench.inference.echo import EchoClient\n"
    "from workbench.inference.server import run_server\n"
    "run_server(EchoClient('echo'), host='127.0.0.1', port=0, served_model_name='echo')\n"
)


@dataclass
class Measurement:
    rate: float  # rollouts/s
    rollouts: int
    errors: int
    engine_cpu_s: float  # this process, during the measured run
    server_cpu_s: float  # the server process, during the measured run


def start_server() -> tuple[subprocess.Popen, str]:
    """The echo server in a child process, and its base URL (no /v1)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
        if match:
            return proc, match.group(1)
    raise RuntimeError("server did not start")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; 0 where unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    base_url: str | None,
    server_pid: int,
    rollouts: int,
    concurrency: int,
    r: int,
) -> Measurement:
    from workbench.engine import run_rollouts
    from workbench.envs import load_environment
    from workbench.inference.echo import EchoClient
    from workbench.inference.openai_client import OpenAIClient
    from workbench.store.results import ResultsWriter
    from workbench.types import SamplingParams

    env = load_environment("reverse-text", num_eval_examples=rollouts // r)
    examples = env.get_examples(rollouts // r)
    client = OpenAIClient(f"{base_url}/v1", "echo") if base_url else EchoClient("echo")
    with tempfile.TemporaryDirectory() as tmp:
        writer = ResultsWriter(Path(tmp))
        # warm-up: connections, imports
        await run_rollouts(
            env,
            client,
            examples[:16],
            rollouts_per_example=r,
            sampling=SamplingParams(),
            max_concurrent=concurrency,
        )
        cpu, server_cpu = time.process_time(), process_cpu_s(server_pid)
        started = time.perf_counter()
        stats = await run_rollouts(
            env,
            client,
            examples,
            rollouts_per_example=r,
            sampling=SamplingParams(),
            max_concurrent=concurrency,
            on_group=writer.write_group,
        )
        elapsed = time.perf_counter() - started
        cpu, server_cpu = time.process_time() - cpu, process_cpu_s(server_pid) - server_cpu
        writer.close()
    await client.close()
    return Measurement(stats.rollouts / elapsed, stats.rollouts, stats.errors, cpu, server_cpu)


async def measure_verifiers(base_url: str, rollouts: int, concurrency: int, r: int) -> float:
    """Rollouts/s of verifiers' eval loop on its reverse-text environment against `base_url`:
    rollouts // r examples (its ten prompts in turn, each a distinct example) x r rollouts."""
    import logging

    import datasets
    from openai import AsyncOpenAI
    from verifiers import OpenAIChatCompletionsClient

    # verifiers' environment, unchanged (under its own module name: workbench's port is `reverse_text`)
    path = REPO / "tests" / "fixtures" / "verifiers_envs" / "reverse_text" / "reverse_text.py"
    spec = importlib.util.spec_from_file_location("verifiers_reverse_text", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    datasets.disable_progress_bars()
    logging.getLogger("verifiers").setLevel(logging.ERROR)
    env = module.load_environment()
    rows = env.get_eval_dataset().to_list()
    client = OpenAIChatCompletionsClient(
        AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)
    )

    def silent(*_: object, **__: object) -> None:
        return None

    async def run(examples: int) -> float:
        inputs = [{**rows[i % len(rows)], "example_id": i} for i in range(examples) for _ in range(r)]
        started = time.perf_counter()
        await env.generate(
            inputs,
            client,
            "echo",
            max_concurrent=concurrency,
            on_start=silent,
            on_progress=silent,
            on_log=silent,
        )
        return len(inputs) / (time.perf_counter() - started)

    await run(16)  # warm-up: connections, imports
    return await run(max(1, rollouts // r))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=8000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rollouts-per-example", type=int, default=4)
    parser.add_argument(
        "--repeat", type=int, default=1, help="measure this many times (one server) and report the median"
    )
    parser.add_argument(
        "--in-process", action="store_true", help="no server: EchoClient in this process (no HTTP)"
    )
    parser.add_argument(
        "--verifiers-rollouts",
        type=int,
        default=1000,
        help="rollouts for verifiers' eval loop, side by side (0: skip it)",
    )
    args = parser.parse_args()
    proc, url = (None, None) if args.in_process else start_server()
    runs: list[Measurement] = []
    try:
        for _ in range(args.repeat):
            runs.append(
                asyncio.run(
                    measure(
                        url,
                        proc.pid if proc else 0,
                        args.rollouts,
                        args.concurrency,
                        args.rollouts_per_example,
                    )
                )
            )
        verifiers_rate: float | str | None = None
        if url is not None and args.verifiers_rollouts:
            try:
                verifiers_rate = asyncio.run(
                    measure_verifiers(
                        url, args.verifiers_rollouts, args.concurrency, args.rollouts_per_example
                    )
                )
            except ImportError as exc:
                verifiers_rate = f"skipped ({exc.name} is not installed: pip install -e '.[verifiers]')"
    finally:
        if proc is not None:
            proc.kill()
    for i, m in enumerate(runs, 1):
        per_k = 1000 / m.rollouts
        server = f", server {m.server_cpu_s * per_k:.3f} s" if proc is not None else ""
        print(
            f"run {i}: {m.rate:,.0f} rollouts/s  ({m.rollouts} rollouts, {m.errors} errors; CPU per 1,000 rollouts: "
            f"engine {m.engine_cpu_s * per_k:.3f} s{server})"
        )
    rate = statistics.median(m.rate for m in runs)
    verdict = "meets" if rate >= TARGET else "below"
    best_cpu = min(m.engine_cpu_s / m.rollouts for m in runs) * 1000
    where = "in-process EchoClient, no HTTP" if args.in_process else "over HTTP, workbench serve's echo app"
    print(
        f"engine overhead ({where}): {rate:,.0f} rollouts/s (median of {len(runs)}) at concurrency "
        f"{args.concurrency}, {args.rollouts_per_example} per example; target >= {TARGET:,}: {verdict}; "
        f"engine CPU {best_cpu:.3f} s per 1,000 rollouts (best)"
    )
    if isinstance(verifiers_rate, float):
        print(
            f"verifiers' eval loop, same server: {verifiers_rate:,.0f} rollouts/s "
            f"({args.verifiers_rollouts} rollouts); workbench / verifiers: {rate / verifiers_rate:.1f}x"
        )
    elif verifiers_rate is not None:
        print(f"verifiers' eval loop: {verifiers_rate}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
