"""The Runs screen's answers about failed work, without opening it:

- `d` dismisses a launch from the TUI that ended before it wrote a run folder: once confirmed, its
  row goes, with its record and output log in outputs/tui/launches/ — and it stays gone after a
  restart. The footer and `?` offer `d` only on such a row; anywhere else `d` says why not, and
  never touches a run folder or a live process;
- a failed row shows the first line of its error: in an `error` column where the terminal is
  wide enough for one (at 80 columns the other columns take 79 cells), and for the highlighted
  row in the hint line under the table at any width.

The rows come from real files: launch records as the Launcher writes them, run metadata through
the store's writer. Tests wait on states and files, never on a fixed sleep."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.tui_data import text_of, wait_for
from workbench.store.files import write_json_atomic
from workbench.store.runs import EvalRun, write_run_metadata
from workbench.tui.app import WorkbenchApp
from workbench.tui.launcher import LAUNCHES, Launch, Launcher, LaunchSpec
from workbench.tui.screens.confirm import ConfirmScreen
from workbench.tui.screens.keys import KeysScreen
from workbench.tui.widgets.runs_table import RunsTable

SIZE = (80, 24)
LAUNCH_ERROR = (
    "error: configs/rl/broken.toml: max_steps: 'many' is not a whole number; "
    "set it to the number of optimizer steps to run, e.g. max_steps = 200"
)
RUN_ERROR = "InferenceError: upstream said no\n  while scoring example 3\n"


def gone_pid() -> int:
    """A real pid whose process has exited and been reaped: nothing runs under it now."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def failed_launch(root: Path, launch_id: str = "20260103-010203-beef") -> Launch:
    """A launch an earlier TUI session started, which failed before it wrote a run folder: its
    record and log as `Launcher` leaves them."""
    folder = root / LAUNCHES
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{launch_id}.log"
    log.write_text(f"$ workbench train configs/rl/broken.toml\n{LAUNCH_ERROR}\n")
    launch = Launch(
        launch_id,
        "train",
        ["train", "configs/rl/broken.toml"],
        "reverse-text",
        "tiny",
        gone_pid(),
        str(log),
        "2026-01-03T01:02:03+00:00",
        returncode=1,
        error=LAUNCH_ERROR,
    )
    write_json_atomic(folder / f"{launch_id}.json", asdict(launch))
    return launch


def eval_run(root: Path, run_id: str, created_at: str, status: str, error: str | None = None) -> Path:
    run_dir = root / "environments" / "reverse_text" / "outputs" / "evals" / "reverse-text--echo" / run_id
    write_run_metadata(
        run_dir,
        EvalRun(
            run_id=run_id,
            env_id="reverse-text",
            model="echo",
            status=status,
            error=error,
            created_at=created_at,
            updated_at=created_at,
            pid=None,
            num_examples=4,
            rollouts_per_example=2,
            total_rollouts=8,
            completed_rollouts=3 if status == "failed" else 8,
        ),
    )
    return run_dir


@pytest.fixture
def failures(workspace: Path) -> dict[str, Path]:
    """A failed launch (newest), a failed eval run and a finished one (oldest)."""
    launch = failed_launch(workspace)
    return {
        "record": workspace / LAUNCHES / f"{launch.id}.json",
        "log": launch.log,
        "failed": eval_run(
            workspace, "20260102-000000-fail", "2026-01-02T00:00:00+00:00", "failed", RUN_ERROR
        ),
        "finished": eval_run(workspace, "20260101-000000-done", "2026-01-01T00:00:00+00:00", "finished"),
    }


def table_of(app: WorkbenchApp) -> RunsTable:
    return app.screen.query_one(RunsTable)


def footer_keys(app: WorkbenchApp) -> dict[str, str]:
    """What the footer shows: {description: key}."""
    return {key.description: key.key for key in app.screen.query("FooterKey")}


def offers_dismiss(app: WorkbenchApp) -> bool | None:
    """Whether the footer offers `d` (None while it is being rebuilt: it always shows Stop)."""
    keys = footer_keys(app)
    return None if "Stop" not in keys else keys.get("Dismiss") == "d"


