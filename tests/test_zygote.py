"""The tests' pre-imported `python -m workbench` (tests/zygote.py): a forked child is the
command a fresh interpreter would have run (argv, cwd, environment, pipes, exit status,
signals), and anything the zygote cannot stand in for starts fresh."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import zygote

WORKBENCH = [sys.executable, "-m", "workbench"]


@pytest.fixture(autouse=True)
def zygote_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the zygote: on even in a suite run with WORKBENCH_TEST_ZYGOTE=0."""
    monkeypatch.setenv("WORKBENCH_TEST_ZYGOTE", "1")


def test_a_forked_child_prints_and_exits_as_a_fresh_one(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_WORKSPACE"}
    command = [*WORKBENCH, "setup", "ws", "--skip-model"]
    forked = zygote.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = forked.communicate(timeout=300)
    assert forked.forked and forked.returncode == 0, err
    assert (tmp_path / "ws" / "configs").is_dir()  # the child ran in the cwd it was given
    fresh = subprocess.run(command, cwd=tmp_path / "ws", env=env, capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr
    assert (
        out.replace(str(tmp_path / "ws"), "WS").splitlines()[0]
        == fresh.stdout.replace(str(tmp_path / "ws" / "ws"), "WS").splitlines()[0]
    )

    bad = zygote.Popen(
        [*WORKBENCH, "eval", "run", "no-such-env", "-m", "tiny"],
        cwd=tmp_path / "ws",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = bad.communicate(timeout=300)
    assert bad.forked and bad.returncode == 1 and out == ""
    assert err.startswith("error: unknown environment 'no-such-env'") and len(err.splitlines()) == 1


def test_the_environment_and_stdin_are_the_childs_own(tmp_path: Path):
    """`WORKBENCH_WORKSPACE` (read at run time) reaches the child; the workspace it names is used."""
    workspace = tmp_path / "elsewhere"
    assert (
        subprocess.run(
            [*WORKBENCH, "setup", str(workspace), "--skip-model"], capture_output=True, timeout=300
        ).returncode
        == 0
    )
    listed = zygote.Popen(
        [*WORKBENCH, "env", "list", "--json"],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "WORKBENCH_WORKSPACE": str(workspace)},
    )
    out, err = listed.communicate("", timeout=300)
    assert listed.forked and listed.returncode == 0, err
    listing = {env["id"]: env["origin"] for env in json.loads(out)}
    assert listing["reverse-text"] == "workspace"  # found in the workspace the variable named


def test_signals_reach_the_child_and_its_status_comes_back(tiny_model: Path, tmp_path: Path):
    server = zygote.Popen(
        [*WORKBENCH, "serve", str(tiny_model), "--port", "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.forked
        assert "http://127.0.0.1:" in server.stdout.readline()  # serving: it lives until we stop it
        assert server.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            server.wait(timeout=0.05)
        server.send_signal(signal.SIGKILL)
        assert server.wait(timeout=60) == -signal.SIGKILL
    finally:
        server.kill()
        server.stdout.close()


def test_what_the_zygote_cannot_stand_in_for_starts_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # a variable a library reads when imported (huggingface_hub's cache folder)
    moved = zygote.Popen(
        [*WORKBENCH, "--help"], env={**os.environ, "HF_HOME": str(tmp_path)}, stdout=subprocess.DEVNULL
    )
    # not a workbench command
    other = zygote.Popen([sys.executable, "-c", "pass"])
    monkeypatch.setenv("WORKBENCH_TEST_ZYGOTE", "0")
    switched_off = zygote.Popen([*WORKBENCH, "--help"], stdout=subprocess.DEVNULL)
    for process in (moved, other, switched_off):
        assert process.wait(timeout=300) == 0 and not process.forked
