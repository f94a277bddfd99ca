"""`workbench train CONFIG --nproc N`: start N trainer processes on this machine and watch them.

    workbench train configs/rl/reverse-text.toml --nproc 2

Each child is `python -m workbench train ...` (the same arguments, without --nproc) with
RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT set as torchrun
sets them, plus the run folder chosen here, so the parent can name it if a rank dies.

- Rank 0 keeps the terminal (progress bar, step lines, the final summary). The other ranks'
  output goes to a temporary file, shown only if that rank fails.
- Ctrl-C (SIGINT) reaching this process is forwarded once to every rank: they finish the
  step together, rank 0 writes a checkpoint, all exit. Ctrl-C twice: they stop at once; a third
  kills them. Children run in their own sessions, so a terminal's Ctrl-C is not doubled.
- A rank that exits with an error or a signal: the others get a few seconds to exit by themselves
  (a rank that lost its peer exits quietly with PEER_LOST_EXIT), then are terminated; the
  command then fails with one line naming the rank, its exit code and how to resume.

Each rank is a plain `subprocess.Popen` child (a fresh interpreter), as torchrun starts its
workers. Not torchrun itself on one node: its agent stops every rank at the first failure
without telling the culprit from a peer that lost it, and turns a Ctrl-C into a kill after a
timeout; the rules above need the ranks as this process's own children.

Simplifications: one machine; a free port is picked by binding port 0 and releasing it (a
tiny race with other programs); children die with this process (Linux PR_SET_PDEATHSIG).

Several nodes are torchrun's job, not this launcher's: one `torchrun --nnodes N --node-rank K
... -m workbench train CONFIG` per node (docs/distributed.md; tests/test_train_multinode.py runs
two on 127.0.0.1). A `--nnodes` here would re-implement torchrun's rendezvous while watching only
this node's ranks (a rank dying on another node would look like a lost peer, not a culprit), and
torch, hence torchrun, is installed wherever Workbench trains.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from workbench.train.distributed import PEER_LOST_EXIT, RUN_DIR_ENV

GRACE_S = 5.0  # after one rank fails, how long the others may take to exit by themselves
OUTPUT_TAIL_LINES = 20


@dataclass
class Failure:
    rank: int
    code: int
    output: str  # the tail of the rank's own output ("" for rank 0, which printed to the terminal)


def child_env(
    rank: int, nproc: int, port: int, run_dir: Path, visible_devices: str | None = None
) -> dict[str, str]:
    """A rank's environment, as torchrun makes it; `visible_devices`: the trainer's GPUs
    (placement.trainer_visible_devices), so LOCAL_RANK r picks the r-th of them."""
    env = {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        RUN_DIR_ENV: str(run_dir),
    }
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices
    # N processes each using every core oversubscribe the CPU (torchrun sets 1 for the same reason)
    if not env.get("OMP_NUM_THREADS", "").strip():  # the user's own wins (set empty, it is unset)
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    return env


def launch(
    train_args: list[str], nproc: int, run_dir: Path, visible_devices: str | None = None
) -> tuple[int, Failure | None]:
    """Run `workbench train *train_args` as `nproc` ranks; returns (exit code, the failure if any).

    Exit code: 0 when every rank finished, 130 when stopped by Ctrl-C (rank 0's code), 1 on failure.
    """
    port = _free_port()
    logs: list[IO[bytes] | None] = []
    procs: list[subprocess.Popen[bytes]] = []
    interrupts = 0

    def forward(signum: int, frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if interrupts < 3 else signal.SIGKILL)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for rank in range(nproc):
            log = None if rank == 0 else tempfile.TemporaryFile()  # noqa: SIM115 (read after the rank ends)
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "workbench", "train", *train_args],
                    env=child_env(rank, nproc, port, run_dir, visible_devices),
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            )  # noqa: PLW1509 (no threads here)
        failure = _watch(procs)
    finally:
        for proc in procs:
            _stop(proc)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure is not None:
        failure.output = _tail(logs[failure.rank])
    for opened in logs:
        if opened is not None:
            opened.close()
    if failure is not None:
        return 1, failure
    return (130 if procs[0].returncode == 130 else 0), None


def _clean(code: int) -> bool:
    """Finished (0) or stopped after a Ctrl-C with a checkpoint (130: a stop reaches every rank)."""
    return code in (0, 130)


def _watch(procs: list[subprocess.Popen[bytes]]) -> Failure | None:
    """Wait for every rank. The first rank to fail (a rank that lost its peer is never the
    culprit) is returned; after it, the others have GRACE_S to exit before being stopped."""
    failure: Failure | None = None
    lost_peer: Failure | None = None
    deadline: float | None = None
    while any(proc.poll() is None for proc in procs):
        for rank, proc in enumerate(procs):
            code = proc.returncode
            if code is None or _clean(code):
                continue
            if code == PEER_LOST_EXIT:
                lost_peer = lost_peer or Failure(rank, code, "")
            elif failure is None:
                failure = Failure(rank, code, "")
            deadline = deadline or time.monotonic() + GRACE_S
        if deadline is not None and time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for rank, proc in enumerate(procs):  # failures seen only in the last poll
        code = proc.returncode
        if failure is None and code is not None and not _clean(code) and code != PEER_LOST_EXIT:
            failure = Failure(rank, code, "")
    if failure is not None and failure.code == 1 and procs[0].returncode == 1:
        failure = Failure(0, 1, "")  # every rank hit the same error: rank 0 printed it on the terminal
    return failure or lost_peer


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(log: IO[bytes] | None) -> str:
    if log is None:
        return ""
    log.seek(0)
    lines = log.read().decode("utf-8", "replace").splitlines()
    return "\n".join(lines[-OUTPUT_TAIL_LINES:])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL if the launcher dies (no orphaned ranks). Linux only."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
