"""Launching from the TUI as a daily driver (issue 16, items 4 and 5, and the palette):

- a training run launched from the Train form (with `--set` overrides, after a confirmation that
  shows the whole command) prints its step lines into its Log as they happen — the CLI writes plain
  lines when its output is a file — and `x` stops it only once confirmed;
- a launch that fails before it writes a run folder stays listed, with its error, after a restart;
- the command palette (ctrl+p or `:`) names every launch route, each title once.

Every child is a real `workbench` process on the real tiny model; tests wait on files and states,
never on a fixed sleep."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from tests.test_tui_launch import key_for
from tests.tui_data import text_of, wait_for
from workbench.tui.app import WorkbenchApp
from workbench.tui.data.runs import RunInfo, parse_time
from workbench.tui.launcher import Launch, Launcher, LaunchSpec, last_error
from workbench.tui.screens.confirm import ConfirmScreen
from workbench.tui.screens.launch import LaunchScreen
from workbench.tui.screens.log import LogScreen
from workbench.tui.widgets.runs_table import RunsTable

SIZE = (80, 24)

TINY_RL = """model = "tiny"
max_steps = 2
batch_size = 8
rollouts_per_example = 4
micro_batch_size = 8
learning_rate = 3e-3
seed = 1
[sampling]
max_tokens = 32
temperature = 1.0
[[env]]
id = "reverse-text"
[lora]
r = 4
alpha = 8
[checkpointing]
save_every_n_steps = 50
[wandb]
mode = "disabled"
"""


class RecordingLauncher(Launcher):
    """Records what would be launched, without starting processes (for the forms' commands)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.started: list[LaunchSpec] = []

    def start(self, spec: LaunchSpec) -> Launch:
        self.started.append(spec)
        return Launch(
            "fake",
            spec.kind,
            spec.args,
            spec.env,
            spec.model,
            0,
            str(self.folder / "fake.log"),
            "2026-01-02T03:04:05+00:00",
        )


def rows(app: WorkbenchApp) -> list[RunInfo]:
    return app.screen.query_one(RunsTable).runs


def write_config(root: Path, name: str, text: str) -> Path:
    path = root / "configs" / "rl" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


async def test_training_launched_from_the_tui_prints_its_step_lines_into_its_log(tiny_workspace: Path):
    write_config(tiny_workspace, "tiny-rl.toml", TINY_RL)
    app = WorkbenchApp(tiny_workspace, poll_s=0.3)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l", "ctrl+t")
        screen = app.screen
        assert isinstance(screen, LaunchScreen)
        screen.query_one(
            "#train-set"
        ).value = "max_steps=500 seed=2"  # far more steps than the test waits for
        await pilot.pause()
        command = "$ workbench train configs/rl/tiny-rl.toml --set max_steps=500 --set seed=2"
        assert command in text_of(screen.query_one("#launch-preview"))
        await pilot.press("ctrl+s")  # shows the command; nothing starts yet
        assert not app.launcher.launches() and command in text_of(screen.query_one("#confirm-command"))
        await pilot.press("enter")  # the focused Start button
        await wait_for(pilot, lambda: app.launcher.launches())
        launch = app.launcher.launches()[0]
        assert launch.args == [
            "train",
            "configs/rl/tiny-rl.toml",
            "--set",
            "max_steps=500",
            "--set",
            "seed=2",
        ]
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: table.current is not None and table.current.pid == launch.pid)
        await pilot.press(key_for(app.screen, "log"))
        logs = app.screen
        assert isinstance(logs, LogScreen) and logs.logs[0][0] == "output"
        output = logs.query_one("#log-0 LogTail")
        # the CLI's own lines, as they happen: the bar's first state, then a line per step
        await wait_for(
            pilot,
            lambda: any(line.startswith("step 1 ") and "reward" in line for line in output.lines),
            timeout=600,
        )
        assert app.launcher.is_running(launch)  # printed while it runs, not at the end: 499 steps to go
        text = "\n".join(output.lines)
        assert output.lines[0] == command
        assert "0/500 steps  reward -" in text and "\x1b[" not in text and "\r" not in text
        assert "step 1 " in text_of(output)  # on screen, not only in the widget's lines
        # x asks first, then Ctrl-Cs it; the run keeps its checkpoint and says how to resume
        await pilot.press("x")
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question.startswith(
            f"Stop train reverse-text (pid {launch.pid})? It saves what it finished"
        )
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.launcher.is_running(launch), timeout=300)
        await wait_for(
            pilot, lambda: any("continue with `workbench train --resume" in line for line in output.lines)
        )
        assert app.launcher.wait(launch) == 130


