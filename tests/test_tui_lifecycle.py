"""Every lifecycle action from the Runs screen (issue 35.3, 35.5): `x` stops a run with SIGINT and,
when a real process ignores it, SIGTERM after the grace period, saying each step; `R` resumes a
stopped eval, training or GEPA run with the CLI's own command; `A` moves a run folder under
outputs/archive/ and `D` deletes it, each once confirmed and never for a live run; `V`/`P` run
`gepa verify`/`gepa apply` as children, and apply's result comes back on screen. Pilot tests at
100x30 over run folders made by tests/tui_data.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.tui_data import install_test_envs, make_eval, make_gepa_run, make_train_run, wait_for
from workbench.inference.echo import EchoClient
from workbench.tui.app import WorkbenchApp
from workbench.tui.launcher import Launch, Launcher, LaunchSpec
from workbench.tui.lifecycle import ARCHIVE, NotApplicable, resume_spec
from workbench.tui.screens.confirm import ConfirmScreen
from workbench.tui.widgets.runs_table import RunsTable

SIZE = (100, 30)


class RecordingLauncher(Launcher):
    """Records what would be launched, without starting processes."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.started: list[LaunchSpec] = []

    def start(self, spec: LaunchSpec) -> Launch:
        self.started.append(spec)
        return Launch(
            "fake", spec.kind, spec.args, spec.env, spec.model, 0, str(self.folder / "fake.log"), "2026-01-01"
        )


def set_status(run_dir: Path, status: str, **extra: object) -> None:
    meta = json.loads((run_dir / "metadata.json").read_text())
    meta.update(status=status, **extra)
    (run_dir / "metadata.json").write_text(json.dumps(meta))


def stopped_eval(root: Path, run_id: str = "20260102-030405-5a5a") -> Path:
    install_test_envs(root)
    run = make_eval("reverse-words", EchoClient(), 2, 1, run_id)
    set_status(run, "stopped")
    return run


async def on_row(pilot, app: WorkbenchApp, path: Path) -> RunsTable:
    table = app.screen.query_one(RunsTable)
    await wait_for(pilot, lambda: any(r.path == path for r in table.runs))
    table.move_cursor(next(i for i, r in enumerate(table.runs) if r.path == path))
    await pilot.pause()
    return table


async def confirm(pilot, app: WorkbenchApp, answer: str) -> str:
    """Answer the confirmation on screen; returns its question."""
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
    question = app.screen.question
    await pilot.press(answer)
    await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
    return question


# ----- stop ----------------------------------------------------------------------------------------
def fake_python(folder: Path, body: str) -> Path:
    """A stand-in for `python -m workbench ...` (a real process): runs `body`, ignoring its arguments."""
    script = folder / "fake-python"
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(0o755)
    return script


IGNORES_SIGINT = """import os, signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # before it says it is ready: no race with the test
with open(os.environ["READY_FIFO"], "w") as ready:
    ready.write("ready")
while True:
    signal.pause()
"""


async def test_x_escalates_to_sigterm_when_sigint_is_ignored(workspace: Path, monkeypatch):
    fifo = workspace / "ready"
    os.mkfifo(fifo)
    monkeypatch.setenv("READY_FIFO", str(fifo))
    launcher = Launcher(workspace, python=str(fake_python(workspace, IGNORES_SIGINT)), stop_grace_s=0.3)
    launch = launcher.start(LaunchSpec("eval", ["eval", "run", "reverse-words"], "reverse-words", "tiny"))
    try:
        assert await asyncio.to_thread(fifo.read_text) == "ready"  # SIGINT is ignored from here on
        app = WorkbenchApp(workspace, poll_s=0.2, launcher=launcher)
        async with app.run_test(size=SIZE) as pilot:
            table = app.screen.query_one(RunsTable)
            await wait_for(pilot, lambda: table.runs and table.runs[0].status == "starting")
            await pilot.press("x")
            question = await confirm(pilot, app, "y")
            assert "If it is still running 0.3 s after the Ctrl-C, it gets SIGTERM" in question
            code = await asyncio.to_thread(launcher.wait, launch, 60)  # the process's own exit
            assert code == -signal.SIGTERM
            progress = launcher.stopping[launch.pid]
            await wait_for(pilot, lambda: progress.done)
            assert progress.said == [
                "stopping (SIGINT sent)",
                "did not stop after 0.3 s: SIGTERM sent",
                "stopped (SIGTERM)",
            ]
            await wait_for(pilot, lambda: table.runs[0].status != "stopping")
    finally:
        if launcher.is_running(launch):
            os.killpg(launch.pid, signal.SIGKILL)
            launcher.wait(launch, 30)


async def test_a_run_that_honours_sigint_is_stopped_without_sigterm(workspace: Path):
    launcher = Launcher(workspace, python=str(fake_python(workspace, "import time\ntime.sleep(600)\n")))
    launch = launcher.start(LaunchSpec("eval", ["eval", "run", "x"], "x", "tiny"))
    seen: list[str] = []
    progress = await launcher.stop_escalating(
        launch.pid, "eval x", grace_s=120, report=lambda p: seen.append(p.phase)
    )
    assert progress.said == ["stopping (SIGINT sent)", "stopped"] and seen == ["interrupted", "stopped"]
    assert launcher.wait(launch, 10) in (-signal.SIGINT, 1, 130)  # ended by the Ctrl-C, well inside 120 s
    gone = await launcher.stop_escalating(launch.pid, "eval x", grace_s=1)
    assert gone.said == ["the process is already gone"] and gone.done


