"""workbench.fork_launch: ranks and replicas forked from their launcher behave as fresh ones.

The forking side runs in a fresh interpreter started here (a pytest worker has threads of its
own, so it never forks): it starts children with `WorkbenchPopen` and reports what it saw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from workbench.fork_launch import fork_refusal
from workbench.train.distributed import RUN_DIR_ENV

REPO = Path(__file__).resolve().parents[1]

LAUNCHER = r"""
import json, os, subprocess, sys, tempfile, urllib.request
from workbench.fork_launch import WorkbenchPopen
from workbench.train.launch import preload

preload(sys.argv[1])  # what `workbench train --nproc N` imports before it starts its ranks

mine = tempfile.TemporaryDirectory()  # a child's exit must not remove what belongs to the parent
report = {}
listing = WorkbenchPopen([sys.executable, "-m", "workbench", "env", "list", "--json"], stdout=subprocess.PIPE,
                         env={**os.environ, "RANK": "1", "OMP_NUM_THREADS": "1"})
report["list"] = {"forked": listing.forked, "out": listing.communicate()[0].decode(), "code": listing.returncode}
server = WorkbenchPopen([sys.executable, "-m", "workbench", "serve", sys.argv[1], "--port", "0"],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
for line in server.stdout:
    if b"http://" in line:
        url = line.decode().split(" at ")[1].split()[0]
        break
with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=30) as answer:
    report["health"] = answer.status
report["serve"] = {"forked": server.forked, "cmdline": open(f"/proc/{server.pid}/cmdline", "rb").read().decode(),
                   "own_session": os.getsid(server.pid) == server.pid}
server.terminate()
report["serve"]["code"] = server.wait(30)
report["temp_dir_kept"] = os.path.isdir(mine.name)
print(json.dumps(report))
"""


def test_forked_children_run_their_own_command_and_leave_the_parent_alone(tiny_model: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(tiny_model)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    fresh = subprocess.run(
        [sys.executable, "-m", "workbench", "env", "list", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert report["list"] == {
        "forked": True,
        "out": fresh.stdout,
        "code": 0,
    }  # same output as a fresh interpreter's
    serve = report["serve"]
    assert serve["forked"] and report["health"] == 200
    assert serve["cmdline"].startswith(
        f"{sys.executable} -m workbench serve {tiny_model}"
    )  # ps shows the child's command
    assert serve["own_session"] and serve["code"] == 0  # start_new_session honoured; SIGTERM is a clean stop
    assert report["temp_dir_kept"]


def test_what_would_make_a_different_child_is_refused() -> None:
    command = [sys.executable, "-m", "workbench", "train", "rl.toml"]
    assert fork_refusal([sys.executable, "-m", "pip", "list"], None) == "not a `python -m workbench` command"
    refusal = fork_refusal(command, {**os.environ, "HF_HOME": "/elsewhere"})
    assert refusal == "the child's environment differs in HF_HOME"  # read when huggingface_hub is imported
    # what the launchers set for each rank or replica is read after start-up: no refusal for the environment
    rank_env = {
        **os.environ,
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_PORT": "1234",
        RUN_DIR_ENV: "runs/x",
        "OMP_NUM_THREADS": "1",
    }
    assert not (fork_refusal(command, rank_env) or "").startswith("the child's environment")
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert fork_refusal(command, None) == "another thread is running"
    finally:
        stop.set()
        worker.join()
    os.environ["WORKBENCH_FORK_LAUNCH"] = "0"
    try:
        assert fork_refusal(command, None) == "WORKBENCH_FORK_LAUNCH=0"
    finally:
        del os.environ["WORKBENCH_FORK_LAUNCH"]
