"""Exit when the process that started us is gone: `workbench serve --parent-pid PID`.

A training run with `[inference] launch = true` starts its `workbench serve` replicas each in a
process group of their own (so a terminal's Ctrl-C reaches the trainer alone, and stopping a
replica reaches everything it forked). The price: a group of children does not die with its
parent. The trainer stops them on every exit it lives through (normal end, Ctrl-C, an error);
this watchdog covers the one it does not — `kill -9` of the trainer.

Why a polling thread and not Linux's PR_SET_PDEATHSIG: that signal fires when the *thread*
that forked the child exits, and launchers start servers from worker threads (asyncio's
`to_thread`) that come and go; it is also Linux-only. Polling `os.getppid()` every half second
sees the parent's death on any POSIX system, whichever thread forked us: an orphan is
re-parented (to init or a subreaper), so its parent pid changes the moment the parent dies,
even while the dead parent is an unreaped zombie.

A server with no `--parent-pid` of its own (`vllm serve`) runs under this module as a wrapper:

    python -m workbench.inference.parent_watch PARENT_PID -- vllm serve ...

The wrapper leads the server's process group, runs the command in it and waits; when PARENT_PID
dies it kills the whole group (the server and every worker it forked).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from workbench.store.runs import pid_alive

POLL_S = 0.5


def parent_gone(parent_pid: int, started_as_child: bool) -> bool:
    """Whether `parent_pid` has died. As its child we trust our parent pid (a zombie parent
    still answers kill(pid, 0)); otherwise we can only ask whether the pid exists."""
    if started_as_child:
        return os.getppid() != parent_pid
    return not pid_alive(parent_pid)


def watch_parent(parent_pid: int, *, poll_s: float = POLL_S) -> threading.Thread:
    """Start a daemon thread that ends this process (and its process group, when this process
    leads one) once `parent_pid` is gone. Returns the thread."""
    started_as_child = os.getppid() == parent_pid
    if not started_as_child and parent_gone(parent_pid, False):
        _exit(parent_pid)

    def run() -> None:
        while not parent_gone(parent_pid, started_as_child):
            time.sleep(poll_s)
        _exit(parent_pid)

    thread = threading.Thread(target=run, name="parent-watch", daemon=True)
    thread.start()
    return thread


def _exit(parent_pid: int) -> None:
    print(f"parent process {parent_pid} is gone: exiting", file=sys.stderr, flush=True)
    if os.getpgrp() == os.getpid():  # we lead our own group (start_new_session): take our children along
        try:
            os.killpg(os.getpid(), signal.SIGKILL)
        except OSError:
            pass
    os._exit(1)  # no graceful shutdown: nobody is left to talk to


def watched_command(command: Sequence[str], parent_pid: int) -> list[str]:
    """`command` run under the wrapper, so it dies with `parent_pid` (see the module docstring)."""
    return [sys.executable, "-m", "workbench.inference.parent_watch", str(parent_pid), "--", *command]


def main(argv: Sequence[str]) -> int:
    """The wrapper: run `argv[2:]` (after PARENT_PID and "--") and exit with its code."""
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m workbench.inference.parent_watch PARENT_PID -- COMMAND...", file=sys.stderr)
        return 2
    parent_pid = int(argv[0])
    # A stop signals the whole group: the command gets it too, and the wrapper waits for its exit.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    try:
        child = subprocess.Popen(list(argv[2:]), preexec_fn=_default_signals)  # preexec_fn: no threads yet
    except OSError as exc:
        print(f"could not start {argv[2]}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    watch_parent(parent_pid)
    return child.wait()


def _default_signals() -> None:
    """In the command, before exec: SIGTERM/SIGINT as usual (ignored ones would be inherited)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
