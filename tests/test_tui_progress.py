"""What a run is doing, said where the user looks (issue 35.6, 35.7, 35.10): the training monitor
names the baseline eval that runs before step 1 and its header's rewards are the chart's last
points; the Checkpoints view shows each checkpoint's save time from its manifest and, while a
sweep runs, `queued`, a running eval's progress, then the reward, on that checkpoint's row."""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path

from tests.tui_data import keepalive_pid, make_train_run, text_of, wait_for
from workbench.store.checkpoints import MANIFEST, write_manifest
from workbench.tui.app import WorkbenchApp
from workbench.tui.launcher import Launcher, LaunchSpec
from workbench.tui.screens.checkpoints import CheckpointsScreen
from workbench.tui.screens.monitor import TrainMonitorScreen
from workbench.tui.widgets.metric_plot import MetricPlot
from workbench.tui.widgets.runs_table import RunsTable
from workbench.tui.widgets.virtual_table import VirtualTable

SIZE = (100, 30)


async def open_run(pilot, app: WorkbenchApp, key: str):
    table = app.screen.query_one(RunsTable)
    await wait_for(pilot, lambda: len(table.runs) == 1)
    await pilot.press(key)
    await pilot.pause()
    return app.screen


def append_metrics(run: Path, record: dict) -> None:
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")


async def test_the_monitor_names_the_baseline_eval_and_its_rewards_match_the_chart(workspace: Path):
    run = make_train_run(workspace, steps=1)
    (run / "metrics.jsonl").write_text("")  # the run has just started: no step logged yet
    meta = json.loads((run / "metadata.json").read_text())
    meta.update(step=0, reward_mean=None, config={"mode": "rl", "eval": {"interval": 2, "num_examples": 8}})
    (run / "metadata.json").write_text(json.dumps(meta))
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        monitor = await open_run(pilot, app, "enter")
        assert isinstance(monitor, TrainMonitorScreen)
        banner = monitor.query_one("#monitor-phase")
        await wait_for(pilot, lambda: banner.display)
        assert "measuring the starting model on 8 held-out examples" in text_of(banner)
        assert "baseline eval" in text_of(monitor.query_one("#monitor-eta"))

        append_metrics(run, {"step": 0, "eval/reward_mean": 0.0637})  # the baseline, logged at step 0
        title = monitor.query_one("#monitor-title")
        await wait_for(pilot, lambda: "held-out 0.064 (step 0)" in text_of(title))
        assert "baseline held-out reward 0.064; step 1 under way" in text_of(banner)
        reward = monitor.query_one("#plot-0", MetricPlot)
        await wait_for(pilot, lambda: any(line[0] == "eval" for line in reward.lines))
        assert (
            next(line for line in reward.lines if line[0] == "eval")[2][-1] == 0.0637
        )  # what the header says

        append_metrics(run, {"step": 1, "reward/mean": 0.25, "reward/std": 0.1, "time/step": 2.0})
        await wait_for(pilot, lambda: "reward 0.250 (step 1)" in text_of(title))
        assert "held-out 0.064 (step 0)" in text_of(title)
        await wait_for(pilot, lambda: not banner.display)


FAKE_SWEEP = "import time\ntime.sleep(600)\n"  # stands in for `workbench eval run -m RUN --checkpoints all`


def eval_of(root: Path, checkpoint: Path, name: str, **meta: object) -> Path:
    folder = root / "environments" / "reverse_words" / "outputs" / "evals" / "reverse-words--ck" / name
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "kind": "eval",
        "run_id": name,
        "env_id": "reverse-words",
        "model": str(checkpoint),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "total_rollouts": 4,
        **meta,
    }
    (folder / "metadata.json").write_text(json.dumps(data))
    return folder


async def test_a_running_sweep_shows_on_the_checkpoint_rows(workspace: Path):
    run = make_train_run(workspace, status="finished", pid=0)  # checkpoints 3 and 6
    step3, step6 = run / "checkpoints" / "step_000003", run / "checkpoints" / "step_000006"
    write_manifest(step6)
    manifest = json.loads((step6 / MANIFEST).read_text())
    manifest["saved_at"] = "2026-02-03T04:05:06+00:00"  # the save time, whatever the files' mtimes
    (step6 / MANIFEST).write_text(json.dumps(manifest))
    python = workspace / "fake-python"
    python.write_text(f"#!{sys.executable}\n{FAKE_SWEEP}")
    python.chmod(0o755)
    launcher = Launcher(workspace, python=str(python))
    app = WorkbenchApp(workspace, poll_s=0.2, launcher=launcher)
    sweep = None
    try:
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_run(pilot, app, "K")
            assert isinstance(screen, CheckpointsScreen)
            table = screen.query_one("#ckpt-table", VirtualTable)
            await wait_for(pilot, lambda: table.row_count == 2)
            at = text_of(table).splitlines()[0].index("evaluated")

            def cells() -> list[str]:
                return [line[at:].strip() for line in text_of(table).splitlines()[1:3]]

            assert "02-03 04:05" in text_of(table).splitlines()[2] and cells() == ["-", "-"]
            args = [
                "eval",
                "run",
                "reverse-words",
                "-m",
                str(run),
                "-n",
                "2",
                "-r",
                "2",
                "--checkpoints",
                "all",
            ]
            sweep = launcher.start(LaunchSpec("eval", args, "reverse-words", "checkpoint sweep"))
            status = screen.query_one("#sweep-status")
            await wait_for(pilot, lambda: cells() == ["queued", "queued"])
            assert "sweep running: 0 of 2 checkpoints evaluated · base model queued" in text_of(status)

            going = eval_of(workspace, step3, "20990101-000000-aaaa", status="running", pid=keepalive_pid())
            meta = json.loads((going / "metadata.json").read_text())
            meta["completed_rollouts"] = 1
            (going / "metadata.json").write_text(json.dumps(meta))
            await wait_for(pilot, lambda: cells() == ["▸ 1/4", "queued"])
            meta.update(status="finished", completed_rollouts=4, reward_mean=0.4)
            (going / "metadata.json").write_text(json.dumps(meta))
            await wait_for(pilot, lambda: cells() == ["0.400", "queued"])
            assert "1 of 2 checkpoints evaluated" in text_of(status)
    finally:
        if sweep is not None and launcher.is_running(sweep):
            os.killpg(sweep.pid, signal.SIGKILL)
            launcher.wait(sweep, 30)