def test_a_row_being_stopped_says_so(workspace: Path):
    from workbench.tui.data.runs import RunCatalog
    from workbench.tui.launcher import StopProgress

    run = make_train_run(workspace)  # running, with a live pid
    launcher = Launcher(workspace)
    [row] = launcher.rows(RunCatalog(workspace).scan())
    assert row.status == "running"
    launcher.stopping[row.pid] = StopProgress(row.pid, "training", 10.0)
    [row] = launcher.rows(RunCatalog(workspace).scan())
    assert row.status == "stopping" and row.path == run
    launcher.stopping[row.pid].phase = "stopped"
    assert launcher.rows(RunCatalog(workspace).scan())[0].status == "running"  # the files say so again


# ----- resume --------------------------------------------------------------------------------------
async def test_r_resumes_a_stopped_run_with_the_clis_command(workspace: Path):
    evaluated = await asyncio.to_thread(stopped_eval, workspace)  # run_eval runs its own event loop
    trained = make_train_run(workspace, status="stopped", pid=0)
    launcher = RecordingLauncher(workspace)
    app = WorkbenchApp(workspace, poll_s=0.2, launcher=launcher)
    async with app.run_test(size=SIZE) as pilot:
        await on_row(pilot, app, evaluated)
        await pilot.press("R")
        question = await confirm(pilot, app, "n")
        assert (
            question.startswith("Resume an eval run (reverse-words, echo, stopped)?") and not launcher.started
        )
        await pilot.press("R")
        await confirm(pilot, app, "y")
        rel = str(evaluated.relative_to(workspace))
        assert launcher.started[-1].args == ["eval", "run", "-R", rel]

        await on_row(pilot, app, trained)
        await pilot.press("R")
        assert "workbench train --resume outputs/runs/" in await confirm(pilot, app, "y")
        assert launcher.started[-1].args == ["train", "--resume", str(trained.relative_to(workspace))]


def test_resume_fits_each_kind_and_refuses_what_cannot_resume(workspace: Path):
    from workbench.tui.data.runs import RunCatalog

    trained = make_train_run(workspace, status="stopped", pid=0)
    set_status(trained, "stopped", world_size=2)
    gepa = make_gepa_run(workspace, status="stopped")
    runs = {r.path: r for r in RunCatalog(workspace).scan()}
    assert resume_spec(runs[trained], workspace).args[-2:] == ["--nproc", "2"]  # as many processes
    assert resume_spec(runs[gepa], workspace).args[:3] == ["gepa", "run", "--resume"]
    set_status(gepa, "stopped", optimizer="bootstrap")
    set_status(trained, "finished")
    runs = {r.path: r for r in RunCatalog(workspace).scan()}
    with pytest.raises(NotApplicable, match="bootstrap runs cannot be resumed"):
        resume_spec(runs[gepa], workspace)
    with pytest.raises(NotApplicable, match="it is finished: nothing to resume"):
        resume_spec(runs[trained], workspace)


# ----- archive and delete ------------------------------------------------------------------------
async def test_a_archives_a_run_folder_and_d_deletes_one_each_once_confirmed(workspace: Path):
    kept = await asyncio.to_thread(stopped_eval, workspace, "20260102-030405-1111")
    doomed = await asyncio.to_thread(stopped_eval, workspace, "20260102-030405-2222")
    live = make_train_run(workspace)  # running: neither key touches it
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = await on_row(pilot, app, kept)
        await pilot.press("A")
        target = workspace / ARCHIVE / kept.relative_to(workspace)
        question = await confirm(pilot, app, "y")
        assert str(target.relative_to(workspace)) in question and "move it back to restore it" in question
        await wait_for(pilot, lambda: all(r.path != kept for r in table.runs))
        assert (
            not kept.exists()
            and (target / "metadata.json").is_file()
            and (target / "results.jsonl").is_file()
        )

        await on_row(pilot, app, doomed)
        await pilot.press("D")
        question = await confirm(pilot, app, "n")  # No: nothing happens
        assert "for good" in question and doomed.exists()
        await pilot.press("D")
        await confirm(pilot, app, "y")
        await wait_for(pilot, lambda: all(r.path != doomed for r in table.runs))
        assert not doomed.exists()

        await on_row(pilot, app, live)
        for key in ("A", "D"):
            await pilot.press(key)
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmScreen)  # refused before asking
        assert (live / "metadata.json").is_file()
        await pilot.pause(0.5)  # refreshes: the archived and deleted runs stay gone
        assert {r.path for r in table.runs} == {live}


# ----- GEPA verify and apply -------------------------------------------------------------------------
async def test_v_and_p_run_gepa_verify_and_apply(workspace: Path):
    gepa = make_gepa_run(workspace)
    launcher = RecordingLauncher(workspace)
    app = WorkbenchApp(workspace, poll_s=0.2, launcher=launcher)
    rel = str(gepa.relative_to(workspace))
    async with app.run_test(size=SIZE) as pilot:
        await on_row(pilot, app, gepa)
        assert "V" in str(app.screen.query_one("#runs-hint").render())
        await pilot.press("V")
        await wait_for(pilot, lambda: launcher.started)
        assert launcher.started[-1].args == ["gepa", "verify", rel]
        await pilot.press("P")
        question = await confirm(pilot, app, "y")
        assert "default system prompt of reverse-words" in question
        assert launcher.started[-1].args == ["gepa", "apply", rel]


async def test_gepa_apply_runs_as_a_child_and_its_result_comes_back(workspace: Path):
    install_test_envs(workspace)
    gepa = make_gepa_run(workspace)
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await on_row(pilot, app, gepa)
        await pilot.press("P")
        await confirm(pilot, app, "y")
        screen = app.screen
        await wait_for(pilot, lambda: screen.outcomes)
        [(what, status, lines)] = screen.outcomes
        assert (what, status) == ("gepa apply", "finished"), lines
        assert any("reverse_words" in line or "system_prompt" in line for line in lines), lines