async def test_a_failed_launch_stays_listed_with_its_error_after_a_restart(workspace: Path):
    write_config(
        workspace, "broken.toml", 'model = "tiny"\nmax_steps = "many"\n[[env]]\nid = "reverse-text"\n'
    )
    app = WorkbenchApp(workspace, poll_s=0.3)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        # keys typed ahead of a screen still mounting go elsewhere: wait for its list to have focus
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchScreen) and app.screen.focused is not None)
        screen = app.screen
        await pilot.press("enter")  # Configs tab: the highlighted config, shown for confirmation
        await wait_for(pilot, lambda: screen.confirming is not None)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.launcher.launches())
        launch = app.launcher.launches()[0]
        assert launch.args == ["train", "configs/rl/broken.toml"]
        await wait_for(
            pilot, lambda: any(r.pid == launch.pid and r.status == "failed" for r in rows(app)), timeout=120
        )
        await pilot.press("q")  # nothing is running: quits at once
    assert not app.is_running
    record = json.loads((workspace / "outputs" / "tui" / "launches" / f"{launch.id}.json").read_text())
    assert (
        record["returncode"] == 1 and record["error"].startswith("error: ") and "max_steps" in record["error"]
    )

    again = WorkbenchApp(workspace, poll_s=0.3)  # a new TUI session: a new Launcher reads the records
    async with again.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: rows(again))
        row = rows(again)[0]
        assert row.is_launch and row.status == "failed" and row.kind == "train" and row.pid == launch.pid
        assert row.metadata["error"] == record["error"]
        await pilot.press("enter")  # Enter on it: its log, with the error above it
        await wait_for(pilot, lambda: isinstance(again.screen, LogScreen))
        logs = again.screen
        assert isinstance(logs, LogScreen) and logs.note == f"failed: {record['error']}"
        output = logs.query_one("#log-0 LogTail")
        await wait_for(pilot, lambda: record["error"] in output.lines)
        assert output.lines[0] == "$ workbench train configs/rl/broken.toml"


