"""TUI: open a workspace with many runs (issue 35: 1,000 runs open in under 1 s).

    python benchmarks/tui_open_workspace.py [--runs 1000] [--repeat 3]

The workspace is written with the project's own writers (`write_run_metadata`, `ResultsWriter`,
the `Rollout` record): 70% evals over the six bundled environments and five models (16 scored
rollouts each, with a summary), 25% training runs (metadata, 20 lines of metrics.jsonl, two
checkpoint folders with manifests) and 5% GEPA runs, so the catalog reads what a real workspace
holds. "Open" is measured the way a user feels it, in a headless app (`App.run_test` at 160x45):
from starting the app until the Runs table lists every run. Printed: each try and the median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks.synthetic_runs import random_text, reverse_text_rollout  # noqa: E402

ENVS = ("reverse-text", "alphabet-sort", "gsm8k", "math-python", "wiki-search", "wordle")
MODELS = ("tiny", "tiny-qwen", "smollm2-135m", "Qwen/Qwen3-0.6B", "outputs/runs/latest")


def stamp(index: int) -> str:
    return f"2026-{1 + index % 12:02d}-{1 + index % 28:02d}T{index % 24:02d}:{index % 60:02d}:00+00:00"


def make_workspace(root: Path, runs: int, seed: int = 0) -> None:
    from workbench.store.results import ResultsWriter
    from workbench.store.runs import EvalRun, GepaRun, TrainRun, write_run_metadata
    from workbench.types import Group
    from workbench.workspace import eval_runs_dir, gepa_runs_dir

    rng = random.Random(seed)
    for index in range(runs):
        env, model = ENVS[index % len(ENVS)], MODELS[index % len(MODELS)]
        run_id = f"2026{index:08d}-{rng.randrange(16**4):04x}"
        share = index % 20
        if share < 14:  # evals
            run_dir = eval_runs_dir(env, model, root) / run_id
            writer = ResultsWriter(run_dir)
            for example_id in range(8):
                text = random_text(rng, 8)
                rollouts = [
                    reverse_text_rollout(example_id, i, text, reward=rng.random(), error=None, rng=rng)
                    for i in range(2)
                ]
                writer.write_group(Group(example_id, rollouts))
            writer.close()
            write_run_metadata(
                run_dir,
                EvalRun(
                    status="finished",
                    run_id=run_id,
                    env_id=env,
                    model=model,
                    created_at=stamp(index),
                    num_examples=8,
                    rollouts_per_example=2,
                    completed_rollouts=16,
                    total_rollouts=16,
                    reward_mean=rng.random(),
                    summary={"reward_mean": 0.5, "reward_std": 0.2, "num_rollouts": 16},
                ),
            )
        elif share < 19:  # training runs
            run_dir = root / "outputs" / "runs" / f"{env}--{model.split('/')[-1]}--{run_id}"
            (run_dir / "checkpoints").mkdir(parents=True)
            for step in (10, 20):
                checkpoint = run_dir / "checkpoints" / f"step_{step:06d}"
                checkpoint.mkdir()
                (checkpoint / "manifest.json").write_text(json.dumps({"step": step, "files": {}}))
            with (run_dir / "metrics.jsonl").open("w") as f:
                for step in range(1, 21):
                    f.write(
                        json.dumps({"step": step, "reward/mean": 0.1 + step / 40, "train/loss": 1 / step})
                        + "\n"
                    )
            write_run_metadata(
                run_dir,
                TrainRun(
                    status="finished",
                    run_id=run_dir.name,
                    env_id=env,
                    env_ids=[env],
                    model=model,
                    created_at=stamp(index),
                    max_steps=20,
                    step=20,
                    reward_mean=rng.random(),
                ),
            )
        else:  # GEPA runs
            run_dir = gepa_runs_dir(env, model, root) / run_id
            run_dir.mkdir(parents=True)
            write_run_metadata(
                run_dir,
                GepaRun(
                    status="finished",
                    run_id=run_id,
                    env_id=env,
                    model=model,
                    created_at=stamp(index),
                    max_calls=200,
                    metric_calls_used=200,
                    best_score=rng.random(),
                ),
            )


async def time_open(root: Path, runs: int) -> float:
    from workbench.tui.app import WorkbenchApp
    from workbench.tui.widgets.runs_table import RunsTable

    started = time.perf_counter()
    app = WorkbenchApp(root, poll_s=60)
    async with app.run_test(size=(160, 45)) as pilot:
        while True:
            tables = app.screen.query(RunsTable)
            if tables and len(tables.first().runs) >= runs:
                break
            await pilot.pause(0.005)
        opened = time.perf_counter() - started
    return opened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "configs").mkdir()
        built = time.perf_counter()
        make_workspace(root, args.runs)
        print(f"workspace: {args.runs:,} runs written in {time.perf_counter() - built:.1f} s")
        times = [asyncio.run(time_open(root, args.runs)) for _ in range(args.repeat)]
    print("open (app start until the Runs table lists every run): " + ", ".join(f"{t:.2f} s" for t in times))
    print(f"median {statistics.median(times):.2f} s (target < 1 s)")


if __name__ == "__main__":
    main()
