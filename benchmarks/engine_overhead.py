"""Engine overhead: single-turn rollouts per second against an OpenAI-compatible server on
127.0.0.1 that answers instantly, in its own process, at concurrency 64. Target (issue 19): at
least 4,000 rollouts/s.

    python benchmarks/engine_overhead.py [--rollouts 8000] [--concurrency 64] [--repeat 3] [--in-process]
        [--server lean|workbench] [--client auto|aiohttp]

The server is workbench's EchoClient behind `workbench serve`'s route handlers: by default on the
lean HTTP server (`workbench.inference.echo_server`, the instant endpoint), with `--server
workbench` on `workbench serve`'s aiohttp server itself (`workbench.inference.server`; the same
JSON, more server CPU per request). `--client aiohttp` makes OpenAIClient use aiohttp instead of
its lean keep-alive client (what it did before issue 19), for comparison.

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
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from workbench.inference.http_transport import TransportKind

TARGET = 4000  # rollouts/s (issue 19)

SERVERS = {
    "lean": "from workbench.inference.echo_server import run_echo_server\nrun_echo_server(port=0)\n",
    "workbench": (
        "from workbench.inference.echo import EchoClient\n"
        "from workbench.inference.server import run_server\n"
        "run_server(EchoClient('echo'), host='127.0.0.1', port=0, served_model_name='echo')\n"
    ),
}


@dataclass
class Measurement:
    rate: float  # rollouts/s
    rollouts: int
    errors: int
    engine_cpu_s: float  # this process, during the measured run
    server_cpu_s: float  # the server process, during the measured run


def start_server(kind: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", SERVERS[kind]], stdout=subprocess.PIPE, text=True)
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
    transport: TransportKind = "auto",
) -> Measurement:
    from workbench.engine import run_rollouts
    from workbench.envs import load_environment
    from workbench.inference.echo import EchoClient
    from workbench.inference.openai_client import OpenAIClient
    from workbench.store.results import ResultsWriter
    from workbench.types import SamplingParams

    env = load_environment("reverse-text", num_eval_examples=rollouts // r)
    examples = env.get_examples(rollouts // r)
    client = OpenAIClient(f"{base_url}/v1", "echo", transport=transport) if base_url else EchoClient("echo")
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
        "--server",
        choices=sorted(SERVERS),
        default="lean",
        help="lean: the instant echo endpoint; workbench: `workbench serve`'s aiohttp server",
    )
    parser.add_argument(
        "--client",
        choices=["auto", "aiohttp"],
        default="auto",
        help="OpenAIClient's transport: auto (the lean client for http://) or aiohttp",
    )
    args = parser.parse_args()
    proc, url = (None, None) if args.in_process else start_server(args.server)
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
                        args.client,
                    )
                )
            )
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
    where = (
        "in-process EchoClient, no HTTP"
        if args.in_process
        else f"over HTTP, {args.server} server, {args.client} client"
    )
    print(
        f"engine overhead ({where}): {rate:,.0f} rollouts/s (median of {len(runs)}) at concurrency "
        f"{args.concurrency}, {args.rollouts_per_example} per example; target >= {TARGET:,}: {verdict}; "
        f"engine CPU {best_cpu:.3f} s per 1,000 rollouts (best)"
    )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
