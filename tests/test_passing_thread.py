"""`in_passing_thread`: torch work done before or between a LocalClient's decoding leaves no
OpenMP thread team behind in the caller's thread (a team there throttles every parallel op of
the client's decode thread; see `inference.passing_thread` for the measurement)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.inference.passing_thread import in_passing_thread

# Counts this process's OS threads after a parallel op run in a passing thread, then after the
# same op in the main thread (the control: a team there stays, so the count can tell). The
# passing thread's team ends just after the thread is joined (its exit runs OpenMP's cleanup):
# the count is read until it is back, with a deadline that only a team left behind reaches.
_PROBE = """
import os, time, torch
from workbench.inference.passing_thread import in_passing_thread
def threads():
    return len(os.listdir("/proc/self/task"))
before = threads()
in_passing_thread(lambda: torch.ones(4_000_000).add_(1))
deadline = time.monotonic() + 30
while threads() > before and time.monotonic() < deadline:
    time.sleep(0.01)
passing = threads()
torch.ones(4_000_000).add_(1)
print(before, passing, threads())
"""


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="counts threads in /proc")
def test_work_in_a_passing_thread_leaves_no_thread_team_behind() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, check=True)
    before, passing, here = map(int, out.stdout.split())
    assert passing == before
    assert here > before  # the same op in this thread keeps a team


def test_result_and_errors_come_back() -> None:
    assert in_passing_thread(lambda: 41 + 1) == 42

    def fail() -> None:
        raise OSError("broken config.json")

    with pytest.raises(OSError, match="broken config.json"):
        in_passing_thread(fail)
