"""Engine overhead: single-turn rollouts per second against an OpenAI-compatible server on
127.0.0.1 that answers instantly (workbench's EchoClient behind `workbench.inference.server`,
in its own process), at concurrency 64. Target: at least 500 rollouts/s on 2 cores.

    python benchmarks/engine_overhead.py [--rollouts 4000] [--concurrency 64]

What is measured is the whole eval path minus the model: request building, HTTP, response
parsing, scoring with the reverse-text rubric, and streaming each group to results.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVER = (
    "from workbench.inference.echo import EchoClient\n"
    "from workbench.inference.server import run_server\n"
    "run_server(EchoClient('echo'), host='127.0.0.1', port=0, served_model_name='echo')\n"
)


def start_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
        if match:
            return proc, match.group(1)
    raise RuntimeError("server did not start")


async def measure(base_url: str, rollouts: int, concurrency: int, r: int) -> tuple[float, int]:
    from workbench.engine import run_rollouts
    from workbench.envs import load_environment
    from workbench.inference.openai_client import OpenAIClient
    from workbench.store.results import ResultsWriter
    from workbench.types import SamplingParams

    env = load_environment("reverse-text", num_eval_examples=rollouts // r)
    examples = env.get_examples(rollouts // r)
    client = OpenAIClient(f"{base_url}/v1", "echo")
    with tempfile.TemporaryDirectory() as tmp:
        writer = ResultsWriter(Path(tmp))
        # warm-up: connections, imports
        await run_rollouts(env, client, examples[:16], rollouts_per_example=r, sampling=SamplingParams(),
                           max_concurrent=concurrency)
        started = time.perf_counter()
        stats = await run_rollouts(env, client, examples, rollouts_per_example=r, sampling=SamplingParams(),
                                   max_concurrent=concurrency, on_group=writer.write_group)
        elapsed = time.perf_counter() - started
        writer.close()
    await client.close()
    return stats.rollouts / elapsed, stats.errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rollouts-per-example", type=int, default=4)
    args = parser.parse_args()
    proc, url = start_server()
    try:
        rate, errors = asyncio.run(measure(url, args.rollouts, args.concurrency, args.rollouts_per_example))
    finally:
        proc.kill()
    print(f"engine overhead: {rate:,.0f} single-turn rollouts/s at concurrency {args.concurrency} "
          f"({args.rollouts} rollouts, {errors} errors; target >= 500)")


if __name__ == "__main__":
    main()
