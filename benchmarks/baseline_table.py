"""A model's baseline on every bundled environment: reward, format rate, truncation, tokens/s.

    python benchmarks/baseline_table.py                          # smollm2-135m, 16 examples x 2 each
    python benchmarks/baseline_table.py -m tiny -n 32 -r 4 --write docs/baselines/tiny.md

Each environment is evaluated in-process (`run_eval`, the engine `workbench eval run` uses) with
its own default sampling, capped at --max-tokens per turn so a model that never stops cannot take
the table hostage. Columns:
- reward: mean reward with a 95% bootstrap interval over examples;
- format: the mean of the environment's format metric (a reward function whose name has
  "format" in it), the share of answers a parser could read; "-" where the env has none;
- truncated: the share of rollouts cut at the token limit;
- tokens/s: completion tokens generated per second of the eval's wall time (all rollouts
  batched together, as `eval run` runs them).
gsm8k and math-python read GSM8K from --gsm8k (a JSONL file; skipped when it is missing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ENVS = ("reverse-text", "alphabet-sort", "gsm8k", "math-python", "wordle", "wiki-search")
NEEDS_GSM8K = ("gsm8k", "math-python")


def row(env_id: str, args: argparse.Namespace) -> str:
    from workbench.engine.paired import mean_interval
    from workbench.evaluate import EvalConfig, run_eval

    env_args = {"data_path": str(args.gsm8k)} if env_id in NEEDS_GSM8K else {}
    config = EvalConfig(
        env_id=env_id,
        model=args.model,
        num_examples=args.num_examples,
        rollouts_per_example=args.rollouts,
        max_tokens=args.max_tokens,
        env_args=env_args,
        seed=0,
    )
    started = time.perf_counter()
    result = run_eval(config)
    seconds = time.perf_counter() - started
    summary = result.summary
    means = list(result.group_means().values())
    low, high = mean_interval(means)
    formats = [v for k, v in summary.get("reward_funcs", {}).items() if "format" in k]
    fmt = f"{formats[0]:.2f}" if formats else "-"
    tokens = summary["completion_tokens_mean"] * summary["num_rollouts"]
    return (
        f"| {env_id} | {summary['reward_mean']:.3f} [{low:.3f}, {high:.3f}] | {fmt} | {summary['truncated_frac']:.0%} "
        f"| {summary['completion_tokens_mean']:.0f} | {tokens / seconds:.0f} | {seconds:.0f} s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default="smollm2-135m")
    parser.add_argument("-n", "--num-examples", type=int, default=16)
    parser.add_argument("-r", "--rollouts", type=int, default=2)
    parser.add_argument("-t", "--max-tokens", type=int, default=256)
    parser.add_argument("--env", action="append", help="only these environments (repeatable)")
    parser.add_argument("--gsm8k", type=Path, default=Path("data/gsm8k/train.jsonl"))
    parser.add_argument("--write", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args()

    header = [
        "| env | reward [95% CI] | format | truncated | completion tokens | tokens/s | time |",
        "|---|---|---|---|---|---|---|",
    ]
    lines = list(header)
    print(
        f"{args.model} · {args.num_examples} examples x {args.rollouts} rollouts · max {args.max_tokens} tokens/turn · "
        f"{os.cpu_count()} CPUs",
        file=sys.stderr,
    )
    for env_id in args.env or ENVS:
        if env_id in NEEDS_GSM8K and not args.gsm8k.is_file():
            lines.append(f"| {env_id} | skipped: no GSM8K file at {args.gsm8k} (--gsm8k) | | | | | |")
            continue
        lines.append(row(env_id, args))
        print(lines[-1], file=sys.stderr, flush=True)
    table = "\n".join(lines)
    print(table)
    if args.write:
        import torch

        load = os.getloadavg()[1]
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(
            f"# Baseline: {args.model}\n\nMade by `python benchmarks/baseline_table.py -m {args.model} "
            f"-n {args.num_examples} -r {args.rollouts} -t {args.max_tokens}` on {os.cpu_count()} CPU cores "
            f"({torch.get_num_threads()} torch threads, 5-minute load average {load:.1f} at the end: "
            f"tokens/s is what this machine gave then).\n\n{table}\n"
        )


if __name__ == "__main__":
    main()
