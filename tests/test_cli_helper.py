"""tests/cli.py: a command run in the test process answers as the same command in a process of its
own (exit code, stdout, stderr), and leaves this process's environment and directory as they were."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cli

WORKBENCH = [sys.executable, "-m", "workbench"]


@pytest.mark.parametrize(
    "args",
    [
        ["env", "list", "--json"],
        ["eval", "run", "no-such-env", "-m", "tiny"],  # a user error: one line, exit 1
        ["train", "--frobnicate"],  # a usage error: Click's message, exit 2
    ],
)
def test_in_process_answers_as_a_process_does(tmp_path: Path, args: list[str]) -> None:
    env = {**os.environ, "WORKBENCH_WORKSPACE": str(tmp_path)}
    here = cli.run([*WORKBENCH, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
    real = subprocess.run(
        [*WORKBENCH, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert (here.returncode, here.stdout, here.stderr) == (real.returncode, real.stdout, real.stderr)


def test_the_environment_and_directory_are_given_back(tmp_path: Path) -> None:
    before_env, before_cwd = dict(os.environ), os.getcwd()
    env = {**os.environ, "WORKBENCH_WORKSPACE": str(tmp_path), "WB_TEST_ONLY_IN_THE_COMMAND": "1"}
    env.pop("HOME", None)
    done = cli.run([*WORKBENCH, "env", "list"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert dict(os.environ) == before_env and os.getcwd() == before_cwd


def test_what_a_started_process_would_read_differently_runs_as_one() -> None:
    assert cli.in_process([*WORKBENCH, "env", "list"], {**os.environ, "WORKBENCH_WORKSPACE": "/x"})
    assert cli.in_process([*WORKBENCH, "env", "list"], {**os.environ, "HF_HUB_OFFLINE": "1"})
    assert not cli.in_process([*WORKBENCH, "env", "list"], {**os.environ, "PYTHONPATH": "/elsewhere"})
    assert not cli.in_process([*WORKBENCH, "env", "list"], {**os.environ, "HF_HOME": "/elsewhere"})
    assert not cli.in_process([sys.executable, "-c", "pass"], None)
