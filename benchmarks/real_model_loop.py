"""The real-model loop, end to end: SmolLM2-135M-Instruct, SFT warm-up, then RL, each verified
on the same held-out examples with a 95% confidence interval.

    python benchmarks/real_model_loop.py                   # the scaffolded configs, 64 held-out examples x 4
    python benchmarks/real_model_loop.py -n 64 -r 4 --rl-set max_steps=40
    python benchmarks/real_model_loop.py --skip-base --rl-seeds 0,1,2   # one SFT run, RL per seed: the spread

Runs in a temporary workspace (the model comes from this workspace's outputs/models/smollm2-135m,
fetched by `workbench setup --model smollm2-135m` if missing):
  1. held-out eval of the pretrained model
  2. SFT: configs/sft/reverse-text-smollm2.toml
  3. held-out eval of the SFT checkpoint
  4. RL from that checkpoint: configs/rl/reverse-text-smollm2.toml
  5. held-out eval of the RL checkpoint
Every eval uses the same examples (the env's eval split, first -n), rollouts and sampling (the
RL config's [sampling]: what the trainer's own held-out eval uses). Each stage prints its wall
time; rewards print with a 95% bootstrap interval over examples, and each gain with a paired one
(`engine.paired`). The targets (issue 31): on 2 CPU cores, all five stages within 20 minutes,
held-out reward >= 0.50 at the end, and RL's own gain over its SFT start >= +0.15 with the
interval above 0.

Measured with the configs as committed (2026-11-28 night, 2 cores of a Xeon with AMX, quiet host,
--skip-base --rl-seeds 0,1,2; 64 held-out examples x 4 rollouts at temperature 1.0, max 32 tokens):
  2. SFT 40 steps 98 s · 3. 0.397 [0.365, 0.431] (27 s)
  4. RL 48 steps x 128 rollouts in server mode (a launched `workbench serve` replica, bfloat16,
     1 thread, generates step n+1 while the 2-thread trainer runs step n), bfloat16 LoRA base and
     autocast, std-scaled advantages, near-constant groups dropped: 709-807 s (~15-17 s a step)
  5. seed 0 0.655 [0.603, 0.708], RL gain +0.258 [+0.206, +0.306], loop 16.0 min
     seed 1 0.652 [0.593, 0.709], RL gain +0.254 [+0.200, +0.308], loop 14.9 min
     seed 2 0.630 [0.574, 0.686], RL gain +0.233 [+0.182, +0.285], loop 14.4 min (its own process:
     the first run of seed 2 was OOM-killed, see below)
  RL gain mean +0.248, sd 0.013
Targets met by every seed. The same RL with 56 steps: +0.252 / +0.256 / +0.274 (seeds 0/1/2), final
0.649-0.671, but 17.5-19.1 min: too close to the 20. Colocated generation (the config before this one,
48 steps, autocast): +0.134 / +0.194 / +0.214 (mean +0.181, sd 0.041; seed 0 below the target), loop
14.4-16.3 min, ~15 s a step. Server mode costs about the same per step on 2 cores (the replica's decode
slows the trainer's passes about as much as the overlap saves) and learns more per step: its rollouts
are one step off-policy, corrected by the importance ratio (policy/mismatch_kl ~0.001).

How the recipe got there (one run each unless said, same SFT start, RL changed only as said; each
run's interval is over held-out examples, while trajectories that differ only by float rounding
spread by +-0.05, so judge a change over several seeds): RL 24 steps colocated, float32 passes, without std
scaling +0.098 [+0.055, +0.147]; with it +0.124; plus the variance filter +0.144 (13.6 min); lr 2e-3
instead of 1e-3: -0.006, it unlearns; 32 steps +0.173 [+0.126, +0.220] in 16.6 min (RL ~26 s a step;
~21 once the trainer's torch work ran in passing threads, `inference/passing_thread`); the chunked
logprobs (train/selected_logprobs.py) cut forward/backward from ~14.5 to 9.6 s a step, bfloat16
autocast to 7.6-8.0 s, which bought the 48 steps. On a busy host the same recipe took 23.5 min
(RL ~34 s a step): the 20 minutes assume the machine to itself. Peak RSS of one SFT + RL process
~14 GB; a process that runs several RL seeds in turn grows past that (OOM-killed at 22.7 GB on the
third), so --rl-seeds runs each seed in a fresh process.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workbench.engine.paired import PairedDifference
    from workbench.train.schema import TrainConfig

REPO = Path(__file__).resolve().parents[1]
SFT_CONFIG = REPO / "configs" / "sft" / "reverse-text-smollm2.toml"
RL_CONFIG = REPO / "configs" / "rl" / "reverse-text-smollm2.toml"
QUIET = ["wandb.mode='disabled'"]
TARGET_MINUTES, TARGET_FINAL, TARGET_GAIN = 20.0, 0.50, 0.15


@dataclass(frozen=True)
class LoopResult:
    """One RL seed's end of the loop; `minutes` counts the shared stages 1-3 too."""

    seed: int | None
    minutes: float
    final: float
    rl_gain: float
    rl_low: float
    met: bool