def messages(app: WorkbenchApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_d_dismisses_a_failed_launch_once_confirmed_and_it_stays_gone_after_a_restart(
    workspace, failures
):
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = table_of(app)
        await wait_for(pilot, lambda: len(table.runs) == 3)
        launch_row, failed_row, finished_row = table.runs
        assert launch_row.is_launch and launch_row.status == "failed" and table.current is launch_row
        assert failed_row.path == failures["failed"] and finished_row.path == failures["finished"]
        hint = app.screen.query_one("#runs-hint")
        # on the failed launch: `d` is offered, and the hint line says why it failed
        await wait_for(pilot, lambda: offers_dismiss(app) is True)
        shown = text_of(hint).strip()
        assert shown.startswith("failed: error: configs/rl/broken.toml: max_steps") and shown.endswith(
            "…"
        )  # one line
        await pilot.press("question_mark")
        assert isinstance(app.screen, KeysScreen) and ("d", "Dismiss", "Runs") in app.screen.rows
        await pilot.press("escape")

        # on a failed run folder: its error's first line in the hint; `d` is not offered, and refuses
        await pilot.press("j")
        await wait_for(pilot, lambda: offers_dismiss(app) is False)
        assert text_of(hint).strip() == "failed: InferenceError: upstream said no"
        await pilot.press("d")
        await wait_for(pilot, lambda: any("not this row: it has a run folder" in m for m in messages(app)))
        assert not isinstance(app.screen, ConfirmScreen) and (failures["failed"] / "metadata.json").is_file()
        await pilot.press("question_mark")
        assert isinstance(app.screen, KeysScreen) and "Dismiss" not in {row[1] for row in app.screen.rows}
        await pilot.press("escape")
        await pilot.press("j")  # a finished run: the hint shows the keys again
        await wait_for(pilot, lambda: "space mark" in text_of(hint))

        # back on the launch: d asks first (the log goes too); n keeps everything
        await pilot.press("g", "d")
        confirm = app.screen
        assert isinstance(confirm, ConfirmScreen)
        relative_log = failures["log"].relative_to(workspace)
        assert confirm.question == (
            f"Dismiss the failed train launch (reverse-text, tiny)? Its record and its "
            f"output log ({relative_log}) are deleted."
        )
        await pilot.press("n")
        assert not isinstance(app.screen, ConfirmScreen)
        assert (
            failures["record"].is_file() and failures["log"].is_file() and table.current.key == launch_row.key
        )
        # y dismisses: the row, record and log go; the cursor moves to the next row; runs stay
        await pilot.press("d", "y")
        await wait_for(pilot, lambda: len(table.runs) == 2)
        assert not failures["record"].exists() and not failures["log"].exists()
        assert [r.path for r in table.runs] == [failures["failed"], failures["finished"]]
        assert table.current.path == failures["failed"]
        assert (failures["failed"] / "metadata.json").is_file() and (
            failures["finished"] / "metadata.json"
        ).is_file()
        assert any(m.startswith("dismissed the failed train launch") for m in messages(app))
        await wait_for(pilot, lambda: offers_dismiss(app) is False)
        # later scans do not bring it back
        scans = app.launcher.rows(app.catalog.scan())
        assert [r.path for r in scans] == [failures["failed"], failures["finished"]]
        await pilot.press("q")

    again = WorkbenchApp(workspace, poll_s=0.2)  # a new session reads the records afresh
    async with again.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: table_of(again).runs)
        assert [r.path for r in table_of(again).runs] == [failures["failed"], failures["finished"]]
    assert sorted(p.name for p in (workspace / LAUNCHES).iterdir()) == []


