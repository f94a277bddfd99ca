"""TUI: open a big eval run in the Rollouts view, scroll it, and how much memory it takes.

    python benchmarks/tui_open_run.py [--examples 1250] [--rollouts 8] [--repeat 3] [--huge 12500]

Targets (issue 16): 10,000 rollouts open in under 0.5 s; scrolling them (the cursor moving
group by group, each step showing that group's first rollout) never takes a frame over 100 ms;
100,000 rollouts open without holding the run in memory (peak RSS is reported).

"Open" is measured the way a user feels it, in a headless app (`App.run_test`): from pushing
the Rollouts screen until the groups table is filled and the first rollout's conversation is
on screen. A "frame" is one key press (`j`) until the app has handled it and redrawn: until
the last screen update it caused was drawn ("redrawn"; the number the target is about), and
until Textual's test pilot finds the app idle ("idle": the same, plus the pilot's idle
detection, which looks in 20 ms slices, so 20-40 ms more; kept to compare with older runs). The run
folder is written with the project's own writers (`ResultsWriter`, `write_run_metadata`, the
`Rollout` record), about 1.5 KB per rollout, so ~15 MB of results.jsonl per 10,000. The
100,000-rollout open runs in a child process, so its peak RSS is the viewer's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks.synthetic_runs import random_text, reverse_text_rollout  # noqa: E402

HELD_KEYS = 60  # cursor steps of the held-key run
SETTLE_MS = 60  # workbench.tui.screens.rollouts.SETTLE_S: the conversation waits for the keys to pause


def make_big_run(root: Path, num_examples: int = 1250, rollouts: int = 8, seed: int = 0) -> Path:
    """An eval run folder under `root` with num_examples x rollouts scored rollouts."""
    from workbench.store.results import ResultsWriter
    from workbench.store.runs import EvalRun, write_run_metadata
    from workbench.types import Group, RolloutError

    rng = random.Random(seed)
    run_dir = (
        root
        / "environments"
        / "reverse_text"
        / "outputs"
        / "evals"
        / "reverse-text--big"
        / "20260102-030405-big0"
    )
    writer = ResultsWriter(run_dir)
    for example_id in range(num_examples):
        text = random_text(rng)
        group = []
        for index in range(rollouts):
            reward = rng.random()
            error = RolloutError("InferenceError", "rejected") if rng.random() < 0.02 else None
            group.append(reverse_text_rollout(example_id, index, text, reward=reward, error=error, rng=rng))
        writer.write_group(Group(example_id, group))
    writer.close()
    total = num_examples * rollouts
    write_run_metadata(
        run_dir,
        EvalRun(
            status="finished",
            run_id=run_dir.name,
            env_id="reverse-text",
            model="big",
            created_at="2026-01-02T03:04:05+00:00",
            completed_rollouts=total,
            total_rollouts=total,
            reward_mean=0.5,
        ),
    )
    return run_dir


def record_draws(app: Any) -> list[float]:
    """perf_counter() at the end of each screen update the app draws (appended as they happen)."""
    draws: list[float] = []
    display = app._display  # the one place every screen update goes through, headless or not

    def timed(screen: Any, renderable: Any) -> None:
        display(screen, renderable)
        if renderable is not None:  # None: nothing was dirty
            draws.append(time.perf_counter())

    app._display = timed
    return draws


async def time_open(root: Path, run_dir: Path, scroll: int = 0) -> tuple[float, list[float], list[float]]:
    """Seconds to open the run; the seconds of each of `scroll` cursor steps after it until the
    app is idle (then, last, of the held key's steps and of the draw of the conversation where
    the cursor stopped); and the seconds of each step until its last screen update was drawn."""
    from workbench.tui.app import WorkbenchApp
    from workbench.tui.data.runs import RunCatalog
    from workbench.tui.screens.rollouts import RolloutsScreen

    run = RunCatalog(root).scan()[0]
    app = WorkbenchApp(root, poll_s=60)
    draws = record_draws(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        started = time.perf_counter()
        screen = RolloutsScreen(run_dir / "results.jsonl", run=run)
        app.push_screen(screen)
        while not (screen.loaded and screen.rollout is not None):
            await asyncio.sleep(0.005)
        await pilot.pause()  # one more frame: the conversation is laid out
        opened = time.perf_counter() - started
        frames, redrawn = [], []
        from textual import events

        from workbench.tui.widgets.conversation import ConversationView
        from workbench.tui.widgets.groups_table import GroupsTable

        table = screen.query_one(GroupsTable)
        for _ in range(scroll):
            # One key, as a terminal delivers it (Pilot.press adds ~80 ms of its own waiting), until
            # it is handled, the conversation updated and the app idle again.
            before, row = time.perf_counter(), table.cursor_row
            app.post_message(events.Key("j", "j"))
            while table.cursor_row == row:
                await asyncio.sleep(0.0005)
            await pilot.pause()
            frames.append(time.perf_counter() - before)
            redrawn.append(max((t for t in draws if t > before), default=before) - before)
            await asyncio.sleep(SETTLE_MS / 1000 + 0.01)  # spaced presses: each one draws its conversation
        if scroll:
            # A held key: the terminal repeats it (~30 Hz) whatever the app is doing, so the events
            # queue up while a frame is slow. Post them all at once, then time until all are handled.
            target = table.cursor_row + HELD_KEYS
            before = time.perf_counter()
            for _ in range(HELD_KEYS):
                app.post_message(events.Key("j", "j"))
            while table.cursor_row < target:
                await asyncio.sleep(0.001)
            frames.append((time.perf_counter() - before) / HELD_KEYS)

            view = screen.query_one(ConversationView)
            before = time.perf_counter()
            while view.rollout is not screen.rollout:  # drawn once the keys pause (rollouts.SETTLE_S)
                await asyncio.sleep(0.001)
            await pilot.pause()
            frames.append(time.perf_counter() - before)
        return opened, frames, redrawn


def open_huge(root: str, run_dir: str) -> None:
    """Child process: open the run, then print open seconds and peak RSS (MB) as JSON."""
    os.environ["WORKBENCH_WORKSPACE"] = root
    opened, _, _ = asyncio.run(time_open(Path(root), Path(run_dir)))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"open_s": opened, "peak_rss_mb": peak_mb}))


def baseline_rss() -> float:
    """Peak RSS (MB) of a child that only imports and starts the TUI on an empty workspace."""
    code = (
        "import asyncio, resource, tempfile; from pathlib import Path; from workbench.tui.app import WorkbenchApp\n"
        "async def go():\n    async with WorkbenchApp(Path(tempfile.mkdtemp()), poll_s=60).run_test(size=(120, 40)) as p:\n"
        "        await p.pause(0.2)\nasyncio.run(go()); print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
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


def spread(seconds: list[float]) -> str:
    """Median, p95 and max of sorted durations, in ms."""
    p95 = seconds[min(len(seconds) - 1, int(len(seconds) * 0.95))]
    return f"median {statistics.median(seconds) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {seconds[-1] * 1000:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1250)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scroll", type=int, default=200, help="cursor steps timed after opening")
    parser.add_argument(
        "--huge", type=int, default=12500, help="examples of the big run (x --rollouts); 0 skips it"
    )
    parser.add_argument("--open-huge", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.open_huge:
        open_huge(*args.open_huge)
        return
    from workbench.tui.data.rollout_index import RolloutIndex

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        os.environ["WORKBENCH_WORKSPACE"] = str(root)
        run_dir = make_big_run(root, args.examples, args.rollouts)
        size_mb = (run_dir / "results.jsonl").stat().st_size / 1e6
        started = time.perf_counter()
        index = RolloutIndex(run_dir / "results.jsonl")
        index.refresh()
        index.groups()
        index_s = time.perf_counter() - started
        runs = [
            asyncio.run(time_open(root, run_dir, args.scroll if i == 0 else 0)) for i in range(args.repeat)
        ]
        opens = [opened for opened, _, _ in runs]
        frames = sorted(runs[0][1][:-2]) if args.scroll else []
        redrawn = sorted(runs[0][2])
        held, settle = runs[0][1][-2:] if args.scroll else (None, None)
        total = args.examples * args.rollouts
        print(f"run: {total:,} rollouts in {args.examples:,} groups, results.jsonl {size_mb:.1f} MB")
        print(f"index (offsets + numbers per rollout + groups): {index_s:.3f} s")
        print(
            f"open in the Rollouts view: median {statistics.median(opens):.3f} s "
            f"(runs: {', '.join(f'{t:.3f}' for t in opens)}; target < 0.5 s)"
        )
        if frames:
            print(
                f"scrolling {len(frames)} groups, spaced single steps until redrawn: {spread(redrawn)} "
                f"(target: none over 100 ms); until idle: {spread(frames)}"
            )
            print(
                f"the conversation where a held key stopped drawn {settle * 1000:.0f} ms later "
                f"(incl. the {SETTLE_MS} ms pause)"
            )
            print(f"a held key ({HELD_KEYS} repeats queued at once): {held * 1000:.0f} ms per step")
        if args.huge:
            huge_root = Path(tmp) / "huge"
            huge_dir = make_big_run(huge_root, args.huge, args.rollouts, seed=1)
            huge_mb = (huge_dir / "results.jsonl").stat().st_size / 1e6
            out = subprocess.run(
                [sys.executable, __file__, "--open-huge", str(huge_root), str(huge_dir)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            result = json.loads(out.strip().splitlines()[-1])
            base = baseline_rss()
            print(
                f"big run: {args.huge * args.rollouts:,} rollouts, results.jsonl {huge_mb:.0f} MB: opened in "
                f"{result['open_s']:.2f} s, peak RSS {result['peak_rss_mb']:.0f} MB "
                f"(the TUI alone on an empty workspace: {base:.0f} MB)"
            )


if __name__ == "__main__":
    main()