def sampling_of(config: TrainConfig) -> dict[str, float | int]:
    """The RL config's sampling: what the trainer's own held-out eval uses."""
    return {"max_tokens": config.sampling.max_tokens or 48, "temperature": config.sampling.temperature or 1.0}


def held_out(model: str, args: argparse.Namespace, sampling: dict[str, float | int]) -> dict[int, float]:
    """`{example_id: mean reward}` of `model` on the held-out examples."""
    from workbench.evaluate import EvalConfig, run_eval

    config = EvalConfig(
        env_id="reverse-text",
        model=model,
        num_examples=args.num_examples,
        rollouts_per_example=args.rollouts,
        max_tokens=int(sampling["max_tokens"]),
        temperature=float(sampling["temperature"]),
        seed=args.seed,
    )
    return run_eval(config).group_means()


def report(stage: str, seconds: float, means: dict[int, float] | None = None) -> None:
    from workbench.engine.paired import mean_interval

    line = f"{stage:<34} {seconds:7.1f} s"
    if means is not None:
        values = list(means.values())
        low, high = mean_interval(values)
        line += f"   held-out {sum(values) / len(values):.3f}  [95% CI {low:.3f}, {high:.3f}]"
    print(line, flush=True)


def gain(label: str, before: dict[int, float], after: dict[int, float]) -> PairedDifference:
    from workbench.engine.paired import paired_difference

    result = paired_difference(before, after)
    print(
        f"{label:<34} {result.diff:+.3f}  [95% CI {result.low:+.3f}, {result.high:+.3f}]  ({result.verdict}, "
        f"{result.n} examples)"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--num-examples", type=int, default=64)
    parser.add_argument("-r", "--rollouts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft-set", action="append", default=[], help="--set override for the SFT config")
    parser.add_argument("--rl-set", action="append", default=[], help="--set override for the RL config")
    parser.add_argument(
        "--skip-base", action="store_true", help="skip the pretrained model's eval (it scores 0.000)"
    )
    parser.add_argument(
        "--rl-seeds",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[None],
        help="run stages 4-5 once per seed (comma-separated) from the one SFT run and print the spread of RL's gain",
    )
    args = parser.parse_args()

    from workbench.bootstrap import fetch_smollm2
    from workbench.train import load_train_config, run_train
    from workbench.workspace import SMOLLM2_MODEL_NAME, named_model_dir

    model_dir, _ = fetch_smollm2(REPO if (REPO / "outputs").is_dir() else Path.cwd(), say=print)
    rl_config, _ = load_train_config(RL_CONFIG, [*QUIET, *args.rl_set])
    sampling = sampling_of(rl_config)
    torch_threads = os.environ.get("OMP_NUM_THREADS", "default")
    print(
        f"model {model_dir} · held-out {args.num_examples} examples x {args.rollouts} rollouts · sampling {sampling} "
        f"· OMP_NUM_THREADS {torch_threads} · {os.cpu_count()} CPUs"
    )
    with tempfile.TemporaryDirectory(prefix="workbench-loop-") as tmp:
        workspace = Path(tmp)
        named_model_dir(SMOLLM2_MODEL_NAME, workspace).parent.mkdir(parents=True)
        named_model_dir(SMOLLM2_MODEL_NAME, workspace).symlink_to(model_dir, target_is_directory=True)
        os.chdir(workspace)
        os.environ["WORKBENCH_WORKSPACE"] = str(workspace)
        started = time.perf_counter()

        base = None
        if not args.skip_base:
            clock = time.perf_counter()
            base = held_out(SMOLLM2_MODEL_NAME, args, sampling)
            report("1. eval: pretrained", time.perf_counter() - clock, base)

        clock = time.perf_counter()
        sft_config, _ = load_train_config(SFT_CONFIG, [*QUIET, "eval.interval=0", *args.sft_set])
        sft = run_train(sft_config)
        report(f"2. SFT: {sft_config.max_steps} steps", time.perf_counter() - clock)

        clock = time.perf_counter()
        after_sft = held_out(str(sft.run_dir), args, sampling)
        report("3. eval: SFT checkpoint", time.perf_counter() - clock, after_sft)

        shared = time.perf_counter() - started
        if len(args.rl_seeds) == 1:
            results = [rl_stage(args.rl_seeds[0], sft.run_dir, after_sft, shared, args)]
        else:  # each seed in a fresh process: one process's heap grows run after run (OOM at 22.7 GB, 3rd seed)
            results = []
            for seed in args.rl_seeds:
                with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
                    results.append(
                        child.submit(rl_stage, seed, sft.run_dir, after_sft, shared, args).result()
                    )
        if base is not None:
            print()
            gain("SFT gain over pretrained", base, after_sft)
        if len(results) > 1:
            summarize(results)


def rl_stage(
    seed: int | None, sft_run: Path, after_sft: dict[int, float], shared: float, args: argparse.Namespace
) -> LoopResult:
    """Stages 4 and 5 for one RL seed (None: the config's own), with the targets' verdict."""
    from workbench.train import load_train_config, run_train

    overrides = [*QUIET, "eval.interval=0", f"model='{sft_run}'", *args.rl_set]
    if seed is not None:
        overrides += [f"seed={seed}", f"run_name='reverse-text-smollm2-rl-seed{seed}'"]
    label = "" if seed is None else f" (seed {seed})"
    clock = time.perf_counter()
    rl_config, _ = load_train_config(RL_CONFIG, overrides)
    rl = run_train(rl_config)
    rl_seconds = time.perf_counter() - clock
    report(f"4. RL: {rl_config.max_steps} steps{label}", rl_seconds)

    clock = time.perf_counter()
    after_rl = held_out(str(rl.run_dir), args, sampling_of(rl_config))
    eval_seconds = time.perf_counter() - clock
    report(f"5. eval: RL checkpoint{label}", eval_seconds, after_rl)

    minutes = (shared + rl_seconds + eval_seconds) / 60
    print()
    paired = gain(f"RL gain over its SFT start{label}", after_sft, after_rl)
    final, rl_gain, rl_low = paired.mean_b, paired.diff, paired.low
    met = minutes <= TARGET_MINUTES and final >= TARGET_FINAL and rl_gain >= TARGET_GAIN and rl_low > 0
    print(
        f"loop {minutes:.1f} min (target <= {TARGET_MINUTES:.0f}) · final {final:.3f} (target >= {TARGET_FINAL}) · "
        f"RL gain {rl_gain:+.3f}, CI low {rl_low:+.3f} (target >= +{TARGET_GAIN}, CI above 0) · "
        + ("targets met" if met else "targets NOT met"),
        flush=True,
    )
    return LoopResult(seed, minutes, final, rl_gain, rl_low, met)


def summarize(results: list[LoopResult]) -> None:
    """The spread between seeds: the larger uncertainty, which no single run's interval shows."""
    gains = [r.rl_gain for r in results]
    mean = statistics.fmean(gains)
    print(
        f"\n{len(results)} RL seeds: RL gain mean {mean:+.3f}, sd {statistics.stdev(gains):.3f}, "
        f"min {min(gains):+.3f}, max {max(gains):+.3f} · final reward mean "
        f"{statistics.fmean(r.final for r in results):.3f} · loop {max(r.minutes for r in results):.1f} min at most "
        f"· targets met by {sum(r.met for r in results)} of {len(results)}"
    )
    for r in results:
        print(
            f"  seed {r.seed}: final {r.final:.3f}, RL gain {r.rl_gain:+.3f} (CI low {r.rl_low:+.3f}), {r.minutes:.1f} min"
        )


if __name__ == "__main__":
    main()
