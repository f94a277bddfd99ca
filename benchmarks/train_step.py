"""Training step throughput: Workbench's RL step against TRL's GRPOTrainer on the same model,
batch and machine, LoRA and full fine-tuning, in one run.

    python benchmarks/train_step.py [--steps 4] [--modes lora,full] [--threads 1] [--no-trl] [--verbose]
    python benchmarks/train_step.py --model outputs/models/smollm2-135m --modes lora --batch-size 16 \
        --set rollouts_per_example=4 --set sampling.max_tokens=32 --set lora.r=8 --set lora.alpha=16 \
        --set "lora.target_modules=['q_proj','k_proj','v_proj','o_proj']"    # the real model (issue 31's shape)

`--set` overrides apply to both systems (TRL reads the keys it has a counterpart for); Workbench
settings without one apply to Workbench alone. `optimization_dtype='bfloat16'` has one: TRL then
loads the model in bf16 and trains with bf16=True (see trl_grpo.py).

Workbench runs `configs/rl/reverse-text.toml` (colocated on the CPU; full fine-tuning is the
same config with lora.enabled = false) in a temporary folder; TRL runs the same step through
`benchmarks/trl_grpo.py` (see its docstring for how each setting is matched). TRL is an
optional benchmark dependency (`pip install -e ".[bench]"`); without it only Workbench's
numbers are printed. Needs the tiny model (`workbench setup`).

Each system runs in its own process, loaded once; the driver starts their steps one at a time,
alternating Workbench and TRL (and which goes first) step by step, so a busy machine slows
both alike. The first step of each is a warm-up and is not counted. Printed per mode: s/step,
samples/s, the step split into generation, forward/backward, optimizer and everything else
(target for Workbench: everything else under 10%), mean completion length and reward (the
work per step depends on them), the ratio Workbench/TRL (acceptance: >= 3x on the tiny model, >= 2x on smollm2-135m: --target), and the load
average while it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PROTOCOL = "@@bench "
INSTALL_HINT = 'pip install -e ".[bench]"'
PARTS = ("generation", "forward/backward", "optimizer", "other")
READY_TIMEOUT_S = 1800.0
STEP_TIMEOUT_S = 1800.0


# ----- the Workbench worker (a child process) ---------------------------------------------


def emit(event: str, **data: Any) -> None:
    print(PROTOCOL + json.dumps({"event": event, **data}), flush=True)


class PacedReporter:
    """A Workbench Reporter that reports each step on stdout and waits for a stdin line before
    starting the next (and before the first): outside the step's own timing."""

    def __init__(self, mode: str, batch_size: int, paced: bool) -> None:
        self.mode, self.batch_size, self.paced = mode, batch_size, paced
        self.total = 0

    def _wait(self) -> None:
        if self.paced and not sys.stdin.readline():
            raise SystemExit(1)  # the driver went away

    def start(self, label: str, total: int, done: int) -> None:
        import torch

        self.total = total
        emit(
            "ready",
            system="workbench",
            mode=self.mode,
            threads=torch.get_num_threads(),
            batch=self.batch_size,
        )
        self._wait()

    def group_done(self, group: Any, stats: dict[str, Any]) -> None:
        pass

    def step_done(self, step: int, metrics: dict[str, Any]) -> None:
        def get(key: str) -> float:
            return float(metrics.get(key, 0.0) or 0.0)

        emit(
            "step",
            step=step,
            **{
                "time/step": get("time/step"),
                "generation": get("rollout/generation_time"),
                "forward/backward": get("time/forward_backward"),
                "optimizer": get("time/optimizer"),
                "other": get("time/other"),
                "tokens_per_s": get("perf/tokens_per_s"),
                "mean_length": get("rollout/mean_length"),
                "reward": get("reward/mean"),
                "lr": get("train/learning_rate"),
                "trained_samples": get("rollout/trained_samples"),
            },
        )
        if step < self.total:
            self._wait()

    def message(self, text: str) -> None:
        print(text, flush=True)

    def finish(self) -> None:
        pass


