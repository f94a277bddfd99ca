"""Drive a program in a real terminal: a private tmux server (its own socket, so nothing is shared
with a user's tmux or another test), one window of a fixed size, keys sent with `send-keys`, the
screen read with `capture-pane`.

Waiting is polling the screen: `wait_for` captures it until a condition holds, up to a deadline,
and fails with the last screen (and says so when the program exited: the pane stays, showing its
last output, because `remain-on-exit` is on). `close` ends the server, then every process still
running in the program's working folder (children that started sessions of their own, which a
closing terminal does not reach), by pid."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

TMUX = shutil.which("tmux")
POLL_S = 0.1  # between two captures while waiting: the screen is the event; this only spares the CPU


class ScreenTimeout(AssertionError):
    """What was awaited did not appear on the screen in time."""


class Tmux:
    """`Tmux(name)`: a tmux server of its own, on a socket in a folder of its own (removed by
    `close`); `start` opens the program in it."""

    def __init__(self, name: str, *, width: int = 160, height: int = 45) -> None:
        if TMUX is None:
            raise RuntimeError("tmux is not installed")
        self.name, self.width, self.height = name, width, height
        # /tmp, not pytest's tmp_path: a socket's path must stay under about 100 characters
        self.folder = Path(tempfile.mkdtemp(prefix="wb-tmux-"))
        self.socket = str(self.folder / "socket")
        self.target = f"{name}:0.0"
        self.cwd: Path | None = None
        self.screen = ""  # the last capture
        self.cursor = (0, 0)  # where the terminal's cursor was then (column, row): a focused input's

    def tmux(self, *args: str, check: bool = True) -> str:
        assert TMUX is not None
        done = subprocess.run(
            [TMUX, "-S", self.socket, "-f", os.devnull, *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {done.stderr.strip() or done.returncode}")
        return done.stdout

    def start(self, command: list[str], *, cwd: Path, env: Mapping[str, str]) -> None:
        """Open `command` in a detached width x height window, in `cwd`. `env` is the server's
        environment (a new tmux server takes its client's), so the program gets it."""
        self.cwd = cwd
        assert TMUX is not None
        subprocess.run(
            [
                TMUX,
                *("-S", self.socket, "-f", os.devnull),
                "start-server",
                ";",
                *("set-option", "-g", "remain-on-exit", "on"),  # a crash stays readable
                ";",
                *("new-session", "-d", "-s", self.name, "-x", str(self.width), "-y", str(self.height)),
                *("-c", str(cwd), subprocess.list2cmdline(command)),
            ],
            env=dict(env),
            check=True,
            capture_output=True,
            timeout=30,
        )

    # ----- keys ----------------------------------------------------------------------------------
    def press(self, *keys: str) -> None:
        """Keys by tmux's names: Enter, Escape, Tab, Space, Up, Down, Home, S-End, C-s, or a letter."""
        self.tmux("send-keys", "-t", self.target, *keys)

    def type(self, text: str) -> None:
        """`text` as typed, character by character (no key names)."""
        self.tmux("send-keys", "-t", self.target, "-l", text)

    # ----- the screen ----------------------------------------------------------------------------
    def capture(self) -> tuple[str, bool]:
        """(the visible screen, whether the program has exited), and the cursor, in one tmux call."""
        out = self.tmux(
            *("capture-pane", "-p", "-t", self.target),
            ";",
            *("display-message", "-p", "-t", self.target, "#{pane_dead} #{cursor_x} #{cursor_y}"),
        )
        text, _, state = out.rstrip("\n").rpartition("\n")
        dead, x, y = state.split()
        self.screen, self.cursor = text, (int(x), int(y))
        return text, dead == "1"

    @property
    def cursor_line(self) -> str:
        """The screen's line the cursor was on at the last capture. Textual puts the terminal's
        cursor in the focused input: a key typed next goes there, once this line says so (a key
        sent right after Tab may still reach the field that had the focus)."""
        lines = self.screen.splitlines()
        return lines[self.cursor[1]] if self.cursor[1] < len(lines) else ""

    def wait_for(
        self, condition: str | re.Pattern[str] | Callable[[str], Any], what: str = "", timeout: float = 120.0
    ) -> Any:
        """Capture the screen until `condition` holds: a text on it, a regex that matches it (the
        match is returned), or a function of the screen that returns something true (returned).
        ScreenTimeout after `timeout` seconds, or at once when the program exited, with the screen."""
        if isinstance(condition, str):
            text = condition
            check: Callable[[str], Any] = lambda screen: text in screen  # noqa: E731
            what = what or repr(text)
        elif isinstance(condition, re.Pattern):
            pattern = condition
            check = lambda screen: pattern.search(screen)  # noqa: E731
            what = what or f"/{pattern.pattern}/"
        else:
            check = condition
        deadline = time.monotonic() + timeout
        while True:
            screen, dead = self.capture()
            found = check(screen)
            if found:
                return found
            if dead:
                raise ScreenTimeout(
                    f"the program exited while waiting for {what}; its last screen:\n{screen}"
                )
            if time.monotonic() >= deadline:
                raise ScreenTimeout(f"waited {timeout:g} s for {what}; the last screen:\n{screen}")
            time.sleep(POLL_S)

    def wait_for_exit(self, timeout: float = 60.0) -> str:
        """Capture the screen until the program has exited; its last screen. ScreenTimeout after
        `timeout` seconds, with the screen."""
        deadline = time.monotonic() + timeout
        while True:
            screen, dead = self.capture()
            if dead:
                return screen
            if time.monotonic() >= deadline:
                raise ScreenTimeout(f"the program still runs {timeout:g} s later; its screen:\n{screen}")
            time.sleep(POLL_S)

    # ----- the end -------------------------------------------------------------------------------
    def close(self, timeout: float = 60.0) -> list[str]:
        """End the server (the program gets SIGHUP), then every process still running in the
        program's folder: SIGTERM, then SIGKILL for what is left `timeout` / 2 later. Returns the
        command lines of the processes that were still there after all that (should be none)."""
        self.tmux("kill-server", check=False)
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.cwd is None:
            return []
        deadline = time.monotonic() + timeout / 2
        sent: set[int] = set()
        while (left := processes_in(self.cwd)) and time.monotonic() < deadline:
            for pid in left.keys() - sent:
                _signal(pid, signal.SIGTERM)
                sent.add(pid)
            time.sleep(POLL_S)
        for pid in left:
            _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout / 2
        while (left := processes_in(self.cwd)) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return list(left.values())


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def processes_in(folder: Path) -> dict[int, str]:
    """{pid: command line} of this user's live processes whose working folder is `folder` or
    inside it (a zombie has none: it is gone already, waiting to be reaped)."""
    root = folder.resolve()
    found: dict[int, str] = {}
    uid = os.getuid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            cwd = Path(os.readlink(entry / "cwd"))
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cwd == root or cwd.is_relative_to(root):
            found[int(entry.name)] = command
    return found
