"""RL step throughput on the tiny model across process layouts: 1 vs 2 inference replicas
(launched by the run itself, `[inference] launch = true`) × 1 vs 2 trainer ranks (`--nproc`) ×
sync vs async, and colocated inference with 1 and 2 ranks, printed as one table with where the
time goes.

    python benchmarks/scale.py [--steps 4] [--batch-size 64]

Runs `configs/rl/reverse-text.toml` (LoRA) in a temporary folder; needs the tiny model
(`workbench setup`). The first step of each run is a warm-up and is not counted. Columns:
samples/s = batch / step time; generation = time to produce a step's rollouts; waited = time the
trainer waited for them (generation not hidden behind training); train = forward/backward +
optimizer; sync = pushing the adapter to the servers.

With several ranks in server mode, rank 0 rolls out for all of them (workbench.train.shared_source).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "rl" / "reverse-text.toml"


def settings(steps: int, batch_size: int, folder: Path) -> list[str]:
    return [
        f"max_steps={steps + 1}",
        f"batch_size={batch_size}",
        f"micro_batch_size={min(batch_size, 64)}",
        "eval.interval=0",
        "checkpointing.save_every_n_steps=1000",
        'wandb.mode="disabled"',
        f"output_dir='{folder}'",
    ]


def run_layout(overrides: list[str], nproc: int, folder: Path) -> list[dict[str, Any]]:
    """One training run as a user starts it (its own process: replicas are its children)."""
    from workbench.store.runs import read_metrics

    cmd = [sys.executable, "-m", "workbench", "train", str(CONFIG), "--nproc", str(nproc)]
    for override in overrides:
        cmd += ["--set", override]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return read_metrics(folder)[1:]  # drop the warm-up step


def row(name: str, steps: list[dict[str, Any]], batch_size: int) -> str:
    def mean(key: str) -> float:
        return statistics.fmean(m.get(key, 0.0) for m in steps)

    step_s = mean("time/step")
    return (
        f"| {name} | {step_s:.2f} | {batch_size / step_s:.1f} | {mean('rollout/generation_time'):.2f} | "
        f"{mean('time/wait_rollouts'):.2f} | {mean('time/forward_backward') + mean('time/optimizer'):.2f} | "
        f"{mean('time/weight_sync'):.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    layouts = [  # (name, overrides, trainer ranks)
        ("colocated, 1 rank", [], 1),
        ("colocated, 2 ranks", [], 2),
        *[
            (
                f"{n} replica{'s' * (n > 1)} × {ranks} rank{'s' * (ranks > 1)}, {mode}",
                [
                    "inference.mode='server'",
                    "inference.launch=true",
                    f"inference.data_parallel_size={n}",
                    f"max_async_level={level}",
                ],
                ranks,
            )
            for n in (1, 2)
            for ranks in (1, 2)
            for mode, level in (("sync", 0), ("async", 1))
        ],
    ]
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, overrides, nproc) in enumerate(layouts):
            folder = Path(tmp) / f"run{i}"
            steps = run_layout([*settings(args.steps, args.batch_size, folder), *overrides], nproc, folder)
            lines.append(row(name, steps, args.batch_size))
            print(lines[-1], flush=True)
    print(
        f"\nRL step on the tiny model, batch {args.batch_size}, {args.steps} steps after a warm-up, "
        f"{os.cpu_count()} CPU cores"
    )
    print("| layout | s/step | samples/s | generation s | waited s | train s | sync s |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
