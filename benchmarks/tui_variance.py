"""TUI: build the Reward variance report of a big eval run, the old way and the new way.

    python benchmarks/tui_variance.py [--examples 12500] [--rollouts 8] [--repeat 3]

The old way (`variance_report(index.load_groups())`) reads every record back from disk and
builds every `Rollout` to compute per-group numbers; the new way (`index_variance_report`) uses
the numbers the rollout index already keeps (a `GroupRow` per example, a reward and flags per
line), so no record is parsed after indexing. Both start from an indexed file (what the Rollouts
screen already holds when Variance opens, `v`); the index build is timed apart.

The run is synthetic: 12,500 groups x 8 rollouts = 100,000 by default, written with the
project's own writer and records (`ResultsWriter`, `Rollout`), about 1.5 KB a rollout, with
zero-variance groups, groups in range, errored rewards and ~1% of groups a server failure
spoiled. Each way runs in a fresh child process, so its peak RSS is its own; a second child per
way measures the peak of Python allocations (tracemalloc, which slows it down, so it is not
timed). Both ways must give the same numbers; the script checks it.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks.synthetic_runs import random_text, reverse_text_rollout  # noqa: E402


def make_results(run_dir: Path, num_examples: int, rollouts: int, seed: int = 0) -> Path:
    """results.jsonl with num_examples x rollouts scored rollouts of varied groups."""
    from workbench.store.results import ResultsWriter
    from workbench.types import Group, RolloutError

    rng = random.Random(seed)
    writer = ResultsWriter(run_dir)
    for example_id in range(num_examples):
        text = random_text(rng)
        kind = rng.random()
        server_failed = rng.random() < 0.01
        group = []
        for index in range(rollouts):
            if kind < 0.25:
                reward = 1.0  # too easy: every rollout right
            elif kind < 0.4:
                reward = 0.0  # too hard
            else:
                reward = rng.random()
            error = None
            if server_failed and index == rollouts - 1:
                error = RolloutError("InferenceError", "503 after retries", "inference", infrastructure=True)
                reward = 0.0
            elif rng.random() < 0.02:
                error, reward = RolloutError("ValueError", "reward function raised", "reward"), 0.0
            group.append(reverse_text_rollout(example_id, index, text, reward=reward, error=error, rng=rng))
        writer.write_group(Group(example_id, group))
    writer.close()
    return run_dir / "results.jsonl"


def measure(way: str, path: Path, traced: bool) -> dict:
    """Child process: index the file, build the report `way` ('old' | 'new'); times, peak memory
    and the numbers the screen shows."""
    from workbench.tui.data.rollout_index import RolloutIndex
    from workbench.tui.data.variance import difficulty, index_variance_report, variance_report

    if traced:
        tracemalloc.start()
    started = time.perf_counter()
    index = RolloutIndex(path)
    index.refresh()
    index.groups()
    index_s = time.perf_counter() - started
    if traced:
        held, index_peak = tracemalloc.get_traced_memory()  # what the index holds; its peak building
        tracemalloc.reset_peak()
    started = time.perf_counter()
    report = variance_report(index.load_groups()) if way == "old" else index_variance_report(index)
    report_s = time.perf_counter() - started
    result = {
        "index_s": index_s,
        "report_s": report_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if traced:
        result["index_traced_mb"] = index_peak / 2**20
        result["index_held_mb"] = held / 2**20
        result["report_traced_mb"] = (tracemalloc.get_traced_memory()[1] - held) / 2**20  # above the index
        tracemalloc.stop()
    result["shown"] = {
        "histogram": report.histogram,
        "counts": report.counts,
        "shares": report.shares,
        "summary": {
            k: report.summary.get(k)
            for k in (
                "reward_mean",
                "zero_variance_frac",
                "verdict",
                "num_groups",
                "num_rollouts",
                "incomplete_groups",
            )
        },
        "table": [(g.example_id, g.mean, g.std, difficulty(g)) for g in report.by_variance],
    }
    return result


def child(way: str, path: Path, traced: bool = False) -> dict:
    args = [sys.executable, __file__, "--measure", way, str(path)] + (["--traced"] if traced else [])
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def baseline_rss() -> float:
    """Peak RSS (MB) of a child that only imports what the measuring child imports."""
    code = (
        "import resource; import workbench.tui.data.variance, workbench.tui.data.rollout_index\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    return float(
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        .stdout.strip()
        .splitlines()[-1]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=12500)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each way (median reported)")
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], Path(args.measure[1]), args.traced)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        path = make_results(Path(tmp), args.examples, args.rollouts)
        size_mb = path.stat().st_size / 1e6
        print(
            f"run: {args.examples * args.rollouts:,} rollouts in {args.examples:,} groups, "
            f"results.jsonl {size_mb:.0f} MB (written in {time.perf_counter() - started:.1f} s)"
        )
        base = baseline_rss()
        results = {}
        for way in ("old", "new"):
            timed = [child(way, path) for _ in range(args.repeat)]
            traced = child(way, path, traced=True)
            results[way] = (timed, traced)
        same = results["old"][0][0]["shown"] == results["new"][0][0]["shown"]
        for way, label in (
            ("old", "old: variance_report(index.load_groups())"),
            ("new", "new: index_variance_report(index)"),
        ):
            timed, traced = results[way]
            report_s = statistics.median(r["report_s"] for r in timed)
            index_s = statistics.median(r["index_s"] for r in timed)
            rss = max(r["peak_rss_mb"] for r in timed)
            runs = ", ".join(f"{r['report_s']:.3f}" for r in timed)
            print(
                f"{label}\n    report {report_s:.3f} s (runs: {runs})"
                f"; index first {index_s:.3f} s; index + report {index_s + report_s:.3f} s\n"
                f"    peak RSS {rss:.0f} MB (imports alone {base:.0f} MB); traced Python allocations: "
                f"peak {traced['report_traced_mb']:.2f} MB building the report, over the index's "
                f"{traced['index_held_mb']:.1f} MB (peak {traced['index_traced_mb']:.1f} MB building it)"
            )
        old_s = statistics.median(r["report_s"] for r in results["old"][0])
        new_s = statistics.median(r["report_s"] for r in results["new"][0])
        print(
            f"report {old_s / new_s:.0f}x faster; the same numbers shown (histogram, shares, summary, table): "
            f"{'yes' if same else 'NO'}"
        )
        if not same:
            sys.exit(1)


if __name__ == "__main__":
    main()
