"""TUI: time to open an eval run with 10,000 rollouts in the Rollouts view. Target: under 1 s.

    python benchmarks/tui_open_run.py [--examples 1250] [--rollouts 8] [--repeat 3]

"Open" is measured the way a user feels it, in a headless app (`App.run_test`): from pushing
the Rollouts screen until the groups table is filled and the first rollout's conversation is
on screen. The run folder is written with the project's own writers (`ResultsWriter`,
`write_metadata`, the `Rollout` record), about 1.5 KB per rollout, so ~15 MB of results.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

WORDS = "apple river stone cloud green quiet light table paper music bread water night house".split()


def make_big_run(root: Path, num_examples: int = 1250, rollouts: int = 8, seed: int = 0) -> Path:
    """An eval run folder under `root` with num_examples x rollouts scored rollouts."""
    from workbench.store.results import ResultsWriter
    from workbench.store.runs import EvalRun, write_run_metadata
    from workbench.types import Group, Rollout, RolloutError

    rng = random.Random(seed)
    run_dir = root / "environments" / "reverse_text" / "outputs" / "evals" / "reverse-text--big" / "20260102-030405-big0"
    writer = ResultsWriter(run_dir)
    for example_id in range(num_examples):
        text = " ".join(rng.choice(WORDS) for _ in range(30))
        group = []
        for index in range(rollouts):
            reward = rng.random()
            group.append(Rollout(
                example_id, index,
                prompt=[{"role": "system", "content": "Reverse the text character by character. " * 4},
                        {"role": "user", "content": text}],
                completion=[{"role": "assistant", "content": f"<reversed_text>{text[::-1]}</reversed_text>"}],
                answer=text[::-1], reward=reward, rewards={"lcs_reward": reward}, metrics={"format_reward": 1.0},
                num_turns=1, is_truncated=rng.random() < 0.05, stop_condition="completed",
                error=RolloutError("InferenceError", "rejected") if rng.random() < 0.02 else None,
                usage={"prompt_tokens": 250, "completion_tokens": 200}, timing={"total_ms": 12.5}))
        writer.write_group(Group(example_id, group))
    writer.close()
    total = num_examples * rollouts
    write_run_metadata(run_dir, EvalRun(status="finished", run_id=run_dir.name, env_id="reverse-text", model="big",
                                        created_at="2026-01-02T03:04:05+00:00", completed_rollouts=total,
                                        total_rollouts=total, reward_mean=0.5))
    return run_dir


async def time_open(root: Path, run_dir: Path) -> float:
    from workbench.tui.app import WorkbenchApp
    from workbench.tui.data.runs import RunCatalog
    from workbench.tui.screens.rollouts import RolloutsScreen

    run = RunCatalog(root).scan()[0]
    app = WorkbenchApp(root, poll_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        started = time.perf_counter()
        screen = RolloutsScreen(run_dir / "results.jsonl", run=run)
        app.push_screen(screen)
        while not (screen.loaded and screen.rollout is not None):
            await asyncio.sleep(0.005)
        await pilot.pause()  # one more frame: the conversation is laid out
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1250)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from workbench.tui.data.rollout_index import RolloutIndex

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["WORKBENCH_WORKSPACE"] = str(root)
        run_dir = make_big_run(root, args.examples, args.rollouts)
        size_mb = (run_dir / "results.jsonl").stat().st_size / 1e6
        started = time.perf_counter()
        index = RolloutIndex(run_dir / "results.jsonl")
        index.refresh()
        index.groups()
        index_s = time.perf_counter() - started
        opens = [asyncio.run(time_open(root, run_dir)) for _ in range(args.repeat)]
    total = args.examples * args.rollouts
    print(f"run: {total:,} rollouts in {args.examples:,} groups, results.jsonl {size_mb:.1f} MB")
    print(f"index (offsets + light rollouts + groups): {index_s:.3f} s")
    print(f"open in the Rollouts view: median {statistics.median(opens):.3f} s "
          f"(runs: {', '.join(f'{t:.3f}' for t in opens)}; target < 1 s)")


if __name__ == "__main__":
    main()