async def test_d_never_dismisses_a_live_launch_and_dismisses_it_once_it_ended(workspace: Path):
    """A launch still running is refused (the key and the Launcher alike); stopped before it wrote a
    run folder, it is dismissed like a failed one."""
    child = workspace / "fake-python"  # stands in for `python -m workbench ...`: runs until Ctrl-C
    child.write_text("#!/bin/sh\nexec sleep 600\n")
    child.chmod(0o755)
    launcher = Launcher(workspace, python=str(child))
    app = WorkbenchApp(workspace, poll_s=0.2, launcher=launcher)
    launch = launcher.start(
        LaunchSpec("eval", ["eval", "run", "reverse-text", "-m", "tiny"], "reverse-text", "tiny")
    )
    try:
        async with app.run_test(size=SIZE) as pilot:
            table = table_of(app)
            await wait_for(pilot, lambda: table.runs and table.runs[0].status == "starting")
            await wait_for(pilot, lambda: offers_dismiss(app) is False)
            await pilot.press("d")
            await wait_for(
                pilot, lambda: any("not this row: it is still starting" in m for m in messages(app))
            )
            assert not isinstance(app.screen, ConfirmScreen)
            with pytest.raises(ValueError, match=f"still running \\(pid {launch.pid}\\)"):
                launcher.dismiss(launch.id)
            assert launcher.is_running(launch) and (workspace / LAUNCHES / f"{launch.id}.json").is_file()

            await pilot.press("x", "y")  # Ctrl-C it: it ends without a run folder
            await wait_for(pilot, lambda: table.runs and table.runs[0].status == "stopped")
            await wait_for(pilot, lambda: offers_dismiss(app) is True)
            await pilot.press("d")
            assert isinstance(app.screen, ConfirmScreen) and app.screen.question.startswith(
                "Dismiss the stopped eval launch (reverse-text, tiny)?"
            )
            await pilot.press("y")
            await wait_for(pilot, lambda: not table.runs)
            assert not launcher.launches() and not list((workspace / LAUNCHES).iterdir())
            assert app.screen.query_one("#runs-empty").display  # the empty workspace's help again
    finally:
        if launcher.is_running(launch):
            os.killpg(launch.pid, signal.SIGKILL)
            launcher.wait(launch, 30)


def test_dismiss_deletes_only_a_named_launch_record(workspace: Path):
    launcher = Launcher(workspace)
    launch = failed_launch(workspace)
    for bad in ("../outputs", "", ".hidden", "a/b"):
        with pytest.raises(ValueError, match="not a launch id"):
            launcher.dismiss(bad)
    with pytest.raises(ValueError, match="no launch record 20260103-000000-none"):
        launcher.dismiss("20260103-000000-none")
    assert launcher.dismiss(launch.id).id == launch.id
    assert not (workspace / LAUNCHES / f"{launch.id}.json").exists() and not launch.log.exists()
    assert launcher.pending_rows([]) == []


async def test_failed_rows_show_their_error_in_a_column_where_the_terminal_is_wide_enough(
    workspace, failures
):
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = table_of(app)
        await wait_for(pilot, lambda: len(table.runs) == 3)
        # 80 columns: the eight columns as before, nothing cut
        assert not table.shows_errors and table.line_width <= table.size.width
        lines = text_of(table).splitlines()
        assert "error" not in lines[0] and "finished" in lines[3] and "01-01 00:00" in lines[3]

        await pilot.resize_terminal(160, 30)  # wide: an `error` column takes the room left over
        await wait_for(pilot, lambda: table.shows_errors)
        width = table.columns[-1][1]
        assert table.columns[-1][0] == "error" and table.line_width == 160 - 1  # all but the scrollbar's cell
        await wait_for(pilot, lambda: "error" in text_of(table).splitlines()[0])
        header, launch_line, failed_line, finished_line = text_of(table).splitlines()[:4]
        at = header.index("error")
        assert launch_line[at:].rstrip() == LAUNCH_ERROR[: width - 1] + "…"  # cut to the column's cells
        assert failed_line[at:].rstrip() == "InferenceError: upstream said no"  # its first line only
        assert finished_line[at:].strip() == ""
        assert len(header.rstrip()) <= 160

        await pilot.resize_terminal(*SIZE)  # and gone again at 80
        await wait_for(pilot, lambda: not table.shows_errors)
        assert "error" not in text_of(table).splitlines()[0]
