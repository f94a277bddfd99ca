"""Launch a real child run from the TUI, watch it appear, read its log, stop it gracefully (after
confirming) — and check that quitting the TUI never kills a run it started (after saying so).

The child is `workbench eval run reverse-text -m echo -b URL/v1` against an echo server on
127.0.0.1 that the test holds open (`tests.servers.Gate`): it answers the first few requests and
keeps the next one waiting, so the child is provably still running when the test presses stop,
however busy the machine."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.servers import EchoBackend, Gate, make_app, serve_in_thread, wait_until
from tests.tui_data import text_of, wait_for
from workbench.tui.app import WorkbenchApp
from workbench.tui.screens.confirm import ConfirmScreen
from workbench.tui.screens.launch import LaunchScreen
from workbench.tui.screens.log import LogScreen
from workbench.tui.widgets.runs_table import RunsTable

SIZE = (80, 24)


def key_for(screen, action: str) -> str:
    """The key a screen binds to `action` (so the tests follow a change of keys)."""
    from textual.binding import Binding

    for cls in type(screen).__mro__:
        for binding in Binding.make_bindings(cls.__dict__.get("BINDINGS", [])):
            if binding.action == action:
                return binding.key
    raise KeyError(action)


async def launch_eval_from_ui(pilot, app: WorkbenchApp, url: str) -> None:
    await pilot.press("l")
    screen = app.screen
    assert isinstance(screen, LaunchScreen)
    await pilot.press("ctrl+e")
    screen.query_one("#eval-env").value = "reverse-text"
    screen.query_one("#eval-model").value = "echo"
    screen.query_one("#eval-n").value = "50"
    screen.query_one("#eval-r").value = "2"
    screen.query_one("#eval-extra").value = f"-b {url}/v1 -c 1"
    await pilot.pause()
    await pilot.press("ctrl+s")  # shows the command
    assert isinstance(app.screen, LaunchScreen) and not app.launcher.launches()
    assert "$ workbench eval run reverse-text -m echo -n 50 -r 2" in text_of(
        screen.query_one("#confirm-command")
    )
    await pilot.press("ctrl+s")  # starts it


def runs_of(app: WorkbenchApp) -> list:
    return app.screen.query_one(RunsTable).runs


def metadata(run_dir: Path) -> dict:
    return json.loads((run_dir / "metadata.json").read_text())


def results_count(run_dir: Path) -> int:
    path = run_dir / "results.jsonl"
    return sum(1 for line in path.read_text().splitlines() if line.strip()) if path.is_file() else 0


def gated_echo(gate: Gate):
    return serve_in_thread(make_app(EchoBackend(), middlewares=(gate.middleware,)))


async def test_launch_watch_log_and_stop_a_real_eval(workspace: Path):
    # The child's preflight (GET /v1/models) waits until the test has seen its row: the child can
    # write nothing before that. Then two groups of 2 rollouts are answered and it waits on the 5th.
    preflight = Gate(0, path="/v1/models")
    gate = Gate(4)
    app_ = make_app(EchoBackend(), middlewares=(preflight.middleware, gate.middleware))
    with serve_in_thread(app_) as url, preflight, gate:
        app = WorkbenchApp(workspace, poll_s=0.3)
        async with app.run_test(size=SIZE) as pilot:
            await launch_eval_from_ui(pilot, app, url)
            await pilot.pause()
            launch = app.launcher.launches()[0]
            assert launch.args == [
                "eval",
                "run",
                "reverse-text",
                "-m",
                "echo",
                "-n",
                "50",
                "-r",
                "2",
                "-b",
                f"{url}/v1",
                "-c",
                "1",
            ]
            # it appears in Runs at once, before the child has written anything (the child's
            # preflight gives up after 10 s: the row must come well before)
            await wait_for(pilot, lambda: any(r.pid == launch.pid for r in runs_of(app)))
            first = next(r for r in runs_of(app) if r.pid == launch.pid)
            assert first.status in ("starting", "running") and first.env == "reverse-text"
            assert first.is_launch and not list(workspace.glob("environments/*/outputs/evals/*/*"))
            # Enter on the starting row: its log, never empty — at least the command
            await wait_for(
                pilot,
                lambda: (
                    app.screen.query_one(RunsTable).current is not None
                    and app.screen.query_one(RunsTable).current.pid == launch.pid
                ),
            )
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, LogScreen))
            starting = app.screen
            assert isinstance(starting, LogScreen) and [label for label, _ in starting.logs] == ["output"]
            await wait_for(
                pilot,
                lambda: "$ workbench eval run reverse-text -m echo" in text_of(starting.query_one("LogTail")),
            )
            await pilot.press("escape")
            preflight.open()
            # then its own run folder takes over the row, with progress, and the cursor follows it
            await wait_for(
                pilot,
                lambda: any(
                    r.pid == launch.pid and not r.is_launch and (r.done or 0) > 0 for r in runs_of(app)
                ),
                timeout=180,
            )
            table = app.screen.query_one(RunsTable)
            run = table.current
            assert (
                run is not None and run.pid == launch.pid and run.status == "running" and run.kind == "eval"
            )
            # the log: the child's output and the run's run.log
            await pilot.press(key_for(app.screen, "log"))
            logs = app.screen
            assert isinstance(logs, LogScreen) and [label for label, _ in logs.logs] == ["output", "run.log"]
            output = logs.query_one("#log-0 LogTail")
            await wait_for(pilot, lambda: output.line_count > 0, timeout=180)
            assert output.lines[0].startswith("$ workbench eval run reverse-text -m echo")
            await pilot.press("escape")
            # stop gracefully: Ctrl-C to the child, which keeps its groups and says "stopped";
            # it is stuck at the gate, so it cannot have finished on its own first
            await wait_for(pilot, lambda: gate.held >= 1 and results_count(run.path) == 4, timeout=180)
            assert app.launcher.is_running(launch)
            await pilot.press("x")  # asks first; "n" keeps it running
            assert isinstance(app.screen, ConfirmScreen)
            assert f"Stop eval reverse-text {run.short_id} (pid {launch.pid})?" in app.screen.question
            await pilot.press("n")
            assert not isinstance(app.screen, ConfirmScreen) and app.launcher.is_running(launch)
            await pilot.press("x", "y")
            await wait_for(pilot, lambda: metadata(run.path)["status"] == "stopped", timeout=180)
            await wait_for(pilot, lambda: not app.launcher.is_running(launch), timeout=60)
            meta = metadata(run.path)
            assert 0 < meta["completed_rollouts"] < 100
            assert meta["completed_rollouts"] == 4 == gate.passed  # the answered groups, kept
            await wait_for(
                pilot,
                lambda: any(r.path == run.path and r.status == "stopped" for r in runs_of(app)),
                timeout=180,
            )
            log_text = Path(launch.log_path).read_text()
            resume = log_text.replace("\n", "").split("eval run -R ")[-1]  # the CLI's stop message
            assert (
                "Traceback" not in log_text and resume.startswith("environments/") and run.path.name in resume
            )


async def test_quitting_the_tui_never_kills_a_run(workspace: Path):
    gate = Gate(2)  # one group answered, then the child waits on the 3rd request
    with gated_echo(gate) as url, gate:
        app = WorkbenchApp(workspace, poll_s=0.3)
        async with app.run_test(size=SIZE) as pilot:
            await launch_eval_from_ui(pilot, app, url)
            launch = app.launcher.launches()[0]
            await wait_for(
                pilot, lambda: any(r.pid == launch.pid and not r.is_launch for r in runs_of(app)), timeout=180
            )
            run_dir = next(r.path for r in runs_of(app) if r.pid == launch.pid)
            await wait_for(pilot, lambda: gate.held >= 1, timeout=180)  # mid-run: it cannot finish on its own
            await pilot.press("q")  # a run is going: the TUI says it goes on, and how to get back to it
            ask = app.screen
            assert isinstance(ask, ConfirmScreen)
            assert "1 run is still going; it keeps running after you quit" in ask.question
            assert "`workbench tui" in ask.question
            await pilot.press("n")  # stay
            assert app.is_running and not isinstance(app.screen, ConfirmScreen)
            await pilot.press("q", "y")
        assert not app.is_running
        # still alive after the TUI quit, and still working: let one more group through and watch
        # the child save it (a run the quit had signalled would save nothing more)
        assert app.launcher.is_running(launch)
        os.kill(launch.pid, 0)
        assert os.getsid(launch.pid) == launch.pid  # in its own session: terminal signals never reach it
        wait_until(lambda: results_count(run_dir) == 2)  # the answered group is saved
        gate.allow(2)
        gate.wait_held(2, timeout=180)  # it asked for the next group: the one let through is done
        wait_until(lambda: results_count(run_dir) == 4)
        assert app.launcher.is_running(launch)
        assert metadata(run_dir)["status"] == "running"
        os.killpg(launch.pid, signal.SIGINT)  # what the next TUI session's stop would do
        assert app.launcher.wait(launch, 30) == 130
        assert metadata(run_dir)["status"] == "stopped"
        assert metadata(run_dir)["completed_rollouts"] == 4
