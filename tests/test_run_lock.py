"""One process writes a run at a time (issue 33, item 2): while a run is going, a second writer
(`eval run -R` of the same run, `train --resume` of a running training) stops at once with
"RUN is in use by pid N" and changes nothing; the first finishes as if alone. A lock whose owner
is gone (killed) is taken without a word."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import EchoBackend, Gate, first_prompts, make_app, serve_in_thread
from tests.test_eval_run import results_lines, start_cli
from workbench.errors import UserError
from workbench.store.lock import claim_run, lock_owner, releasing_claims


def test_a_second_eval_of_a_running_run_is_refused_and_the_first_finishes(tmp_path: Path):
    gate = Gate(first_prompts(2))
    with serve_in_thread(make_app(EchoBackend(), middlewares=(gate.middleware,))) as url, gate:
        args = [
            "eval",
            "run",
            "reverse-text",
            "-m",
            "echo",
            "-b",
            f"{url}/v1",
            "-n",
            "6",
            "-r",
            "2",
            "-c",
            "2",
        ]
        first = start_cli(*args, cwd=tmp_path)
        gate.wait_held(proc=first)  # the first run is provably mid-flight
        second = start_cli(*args, "-R", "latest", cwd=tmp_path)
        _, err = second.communicate(timeout=300)
        assert second.returncode == 1, err
        assert f"is in use by pid {first.pid}" in err and "Traceback" not in err, err
        gate.open()
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out + err
    run_dir = next((tmp_path / "environments").rglob("metadata.json")).parent
    lines = results_lines(run_dir)
    assert len(lines) == 12 and len({(r["example_id"], r["rollout_index"]) for r in lines}) == 12
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "finished"
    assert lock_owner(run_dir) == first.pid  # the pid stays for readers; the lock itself is free
    with releasing_claims():
        claim_run(run_dir)  # free again: this process takes it at once


def test_a_lock_whose_owner_died_is_taken(tmp_path: Path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib, sys; from workbench.store.lock import claim_run; "
            f"claim_run(pathlib.Path({str(tmp_path)!r})); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"  # it owns the run now
        assert lock_owner(tmp_path) == holder.pid
        with pytest.raises(UserError, match=f"in use by pid {holder.pid}"):
            claim_run(tmp_path)
    finally:
        holder.kill()  # like kill -9: no clean-up runs
        holder.wait()
    with releasing_claims():
        lock = claim_run(tmp_path)
        assert lock_owner(tmp_path) == os.getpid() and lock.run_dir == tmp_path.resolve()


def test_claims_nest_within_one_process_and_release_at_the_end(tmp_path: Path):
    with releasing_claims():
        claim_run(tmp_path)
        claim_run(tmp_path)  # the same process resuming its own run: no conflict
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from workbench.store.lock import claim_run; claim_run(__import__('pathlib').Path({str(tmp_path)!r}))",
        ],
        capture_output=True,
        text=True,
    )
    assert child.returncode == 0, child.stderr
