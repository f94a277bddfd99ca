"""Training step throughput on the tiny model: samples/s and tokens/s of an RL step, with the
step time split into generation, forward/backward, optimizer and everything else.
Target: everything else under 10% of the step.

    python benchmarks/train_step.py [--steps 5] [--batch-size 64]

Runs `configs/rl/reverse-text.toml` (LoRA, colocated on CPU) in a temporary folder; needs the
tiny model (`workbench setup`). The first step is a warm-up and is not counted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    from workbench.train.config import load_train_config
    from workbench.train import run_train

    with tempfile.TemporaryDirectory() as tmp:
        config, _ = load_train_config(REPO / "configs" / "rl" / "reverse-text.toml", [
            f"max_steps={args.steps + 1}", f"batch_size={args.batch_size}", "eval.interval=0",
            "checkpointing.save_every_n_steps=1000", 'wandb.mode="disabled"', f"output_dir='{tmp}/run'",
        ])
        result = run_train(config)
    steps = result.metrics[1:]  # drop the warm-up step

    def mean(key: str) -> float:
        return statistics.fmean(m.get(key, 0.0) for m in steps)

    step_s = mean("time/step")
    parts = {"generation": mean("rollout/generation_time"), "forward/backward": mean("time/forward_backward"),
             "optimizer": mean("time/optimizer"), "everything else": mean("time/other")}
    print(f"train step on the tiny model: {step_s:.2f} s/step, {args.batch_size / step_s:.1f} samples/s, "
          f"{mean('perf/tokens_per_s'):,.0f} tokens/s ({len(steps)} steps, batch {args.batch_size})")
    for name, seconds in parts.items():
        print(f"  {name:<17} {seconds:6.3f} s  {100 * seconds / step_s:5.1f}%")
    print(f"everything else: {100 * parts['everything else'] / step_s:.1f}% of the step (target < 10%)")


if __name__ == "__main__":
    main()
