"""A workspace environment that holds a run at a point the test chooses, for tests that stop,
interrupt or kill training (where rollouts come from the in-process model, so there is no
server for the test to hold).

`held-reverse` is `reverse-text` (same data, rubric and prompts) whose first rollout to start
once the file `hold_after` exists (optionally: only in the process with RANK=`rank`) writes
its pid to the file `held` and waits, before generating, until the file `release` exists
(with no `release`: until the process is killed). Every other rollout runs as usual, and a
run that finds `held` already there (a resume) is never held again. So the test knows exactly
where the run is when it signals it: mid-step, with every earlier step done.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import IO

ENV_ID = "held-reverse"

HELD_ENV = '''
"""reverse-text, held once at a point the test chooses (see tests/held_env.py)."""

import asyncio
import os
import sys
import time
from pathlib import Path

from workbench.envs.loader import load_environment as load


def load_environment(hold_after: str, held: str, release: str = "", rank: int = -1, max_hold_s: float = 900,
                     **reverse_text_args):
    env = load("reverse-text", **reverse_text_args)
    rollout = env.rollout

    async def held_rollout(client, example, sampling):
        mine = rank < 0 or os.environ.get("RANK", "0") == str(rank)
        if mine and Path(hold_after).exists() and not Path(held).exists():
            tmp = Path(held + ".tmp")
            tmp.write_text(str(os.getpid()))
            tmp.replace(held)  # atomic: the test never reads a half-written pid
            print(f"held-reverse: holding in pid {os.getpid()}", file=sys.stderr, flush=True)
            deadline = time.monotonic() + max_hold_s  # only so a failed test leaves no process behind
            while not (release and Path(release).exists()) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        return await rollout(client, example, sampling)

    env.rollout = held_rollout
    return env
'''


def write_held_env(workspace: Path) -> None:
    """Put `held-reverse` in the workspace's environments/ folder."""
    folder = workspace / "environments" / "held_reverse"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "held_reverse.py").write_text(HELD_ENV)


def held_env_toml(
    workspace: Path, *, hold_after: Path, held: Path, release: Path | None = None, rank: int | None = None
) -> str:
    """The `[[env]]` table for a train config (after writing the env into `workspace`)."""
    write_held_env(workspace)
    args = {"hold_after": str(hold_after), "held": str(held)}
    if release is not None:
        args["release"] = str(release)
    if rank is not None:
        args["rank"] = rank
    inline = ", ".join(f"{key} = {json.dumps(value)}" for key, value in args.items())
    return f'[[env]]\nid = "{ENV_ID}"\nargs = {{ {inline} }}\n'


class Drain:
    """Reads a child's pipe in a thread (so it never fills), keeping the text, so a test can
    wait for a line the child prints as it goes."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._chunks: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with self._stream:
            for line in self._stream:
                with self._cond:
                    self._chunks.append(line)
                    self._cond.notify_all()

    @property
    def text(self) -> str:
        with self._cond:
            return "".join(self._chunks)

    def wait_for(self, needle: str, timeout: float = 120) -> None:
        """Until `needle` has been printed (the timeout only bounds a failure)."""
        with self._cond:
            if not self._cond.wait_for(lambda: needle in "".join(self._chunks), timeout):
                raise AssertionError(f"{needle!r} not printed within {timeout}s:\n{''.join(self._chunks)}")

    def close(self) -> str:
        """All of it, once the child has closed the pipe (it exited)."""
        self._thread.join(60)
        return self.text
