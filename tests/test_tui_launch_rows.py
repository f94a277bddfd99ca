"""A launch whose run folder appeared never comes back as a row of its own: once a resume (another
process, another pid) owns the folder, or the folder is archived or deleted, the ended launch's pid
names no run, and it used to be listed again as a bare "stopped"/"failed" launch beside (or
instead of) its run. Found by the tmux walk-through (tests/test_tui_tmux_walkthrough.py). Real
child processes (a stand-in for `python -m workbench` that exits with a given code)."""

from __future__ import annotations

import sys
from pathlib import Path

from workbench.store.files import read_json
from workbench.tui.data.runs import RunInfo
from workbench.tui.launcher import LAUNCHES, Launch, Launcher, LaunchSpec


def exiting_python(folder: Path, code: int) -> str:
    script = folder / f"exit-{code}"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.exit({code})\n")
    script.chmod(0o755)
    return str(script)


def run_row(root: Path, pid: int) -> RunInfo:
    path = root / "outputs" / "runs" / "reverse-text--tiny--20260102-030405-abcd"
    return RunInfo("train", path, path.name, "reverse-text", "tiny", "running", pid=pid)


def ended(launcher: Launcher, code: int) -> Launch:
    launch = launcher.start(LaunchSpec("train", ["train", "configs/rl/x.toml"], "reverse-text", "tiny"))
    assert launcher.wait(launch, timeout=60) == code
    return launch


def test_an_ended_launch_whose_run_was_resumed_or_archived_is_not_listed_again(tmp_path: Path):
    launcher = Launcher(tmp_path, python=exiting_python(tmp_path, 130))  # stopped with Ctrl-C
    launch = ended(launcher, 130)
    run = run_row(tmp_path, launch.pid)
    assert launcher.pending_rows([run]) == []  # its run stands for it
    record = read_json(tmp_path / LAUNCHES / f"{launch.id}.json")
    assert record["extra"]["run"] == str(run.path)  # remembered in its record
    resumed = run_row(tmp_path, launch.pid + 100_000)  # a resume: the same folder, another process
    assert launcher.pending_rows([resumed]) == []
    assert launcher.pending_rows([]) == []  # archived or deleted


def test_a_failed_launch_whose_run_was_resumed_stays_hidden_in_a_later_session(tmp_path: Path):
    launcher = Launcher(tmp_path, python=exiting_python(tmp_path, 1))
    launch = ended(launcher, 1)
    launcher.pending_rows([run_row(tmp_path, launch.pid)])
    later = Launcher(tmp_path)  # a later TUI session: lists earlier failed launches without a folder
    assert later.pending_rows([run_row(tmp_path, launch.pid + 100_000)]) == []


def test_a_launch_that_never_wrote_a_run_folder_is_still_listed(tmp_path: Path):
    launcher = Launcher(tmp_path, python=exiting_python(tmp_path, 1))
    launch = ended(launcher, 1)
    rows = launcher.pending_rows([])
    assert [(row.run_id, row.status) for row in rows] == [(launch.id, "failed")]
    assert [row.run_id for row in Launcher(tmp_path).pending_rows([])] == [launch.id]
