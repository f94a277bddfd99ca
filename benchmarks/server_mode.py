"""Step time of RL training on the tiny model: colocated vs server mode with local
`workbench serve` processes, and in server mode synchronous (max_async_level = 0) vs async
(generation of step n+1 overlaps training of step n).

    python benchmarks/server_mode.py [--steps 6] [--batch-size 64] [--servers 2]

Runs `configs/rl/reverse-text.toml` (LoRA) in a temporary folder; needs the tiny model
(`workbench setup`). The first step of each run is a warm-up and is not counted. On a small
CPU machine the servers and the trainer share the same cores, so the overlap gains less than
it does when inference has its own GPU; the split printed per mode shows where time goes.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def start_servers(count: int) -> tuple[list[subprocess.Popen[str]], list[str]]:
    procs, urls = [], []
    # one torch thread per server: on a small CPU machine the servers and the trainer share the cores
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for _ in range(count):
        proc = subprocess.Popen(
            [sys.executable, "-m", "workbench", "serve", "tiny", "--port", "0", "--enable-lora"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(proc)
    for proc in procs:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
            if match:
                urls.append(f"{match.group(1)}/v1")
                break
        else:
            raise SystemExit("a workbench serve process exited before listening")
    return procs, urls


def run(name: str, overrides: list[str], steps: int, batch_size: int, tmp: str) -> list[dict[str, Any]]:
    from workbench.train import run_train
    from workbench.train.config import load_train_config

    config, _ = load_train_config(
        REPO / "configs" / "rl" / "reverse-text.toml",
        [
            f"max_steps={steps + 1}",
            f"batch_size={batch_size}",
            "eval.interval=0",
            "checkpointing.save_every_n_steps=1000",
            'wandb.mode="disabled"',
            f"output_dir='{tmp}/{name}'",
            *overrides,
        ],
    )
    return run_train(config).metrics[1:]  # drop the warm-up step


def report(name: str, steps: list[dict[str, Any]], batch_size: int) -> float:
    def mean(key: str) -> float:
        return statistics.fmean(m.get(key, 0.0) for m in steps)

    step_s = mean("time/step")
    print(
        f"{name:<22} {step_s:6.2f} s/step  {batch_size / step_s:6.1f} samples/s   "
        f"generation {mean('rollout/generation_time'):5.2f} s  waited {mean('time/wait_rollouts'):5.2f} s  "
        f"train {mean('time/forward_backward') + mean('time/optimizer'):5.2f} s  "
        f"weight sync {mean('time/weight_sync'):5.3f} s  lag {mean('policy/lag'):.2f}"
    )
    return step_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--servers", type=int, default=2)
    args = parser.parse_args()

    procs, urls = start_servers(args.servers)
    server = ["inference.mode='server'", f"inference.base_urls={urls!r}".replace("'", '"')]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            results = {
                "colocated": run("colocated", [], args.steps, args.batch_size, tmp),
                f"server x{args.servers}, sync": run(
                    "sync", [*server, "max_async_level=0"], args.steps, args.batch_size, tmp
                ),
                f"server x{args.servers}, async": run(
                    "async", [*server, "max_async_level=1"], args.steps, args.batch_size, tmp
                ),
            }
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
    print(
        f"RL step on the tiny model, batch {args.batch_size}, {args.steps} steps after a warm-up, {os.cpu_count()} CPU cores"
    )
    times = {name: report(name, steps, args.batch_size) for name, steps in results.items()}
    sync, asyn = list(times.values())[1:]
    print(
        f"async vs sync in server mode: {sync / asyn:.2f}x; server async vs colocated: {times['colocated'] / asyn:.2f}x"
    )


if __name__ == "__main__":
    main()
