"""`--set KEY=VALUE` on `eval run` and `gepa run`, as `workbench train` has it (so every route of the
TUI's Launch screen takes overrides): parsed the same way, flags win over it, and a bad key or
form is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import cli


def workbench(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORKBENCH_WORKSPACE": str(cwd)}
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_gepa_run_takes_set_overrides_and_flags_win(workspace: Path):
    result = workbench(
        workspace,
        "gepa",
        "run",
        "reverse-text",
        "-m",
        "tiny",
        "--set",
        "max_calls=7",
        "--set",
        "num_val=3",
        "-N",
        "4",
        "--dry-run",
    )
    assert result.returncode == 0, result.stderr
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    assert "max_calls 7" in lines and "seed evaluation 4 calls (every validation example)" in lines


def test_a_bad_set_is_one_line(workspace: Path):
    unknown = workbench(workspace, "eval", "run", "reverse-text", "-m", "tiny", "--set", "no_such_key=1")
    assert (
        unknown.returncode == 1
        and unknown.stderr.strip() == "error: no_such_key: Extra inputs are not permitted"
    )
    shapeless = workbench(
        workspace, "gepa", "run", "reverse-text", "-m", "tiny", "--set", "max_calls", "--dry-run"
    )
    assert shapeless.returncode == 1
    assert (
        shapeless.stderr.strip()
        == "error: --set expects KEY=VALUE (e.g. --set max_steps=20), got 'max_calls'"
    )
