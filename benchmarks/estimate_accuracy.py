"""How close `workbench train --dry-run`'s estimate is to what the run takes (issue 35.6).

    python benchmarks/estimate_accuracy.py                      # the README sequence, once
    python benchmarks/estimate_accuracy.py --model-from outputs/models/tiny   # skip the 2-minute build
    python benchmarks/estimate_accuracy.py --calibrate 5 --model-from outputs/models/tiny

In a new temporary workspace, as a user would type it (each command its own process):
`workbench setup` (the tiny model), `workbench eval run reverse-text -m tiny -n 64 -r 2`, the
dry run of `workbench train configs/rl/reverse-text.toml --set max_steps=20` (its estimate line
is printed), the training run itself, then the dry run and the training run again (the second
estimate is made from the first run's measured steps). For each training run: the estimate its
metadata recorded at the start against its actual seconds (from the run's start: the ~2-4 s
Python spends importing torch before that are not in either), the error in %, and the command's
wall time. Target: within +-30%.

`--calibrate N [--set lora.enabled=false]` instead repeats (eval, training) N times in fresh workspaces and prints, per
pair and as medians, the ratios `workbench/train/estimate.py` turns an eval into a training
estimate with (GEN_PER_EVAL_TOKEN and the others): how its constants were measured.

The machine's other load moves every number here: say how busy it was when you quote one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

TRAIN = ["train", "configs/rl/reverse-text.toml", "--set", "max_steps=20"]
EVAL = ["eval", "run", "reverse-text", "-m", "tiny", "-n", "64", "-r", "2"]


def workbench(workspace: Path, args: list[str]) -> tuple[str, float]:
    """Run `workbench ARGS` in the workspace; its output and wall seconds. Exits on failure."""
    env = {**os.environ, "WORKBENCH_WORKSPACE": str(workspace)}
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "workbench", *args], cwd=workspace, env=env, capture_output=True, text=True
    )
    wall = time.monotonic() - began
    if done.returncode != 0:
        sys.exit(f"workbench {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout, wall


def new_workspace(parent: Path, model_from: Path | None) -> Path:
    workspace = Path(tempfile.mkdtemp(prefix="estimate-", dir=parent))
    if model_from is None:
        _, wall = workbench(workspace, ["setup", "."])
        print(f"setup (builds the tiny model): {wall:.0f} s")
    else:
        workbench(workspace, ["setup", ".", "--skip-model"])
        target = workspace / "outputs" / "models" / "tiny"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(model_from.resolve(), target_is_directory=True)
    return workspace


def estimate_line(workspace: Path) -> str:
    out, _ = workbench(workspace, [*TRAIN, "--dry-run"])
    return next(
        (line.split("estimate", 1)[1].strip() for line in out.splitlines() if " estimate " in line), "?"
    )


def train_once(workspace: Path) -> tuple[float, float, float, str]:
    """(estimated s, actual s, command wall s, basis) of one README training run."""
    from workbench.store.runs import TrainRun, read_run_metadata, workspace_runs

    before = set(workspace_runs("train", workspace))
    _, wall = workbench(workspace, TRAIN)
    (run,) = set(workspace_runs("train", workspace)) - before
    meta = read_run_metadata(run, "train")
    assert isinstance(meta, TrainRun) and meta.estimate is not None and meta.estimate.actual_s is not None
    return meta.estimate.seconds, meta.estimate.actual_s, wall, meta.estimate.basis


def readme_sequence(parent: Path, model_from: Path | None) -> None:
    workspace = new_workspace(parent, model_from)
    _, wall = workbench(workspace, EVAL)
    print(f"eval run -n 64 -r 2: {wall:.1f} s")
    for label in ("first training run (estimate from the eval)", "second training run (from the first run)"):
        print(f"dry run: estimate {estimate_line(workspace)}")
        estimated, actual, wall, basis = train_once(workspace)
        error = (estimated - actual) / actual
        verdict = "within" if abs(error) <= 0.30 else "OUTSIDE"
        print(
            f"{label}: estimated {estimated:.1f} s, took {actual:.1f} s (command {wall:.1f} s): "
            f"{error:+.0%} ({verdict} +-30%) · basis: {basis}"
        )
    print(f"load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


def calibrate(parent: Path, model_from: Path | None, pairs: int, overrides: list[str]) -> None:
    from workbench.store.timings import EvalTiming, TrainTiming, read_timings

    ratios: dict[str, list[float]] = {}
    for _ in range(pairs):
        workspace = new_workspace(parent, model_from)
        workbench(workspace, EVAL)
        workbench(workspace, [*TRAIN, *(arg for o in overrides for arg in ("--set", o))])
        timings = read_timings(workspace)
        e = next(t for t in timings if isinstance(t, EvalTiming))
        r = next(t for t in timings if isinstance(t, TrainTiming))
        s = e.seconds_per_token
        found = {
            "GEN_PER_EVAL_TOKEN": r.wait_s / (r.batch_size * e.completion_tokens * s),
            f"TRAIN_PER_EVAL_TOKEN[{r.lora}]": (r.step_s - r.wait_s)
            / (r.batch_size * (e.prompt_tokens + e.completion_tokens) * s),
            "HELD_OUT_PER_EVAL_TOKEN": (r.held_out_s or 0.0)
            / (r.held_out_rollouts * e.completion_tokens * s),
            "STARTUP_S": r.startup_s,
            "BETWEEN_STEPS_S": r.between_steps_s,
            "eval s/token (ms)": s * 1e3,
            "train total s": r.total_s,
        }
        print("  ".join(f"{k} {v:.3g}" for k, v in found.items()))
        for key, value in found.items():
            ratios.setdefault(key, []).append(value)
    print("medians: " + "  ".join(f"{k} {statistics.median(v):.3g}" for k, v in ratios.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-from", type=Path, help="link this tiny model folder instead of building one")
    parser.add_argument(
        "--calibrate", type=int, metavar="N", help="measure the eval-to-training ratios N times"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="--calibrate: override the training config",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary workspaces")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="estimate-accuracy-") as tmp:
        parent = Path(tmp)
        if args.calibrate:
            calibrate(parent, args.model_from, args.calibrate, args.set)
        else:
            readme_sequence(parent, args.model_from)
        if args.keep:
            kept = Path(tempfile.mkdtemp(prefix="estimate-accuracy-kept-"))
            subprocess.run(["cp", "-a", f"{tmp}/.", str(kept)], check=True)
            print(f"workspaces kept in {kept}")


if __name__ == "__main__":
    main()
