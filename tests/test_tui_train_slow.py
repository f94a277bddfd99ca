"""End to end on the real tiny model (slow): launch a short RL run from the TUI's Launch screen,
watch its curves fill in the Run monitor, then evaluate one of its checkpoints from the
Checkpoints screen — every process started by the UI, every number read from their files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tui_data import wait_for
from workbench.tui.app import WorkbenchApp
from workbench.tui.screens.checkpoints import CheckpointsScreen
from workbench.tui.screens.launch import LaunchScreen
from workbench.tui.screens.monitor import TrainMonitorScreen
from workbench.tui.widgets.metric_plot import MetricPlot
from workbench.tui.widgets.runs_table import RunsTable

# The tmux walk-through (run by default) launches, monitors and sweeps a run from the TUI in a
# real terminal; this Pilot version of the same path is breadth: -m ''.
pytestmark = [pytest.mark.slow, pytest.mark.extended]

CONFIG = """# workbench train configs/rl/tiny-rl.toml
model = "tiny"
max_steps = 3
batch_size = 8
rollouts_per_example = 4
micro_batch_size = 8
learning_rate = 3e-3
seed = 1
[sampling]
max_tokens = 48
temperature = 1.0
[[env]]
id = "reverse-text"
[lora]
r = 4
alpha = 8
[checkpointing]
save_every_n_steps = 1
keep_n_checkpoints = 5
[wandb]
mode = "disabled"
"""


async def test_train_from_the_tui_then_evaluate_a_checkpoint(tiny_workspace: Path):
    config = tiny_workspace / "configs" / "rl" / "tiny-rl.toml"
    config.parent.mkdir(parents=True)
    config.write_text(CONFIG)
    app = WorkbenchApp(tiny_workspace, poll_s=0.5)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("l")
        assert isinstance(app.screen, LaunchScreen)
        launcher = app.screen
        await pilot.press("enter")  # the highlighted config: its command shown ...
        await wait_for(pilot, lambda: launcher.confirming is not None)
        await pilot.press("enter")  # ... then started
        await wait_for(pilot, lambda: app.launcher.launches())
        launch = app.launcher.launches()[0]
        assert launch.args == ["train", "configs/rl/tiny-rl.toml"]
        table = app.screen.query_one(RunsTable)
        await wait_for(
            pilot, lambda: any(r.kind == "train" and not r.is_launch for r in table.runs), timeout=120
        )
        await wait_for(
            pilot,
            lambda: (
                table.current is not None and table.current.kind == "train" and not table.current.is_launch
            ),
        )
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, TrainMonitorScreen))
        monitor = app.screen
        assert isinstance(monitor, TrainMonitorScreen)
        reward = monitor.query_one("#plot-0", MetricPlot)
        await wait_for(pilot, lambda: reward.lines and reward.lines[0][1][-1] >= 1, timeout=300)
        await wait_for(pilot, lambda: monitor.run.status == "finished", timeout=300)
        metrics = [json.loads(line) for line in (monitor.run.path / "metrics.jsonl").read_text().splitlines()]
        await wait_for(pilot, lambda: reward.lines[0][1][-1] == 3)
        assert reward.lines[0][2] == [m["reward/mean"] for m in metrics if "reward/mean" in m]
        await pilot.press("K")
        checkpoints = app.screen
        assert isinstance(checkpoints, CheckpointsScreen)
        await wait_for(pilot, lambda: [c.step for c in checkpoints.checkpoints] == [1, 2, 3])
        await pilot.press("down", "down", "e")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "EvalCheckpointScreen")
        app.screen.query_one("#ck-n").value = "2"
        app.screen.query_one("#ck-r").value = "2"
        await pilot.press("ctrl+s")
        await wait_for(
            pilot,
            lambda: len(checkpoints.evals) == 1 and checkpoints.evals[0][1].status == "finished",
            timeout=300,
        )
        label, run = checkpoints.evals[0]
        assert label == "step 3" and run.total == 4