def test_a_launch_that_ended_after_its_tui_closed_is_read_from_its_log(workspace: Path):
    """No exit code was recorded (the TUI had quit): a log that ends in an error or a traceback is a
    failed launch, listed with that line; a log without one is not listed as failed."""
    folder = workspace / "outputs" / "tui" / "launches"
    folder.mkdir(parents=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a real pid, reaped: nothing runs under it now
    logs = {
        "crashed": '$ workbench eval run x\nTraceback (most recent call last):\n  File "x", line 1\nValueError: boom\n',
        "said": "$ workbench train configs/rl/x.toml\nerror: configs/rl/x.toml: max_steps: not a number\n",
        "quiet": "$ workbench eval run x\nreverse-text · tiny  2/4 rollouts  reward 0.500  0:00:01\n",
    }
    for index, (name, text) in enumerate(logs.items()):
        (folder / f"{name}.log").write_text(text)
        record = Launch(
            name,
            "eval",
            ["eval", "run", "x"],
            "x",
            "tiny",
            gone.pid,
            str(folder / f"{name}.log"),
            f"2026-01-02T03:04:0{index}+00:00",
        )
        (folder / f"{name}.json").write_text(json.dumps({**record.__dict__, "a_newer_field": 1}))
    launcher = Launcher(workspace)
    pending = {row.run_id: row for row in launcher.pending_rows([])}
    assert set(pending) == {"crashed", "said"}
    assert (
        pending["crashed"].metadata["error"] == "ValueError: boom" and pending["crashed"].status == "failed"
    )
    assert pending["said"].metadata["error"] == "error: configs/rl/x.toml: max_steps: not a number"
    assert last_error(folder / "quiet.log", failed=False) is None
    assert last_error(folder / "quiet.log") == "reverse-text · tiny  2/4 rollouts  reward 0.500  0:00:01"


def test_a_launched_run_takes_the_place_of_its_pending_row(workspace: Path):
    """Rows are newest first; a launched run sorts by its launch time, so when its folder appears
    (seconds after the launch, after a run started meanwhile) it replaces the pending row in place."""
    launcher = Launcher(workspace)
    launch = launcher.start(LaunchSpec("eval", ["--help"], "reverse-text", "tiny"))
    launcher.wait(launch, 120)
    started = parse_time(launch.started_at)
    assert started is not None

    def run(name: str, seconds: float, pid: int | None) -> RunInfo:
        return RunInfo(
            "eval",
            workspace / name,
            name,
            "reverse-text",
            "tiny",
            "running",
            created_at=started + timedelta(seconds=seconds),
            pid=pid,
        )

    older, meanwhile = run("older", -60, None), run("meanwhile", 2, None)  # `meanwhile` started in a terminal
    before = launcher.rows([meanwhile, older])
    assert [r.run_id for r in before] == ["meanwhile", launch.id, "older"]
    launched = run("launched", 5, launch.pid)  # its folder appears, with a later start time of its own
    after = launcher.rows([launched, meanwhile, older])
    assert [r.run_id for r in after] == ["meanwhile", "launched", "older"]


async def test_launch_forms_build_train_and_gepa_commands_and_confirm_first(workspace: Path):
    write_config(workspace, "tiny-rl.toml", "# workbench train configs/rl/tiny-rl.toml --nproc 1\n" + TINY_RL)
    launcher = RecordingLauncher(workspace)
    app = WorkbenchApp(workspace, poll_s=0.3, launcher=launcher)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l", "ctrl+t")
        screen = app.screen
        assert isinstance(screen, LaunchScreen)
        screen.query_one(
            "#train-set"
        ).value = "max_steps"  # not KEY=VALUE: a one-line message, nothing starts
        await pilot.pause()
        assert "overrides are KEY=VALUE" in text_of(screen.query_one("#launch-preview"))
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, LaunchScreen) and screen.confirming is None and not launcher.started
        screen.query_one("#train-set").value = "max_steps=3 'sampling.stop=[\"</a>\"]'"
        await pilot.press("ctrl+s")  # the command, shown; escape goes back to editing
        assert screen.confirming is not None
        await pilot.press("escape")
        assert isinstance(app.screen, LaunchScreen) and screen.confirming is None and not launcher.started
        await pilot.press("ctrl+s", "ctrl+s")
        await wait_for(pilot, lambda: launcher.started)
        assert launcher.started[0].args == [
            "train",
            "configs/rl/tiny-rl.toml",
            "--nproc",
            "1",
            "--set",
            "max_steps=3",
            "--set",
            'sampling.stop=["</a>"]',
        ]
        await pilot.press("l", "ctrl+g")
        screen = app.screen
        screen.query_one("#gepa-model").value = "echo"
        screen.query_one("#gepa-reflection").value = "tiny"
        screen.query_one("#gepa-budget").value = "40"
        screen.query_one("#gepa-n").value = "4"
        screen.query_one("#gepa-val").value = "3"
        screen.query_one("#gepa-set").value = "minibatch_size=2"
        screen.query_one("#gepa-budget").focus()
        await pilot.press("enter")  # Enter in a field: the command first (Input.Submitted, posted)
        await wait_for(pilot, lambda: screen.confirming is not None)
        assert len(launcher.started) == 1
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(launcher.started) == 2)
        spec = launcher.started[1]
        assert spec.kind == "gepa" and spec.args == [
            "gepa",
            "run",
            "reverse-text",
            "-m",
            "echo",
            "-M",
            "tiny",
            "-B",
            "40",
            "-n",
            "4",
            "-N",
            "3",
            "--set",
            "minibatch_size=2",
        ]


async def test_the_palette_names_every_launch_route_once(workspace: Path):
    app = WorkbenchApp(workspace, poll_s=0.3, launcher=RecordingLauncher(workspace))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        titles = [command.title for command in app.get_system_commands(app.screen)]
        assert len(titles) == len(set(titles)), titles
        assert {
            "Keys",
            "Quit",
            "Launch",
            "Launch eval",
            "Launch training",
            "Launch GEPA run",
            "Launch a config",
        } <= set(titles)
        await pilot.press("colon")  # `:` opens the palette too
        await wait_for(pilot, lambda: type(app.screen).__name__ == "CommandPalette")
        await pilot.press(*"gepa")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchScreen))
        assert app.screen.query_one("#launch-tabs").active == "gepa"
