"""One process owns a run folder: `claim_run` takes `run.lock` in it (an exclusive `flock`, with
the owner's pid written inside) before a run writes anything, so a second writer — a second
`train --resume RUN`, an `eval run -R` of a run still going — stops at once with "RUN is in use by
pid N" instead of interleaving its steps and checkpoints with the first.

The kernel drops a `flock` when its process ends however it ends (kill -9 included), so a lock
is never stale: a lock file whose process is gone is simply taken. Readers (listings, the TUI)
never lock; they read the pid (`lock_owner`). Processes forked from the owner share its lock.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from workbench.errors import UserError

LOCK_FILE = "run.lock"


class RunLock:
    """A held run lock; `release()` when the run is over (the process ending releases it too)."""

    def __init__(self, run_dir: Path, fd: int) -> None:
        self.run_dir, self._fd, self._depth = run_dir, fd, 1

    def nest(self) -> None:
        """This process claims the run again (a resume of its own run): one more release to go."""
        self._depth += 1

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd >= 0:
            _held.pop(self.run_dir, None)
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = -1

    def release_fully(self) -> None:
        self._depth = 1
        self.release()


_held: dict[Path, RunLock] = {}  # this process's locks: claiming a run it already owns nests


def claim_run(run_dir: Path) -> RunLock:
    """Own `run_dir` (created if missing) for this process. UserError naming the owner's pid when
    another process holds it."""
    key = run_dir.resolve()
    if (held := _held.get(key)) is not None:
        held.nest()
        return held
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UserError(f"cannot create the run folder {run_dir}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        owner = lock_owner(run_dir)
        by = f"pid {owner}" if owner else "another process"
        raise UserError(
            f"{run_dir} is in use by {by}: one process writes a run at a time "
            "(wait for it to finish, or stop it first)"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    lock = _held[key] = RunLock(key, fd)
    return lock


def lock_owner(run_dir: Path) -> int | None:
    """The pid written by the run's last owner (it may have ended: check it is alive)."""
    try:
        return int((run_dir / LOCK_FILE).read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


@contextmanager
def releasing_claims() -> Iterator[None]:
    """Release, on the way out, every run this process claimed inside the block (a run started
    in-process — the TUI, tests, code — frees its folder when it ends, not when the process does)."""
    before = set(_held)
    try:
        yield
    finally:
        for key in set(_held) - before:
            _held[key].release_fully()
