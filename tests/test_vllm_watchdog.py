"""A launched `vllm serve` has no --parent-pid of its own: it runs under parent_watch's wrapper
and its whole process group dies with the trainer, even on kill -9. Real processes on CPU with
the stand-in executable (tests/fake_vllm.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from workbench.inference.parent_watch import main as wrapper_main

FAKE = [sys.executable, str(Path(__file__).with_name("fake_vllm.py"))]
GROUP_DEATH_S = 30.0  # the watchdog polls every 0.5 s; a loaded machine is slow to schedule

TRAINER = """
import sys
from pathlib import Path
from workbench.inference import vllm_launch
port = vllm_launch.free_port()
server = vllm_launch.ManagedServer([*sys.argv[2:], "serve", "m", "--port", str(port)], Path(sys.argv[1]),
                                   f"http://127.0.0.1:{port}/health", poll_s=0.1, die_with_parent=True)
server.start()
server.wait_until_healthy()
print(server.process.pid, flush=True)
sys.stdin.read()  # until killed
"""


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(_in_group(pid, pgid) for pid in _pids())


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _in_group(pid: int, pgid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[2]) == pgid  # state, ppid, pgrp


def test_the_server_group_dies_with_a_killed_trainer(tmp_path: Path) -> None:
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(tmp_path / "vllm.log"), *FAKE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        group = int(trainer.stdout.readline())  # the server answered /health: the event we wait for
        assert group_alive(group)
        trainer.kill()
        trainer.wait(30)
        deadline = time.monotonic() + GROUP_DEATH_S
        while group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not group_alive(group)
        assert "parent process" in (tmp_path / "vllm.log").read_text()  # the wrapper said why
    finally:
        trainer.kill()
        trainer.wait()


def test_the_wrapper_exits_with_the_commands_code() -> None:
    code = subprocess.run(
        [
            sys.executable,
            "-m",
            "workbench.inference.parent_watch",
            str(os.getpid()),
            "--",
            sys.executable,
            "-c",
            "raise SystemExit(3)",
        ],
        timeout=120,
    ).returncode
    assert code == 3


def test_a_missing_command_or_bad_usage_is_one_line(capsys) -> None:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert wrapper_main([str(os.getpid()), "--", "/no/such/server"]) == 127
        assert capsys.readouterr().err.strip() == "could not start /no/such/server: No such file or directory"
        assert wrapper_main(["serve"]) == 2
    finally:
        for sig, handler in handlers.items():  # main() ignores them for the wrapper's lifetime
            signal.signal(sig, handler)
