"""Eval memory: peak RSS of a whole `workbench eval run` (the CLI process: engine, eval service,
summary, progress rendering) as the number of rollouts grows, against an OpenAI-compatible
server on 127.0.0.1 that answers instantly (workbench's EchoClient behind
`workbench.inference.server`, in its own process). Target (issue 19): the peak for 100,000
rollouts within 1.5x the peak for 1,000.

    python benchmarks/eval_memory.py [--rollouts 1000 100000] [-r 4] [--concurrency 64]

Each size runs in a fresh `workbench eval run` process (in a temporary workspace, deleted
afterwards); its peak RSS comes from the kernel's accounting of that child (wait4's ru_maxrss),
so nothing is sampled and nothing is missed. The example list the run starts from (its dataset)
still grows with the number of examples: use a larger -r to see the engine's share alone.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_overhead import start_server  # noqa: E402

TARGET_RATIO = 1.5


def eval_peak_rss(base_url: str, rollouts: int, r: int, concurrency: int) -> tuple[float, float, str]:
    """(peak RSS in MiB, seconds, last line of stderr) of one `workbench eval run`."""
    examples = max(1, rollouts // r)
    with tempfile.TemporaryDirectory() as workspace:
        env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_WORKSPACE"}
        args = [
            sys.executable,
            "-m",
            "workbench",
            "eval",
            "run",
            "reverse-text",
            "-m",
            "echo",
            "-b",
            f"{base_url}/v1",
            "-n",
            str(examples),
            "-r",
            str(r),
            "-c",
            str(concurrency),
            "-a",
            f'{{"num_eval_examples": {examples}}}',
        ]
        started = time.perf_counter()
        with open(Path(workspace) / "stderr.txt", "w+") as err:
            proc = subprocess.Popen(args, cwd=workspace, env=env, stdout=subprocess.DEVNULL, stderr=err)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            elapsed = time.perf_counter() - started
            err.seek(0)
            lines = err.read().strip().splitlines()
        if proc.returncode != 0:
            raise RuntimeError(
                f"eval of {rollouts} rollouts failed ({proc.returncode}): {' | '.join(lines[-5:])}"
            )
    return usage.ru_maxrss / 1024, elapsed, lines[-1] if lines else ""  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rollouts",
        type=int,
        nargs="+",
        default=[1000, 100_000],
        help="eval sizes in rollouts; the first is the baseline of the ratio",
    )
    parser.add_argument("-r", "--rollouts-per-example", type=int, default=4)
    parser.add_argument("-c", "--concurrency", type=int, default=64)
    args = parser.parse_args()
    proc, url = start_server()  # `workbench serve`'s aiohttp server, as the docstring says
    rows = []
    try:
        for rollouts in args.rollouts:
            peak, elapsed, _ = eval_peak_rss(url, rollouts, args.rollouts_per_example, args.concurrency)
            rows.append((rollouts, peak, elapsed))
            print(f"  {rollouts:>9,} rollouts: peak RSS {peak:7.1f} MiB  ({elapsed:.1f} s)", flush=True)
    finally:
        proc.kill()
    base = rows[0][1]
    print()
    print(
        f"{'rollouts':>10}  {'examples':>9}  {'peak RSS MiB':>12}  {'x first':>7}  {'KiB/rollout over first':>22}  {'rollouts/s':>10}"
    )
    for rollouts, peak, elapsed in rows:
        extra = (peak - base) * 1024 / (rollouts - rows[0][0]) if rollouts != rows[0][0] else 0.0
        print(
            f"{rollouts:>10,}  {rollouts // args.rollouts_per_example:>9,}  {peak:>12.1f}  {peak / base:>7.2f}  "
            f"{extra:>22.3f}  {rollouts / elapsed:>10,.0f}"
        )
    worst = max(peak for _, peak, _ in rows) / base
    print(
        f"\npeak memory ratio (largest / {rows[0][0]:,} rollouts): {worst:.2f}; target <= {TARGET_RATIO}: "
        f"{'meets' if worst <= TARGET_RATIO else 'over'}"
    )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