def workbench_overrides(
    mode: str, steps: int, batch_size: int, model: str, output_dir: str, extra: list[str] | None = None
) -> list[str]:
    overrides = [
        f"max_steps={steps + 1}",
        f"batch_size={batch_size}",
        f"micro_batch_size={min(64, batch_size)}",  # the config's 64, or the whole of a smaller batch
        f"model='{model}'",
        "eval.interval=0",
        "checkpointing.save_every_n_steps=1000",
        'wandb.mode="disabled"',
        f"output_dir='{output_dir}'",
        *(extra or []),
    ]
    if mode == "full":
        overrides.append("lora.enabled=false")
    return overrides


def workbench_worker(args: argparse.Namespace) -> None:
    from workbench.train import run_train
    from workbench.train.config import load_train_config

    with tempfile.TemporaryDirectory() as tmp:
        config, _ = load_train_config(
            REPO / "configs" / "rl" / "reverse-text.toml",
            workbench_overrides(args.mode, args.steps, args.batch_size, args.model, f"{tmp}/run", args.set),
        )
        run_train(config, PacedReporter(args.mode, args.batch_size, paced=True))
    emit("exit")


# ----- the driver ---------------------------------------------------------------------------


class WorkerFailed(RuntimeError):
    pass


class Worker:
    """A child process that prints `@@bench {...}` events and starts a step per stdin line."""

    def __init__(self, name: str, command: list[str], threads: int | None = None) -> None:
        self.name = name
        env = {
            **os.environ,
            "WORKBENCH_WORKSPACE": str(REPO),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "WANDB_MODE": "disabled",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
        if threads:  # torch's intra-op threads (it reads OMP_NUM_THREADS when it starts)
            env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
        self.process = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.tail: deque[str] = deque(maxlen=40)
        self.ready: dict[str, Any] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(PROTOCOL):
                self.events.put(json.loads(line[len(PROTOCOL) :]))
            else:
                self.tail.append(line.rstrip("\n"))
        self.events.put(None)  # end of output: the process ended

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            raise WorkerFailed(f"{self.name}: no '{event}' within {timeout:.0f} s") from None
        if item is None:
            self.process.wait()
            raise WorkerFailed(f"{self.name} exited ({self.process.returncode}) before '{event}'")
        if item.get("event") != event:
            raise WorkerFailed(f"{self.name}: {item.get('message') or item}")
        return item

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def wait_exit(self, timeout: float = 600.0) -> None:
        """Let it finish its teardown (Workbench's final checkpoint) before anything else runs."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def explain(self) -> str:
        return "\n".join(f"    | {line}" for line in list(self.tail)[-15:])


def drive_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both systems' steps in `mode`, alternated; returns their measured steps and the load."""
    common = [
        "--mode",
        mode,
        "--steps",
        str(args.steps),
        "--batch-size",
        str(args.batch_size),
        "--model",
        args.model,
        *(f"--set={item}" for item in args.set),
    ]
    workers = [
        Worker(
            "workbench", [sys.executable, str(Path(__file__).resolve()), "--worker", *common], args.threads
        )
    ]
    notes: list[str] = []
    if args.trl:
        workers.append(
            Worker(
                "trl",
                [sys.executable, str(REPO / "benchmarks" / "trl_grpo.py"), "--paced", *common],
                args.threads,
            )
        )
    results: dict[str, Any] = {"mode": mode, "steps": {}, "ready": {}, "notes": notes}
    try:
        live = []
        for worker in workers:  # both load while neither is timed
            try:
                worker.ready = worker.expect("ready", READY_TIMEOUT_S)
                live.append(worker)
                results["ready"][worker.name] = worker.ready
            except WorkerFailed as exc:
                if worker.name == "workbench":
                    raise WorkerFailed(f"{exc}\n{worker.explain()}") from exc
                notes.append(
                    f"TRL left out: {exc}" + ("" if "not installed" in str(exc) else f"\n{worker.explain()}")
                )
                worker.stop()
        load_before = os.getloadavg()
        started = time.perf_counter()
        for index in range(args.steps + 1):  # index 0: the warm-up
            order = live if index % 2 == 0 else live[::-1]
            for worker in list(order):
                worker.go()
                try:
                    step = worker.expect("step", STEP_TIMEOUT_S)
                except WorkerFailed as exc:
                    if worker.name == "workbench":
                        raise WorkerFailed(f"{exc}\n{worker.explain()}") from exc
                    notes.append(f"TRL stopped: {exc}\n{worker.explain()}")
                    live.remove(worker)
                    worker.stop()
                    continue
                if index > 0:
                    results["steps"].setdefault(worker.name, []).append(step)
                if index == args.steps:
                    worker.wait_exit()
                if args.verbose:
                    print(
                        f"  [{mode}] {worker.name} step {index}{' (warm-up)' if index == 0 else ''}: "
                        f"{step['time/step']:.2f} s, lr {step.get('lr', float('nan')):.2g}, "
                        f"{step['mean_length']:.1f} tokens/completion",
                        flush=True,
                    )
        results["load"] = (load_before, os.getloadavg())
        results["wall_s"] = time.perf_counter() - started
    finally:
        for worker in workers:
            worker.stop()
    return results


def summarize(steps: list[dict[str, Any]], batch_size: int) -> dict[str, float]:
    step_s = statistics.fmean(s["time/step"] for s in steps)
    out = {
        "steps": len(steps),
        "time/step": step_s,
        "samples_per_s": batch_size / step_s,
        "mean_length": statistics.fmean(s["mean_length"] for s in steps),
        "reward": statistics.fmean(s["reward"] for s in steps),
    }
    for part in PARTS:
        out[part] = statistics.fmean(s[part] for s in steps)
    if "tokens_per_s" in steps[0]:
        out["tokens_per_s"] = statistics.fmean(s["tokens_per_s"] for s in steps)
    return out


def print_workbench_split(mode: str, wb: dict[str, float], batch_size: int, model: str) -> None:
    step_s = wb["time/step"]
    print(
        f"train step on {Path(model).name} ({mode}): {step_s:.2f} s/step, {batch_size / step_s:.1f} samples/s, "
        f"{wb.get('tokens_per_s', 0.0):,.0f} tokens/s ({wb['steps']} steps, batch {batch_size})"
    )
    names = {
        "generation": "generation",
        "forward/backward": "forward/backward",
        "optimizer": "optimizer",
        "other": "everything else",
    }
    for part in PARTS:
        print(f"  {names[part]:<17} {wb[part]:6.3f} s  {100 * wb[part] / step_s:5.1f}%")
    print(f"everything else: {100 * wb['other'] / step_s:.1f}% of the step (target < 10%)")


def print_table(
    results: list[dict[str, Any]], batch_size: int, trl_version: str | None, target: float
) -> None:
    header = (
        f"{'system':<20} {'mode':<5} {'s/step':>7} {'samples/s':>9}  {'gen':>6} {'fwd/bwd':>7} {'optim':>6} "
        f"{'other':>6}  {'len':>5} {'reward':>6}"
    )
    print("\n" + header)
    print("-" * len(header))
    for result in results:
        mode = result["mode"]
        for name, steps in sorted(result["steps"].items(), key=lambda item: item[0] != "workbench"):
            s = summarize(steps, batch_size)
            label = "Workbench" if name == "workbench" else f"TRL {trl_version or ''} GRPO".strip()
            shares = [f"{100 * s[part] / s['time/step']:.0f}%" for part in PARTS]
            split = " ".join(f"{share:>{width}}" for share, width in zip(shares, (6, 7, 6, 6), strict=True))
            print(
                f"{label:<20} {mode:<5} {s['time/step']:7.2f} {s['samples_per_s']:9.1f}  {split}"
                f"  {s['mean_length']:5.1f} {s['reward']:6.3f}"
            )
    print(
        "(gen, fwd/bwd, optim, other: shares of the step; len: mean completion tokens; reward: mean over the batch)"
    )
    for result in results:
        wb, trl = result["steps"].get("workbench"), result["steps"].get("trl")
        (l1, l5, _), (e1, e5, _) = result["load"]
        if wb and trl:
            ratio = summarize(wb, batch_size)["samples_per_s"] / summarize(trl, batch_size)["samples_per_s"]
            pairs = sorted(t["time/step"] / w["time/step"] for w, t in zip(wb, trl, strict=False))
            print(
                f"{result['mode']}: Workbench/TRL samples/s = {ratio:.2f}x (per alternated step: "
                f"{pairs[0]:.2f}..{pairs[-1]:.2f}x, median {statistics.median(pairs):.2f}x; target >= {target:g}x); "
                f"load average {l1:.1f}/{l5:.1f} -> {e1:.1f}/{e5:.1f} (1/5 min, {os.cpu_count()} cores)"
            )
        else:
            print(
                f"{result['mode']}: load average {l1:.1f}/{l5:.1f} -> {e1:.1f}/{e5:.1f} (1/5 min, {os.cpu_count()} cores)"
            )
        threads = {name: ready.get("threads") for name, ready in result["ready"].items()}
        if len(set(threads.values())) > 1:
            print(f"  note: torch threads differ: {threads}")
        else:
            print(
                f"  torch threads: {next(iter(threads.values()), '?')} each, measured wall time {result['wall_s']:.0f} s"
            )
        if (
            wb
            and trl
            and threads.get("trl") != 1
            and max(result["load"][0][0], result["load"][1][0]) > (os.cpu_count() or 1)
        ):
            print(
                "  caution: more runnable jobs than cores with multi-threaded torch: OpenMP stalls slow TRL's many small "
                "ops far more than Workbench's, so this ratio overstates the difference; compare with --threads 1"
            )


def trl_installed() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", type=int, default=4, help="measured steps per system and mode (after one warm-up)"
    )
    parser.add_argument("--modes", default="lora,full", help="comma-separated: lora, full")
    parser.add_argument("--batch-size", type=int, default=128, help="completions per optimizer step")
    parser.add_argument("--model", default=str(REPO / "outputs" / "models" / "tiny"))
    parser.add_argument(
        "--target", type=float, default=3.0, help="the Workbench/TRL ratio to reach (2 for smollm2-135m)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for both systems (e.g. rollouts_per_example=4, sampling.max_tokens=32, "
        "lora.r=8); TRL reads the keys it has a counterpart for",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for both systems (OMP_NUM_THREADS; default: torch's, one per core). "
        "On a machine shared with other jobs, 1 avoids OpenMP threads waiting on each other",
    )
    parser.add_argument("--no-trl", dest="trl", action="store_false", help="Workbench only")
    parser.add_argument("--verbose", action="store_true", help="print each step as it finishes")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=["lora", "full"], default="lora", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        workbench_worker(args)
        return
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if bad := [m for m in modes if m not in ("lora", "full")]:
        parser.error(f"unknown mode(s) {bad}: use lora, full")
    if not (Path(args.model) / "config.json").exists():
        raise SystemExit(f"no model at {args.model}: run `workbench setup` first")
    version = trl_installed() if args.trl else None
    if args.trl and version is None:
        print(
            f"TRL is not installed, so only Workbench's numbers follow. For the comparison: {INSTALL_HINT}\n"
        )
        args.trl = False

    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > cores and not args.threads:
        print(
            f"note: the machine is busy (load average {load:.1f} on {cores} cores). Multi-threaded torch stalls "
            f"when its threads wait on each other, and not by the same amount in both systems; --threads 1 "
            f"measures them without that."
        )
    results = []
    for mode in modes:
        print(
            f"running {mode}: Workbench{' and TRL ' + version if args.trl else ''}, 1 warm-up + {args.steps} steps "
            f"each, batch {args.batch_size} ...",
            flush=True,
        )
        result = drive_mode(mode, args)
        for note in result["notes"]:
            print(note)
        results.append(result)
        print_workbench_split(
            mode, summarize(result["steps"]["workbench"], args.batch_size), args.batch_size, args.model
        )
    print_table(results, args.batch_size, version, args.target)


if __name__ == "__main__":
    main()
