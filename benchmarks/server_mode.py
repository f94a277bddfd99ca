"""Step time of RL training: colocated vs server mode with local `workbench serve` processes,
and in server mode synchronous (max_async_level = 0) vs async (generation of step n+1 overlaps
training of step n).

    python benchmarks/server_mode.py [--steps 6] [--batch-size 64] [--servers 2]
    python benchmarks/server_mode.py --model DIR --config configs/rl/reverse-text-smollm2.toml \
        --servers 1 --batch-size 32 --serve-arg=--dtype=bfloat16 --set micro_batch_size=32

Runs `--config` (default `configs/rl/reverse-text.toml`, LoRA) with `--model` (default the tiny
model, `workbench setup`) in a temporary folder; `--serve-arg` passes a flag to each server and
`--set` a config override to every run. The first step of each run is a warm-up and is not
counted. On a small CPU machine the servers and the trainer share the same cores, so the
overlap gains less than it does when inference has its own GPU; the split printed per mode
shows where time goes.
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


def start_servers(
    count: int, model: str, serve_args: list[str]
) -> tuple[list[subprocess.Popen[str]], list[str]]:
    procs, urls = [], []
    # one torch thread per server: on a small CPU machine the servers and the trainer share the cores
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for _ in range(count):
        proc = subprocess.Popen(
            [sys.executable, "-m", "workbench", "serve", model, "--port", "0", "--enable-lora", *serve_args],
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


def run(name: str, overrides: list[str], args: argparse.Namespace, tmp: str) -> list[dict[str, Any]]:
    from workbench.train import run_train
    from workbench.train.config import load_train_config

    config, _ = load_train_config(
        Path(args.config),
        [
            f"model='{args.model}'",
            f"max_steps={args.steps + 1}",
            f"batch_size={args.batch_size}",
            "eval.interval=0",
            "checkpointing.save_every_n_steps=1000",
            'wandb.mode="disabled"',
            f"output_dir='{tmp}/{name}'",
            *args.set,
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
    parser.add_argument(
        "--model", default="tiny", help="model folder or name, for the trainer and the servers"
    )
    parser.add_argument("--config", default=str(REPO / "configs" / "rl" / "reverse-text.toml"))
    parser.add_argument("--serve-arg", action="append", default=[], help="a flag for each `workbench serve`")
    parser.add_argument("--set", action="append", default=[], help="a config override for every run")
    args = parser.parse_args()

    procs, urls = start_servers(args.servers, args.model, args.serve_arg)
    server = ["inference.mode='server'", f"inference.base_urls={urls!r}".replace("'", '"')]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            results = {
                "colocated": run("colocated", [], args, tmp),
                f"server x{args.servers}, sync": run("sync", [*server, "max_async_level=0"], args, tmp),
                f"server x{args.servers}, async": run("async", [*server, "max_async_level=1"], args, tmp),
            }
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
    print(
        f"RL step on {args.model} ({Path(args.config).name}), batch {args.batch_size}, {args.steps} steps after a warm-up, {os.cpu_count()} CPU cores"
    )
    times = {name: report(name, steps, args.batch_size) for name, steps in results.items()}
    sync, asyn = list(times.values())[1:]
    print(
        f"async vs sync in server mode: {sync / asyn:.2f}x; server async vs colocated: {times['colocated'] / asyn:.2f}x"
    )


if __name__ == "__main__":
    main()
