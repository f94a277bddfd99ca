"""Run untrusted, model-written Python code in a separate, limited process.

`await run_python(code, SandboxLimits(...))` returns a `SandboxResult` (stdout, stderr, exit
status, which limit was hit, which isolation was active). It never raises for the code's own
failures: environments decide what a failure means (math-python's `python` tool raises
`SandboxError` so the model sees a tool error). Async-friendly: many rollouts run sandboxes
concurrently on one event loop; the child is a subprocess, nothing blocks the loop.

Every run gets, regardless of the OS:
- a separate process in its own session, killed (with its whole process group) at the
  wall-clock timeout;
- rlimits: CPU time (RLIMIT_CPU), address space (RLIMIT_AS), file size (RLIMIT_FSIZE), open
  files, no core dumps;
- a fresh temporary working directory, deleted afterwards;
- an environment with no inherited variables (PATH, LANG, HOME/TMPDIR = the working dir, and
  BLAS thread caps only) and `python -I -S` (no PYTHON* variables, no user site, no .pth code);
- output truncated to `max_output_chars`.

Where the OS allows it (probed on every run by `sandbox_child.py`, reported per result):
- root: new network, mount, pid and IPC namespaces, a fresh /proc, and the code runs as an
  unprivileged uid (65534, nobody) so RLIMIT_NPROC applies;
- not root: the same namespaces inside a user namespace (RLIMIT_NPROC counted per sandbox);
- with a mount namespace (either of the above): /tmp, /var/tmp, /dev/shm, /run/lock and the
  working dir are views of one private tmpfs of `tmp_mb` MB (nothing written there outlives the
  call, the host's files there are invisible), and the workspace (the current directory and
  $WORKBENCH_WORKSPACE: .env files, saved rollouts) and the home directory are covered by an
  empty tmpfs; the interpreter stays readable, and what the caller put in the working dir is
  copied onto the private tmpfs;
- otherwise: RLIMIT_NPROC shared with the user's processes, a Python-level network guard, and the
  host's /tmp and workspace (HOME and TMPDIR still point at the working dir).
Everywhere: no capabilities and no_new_privs (a setuid binary grants nothing).
`python -m workbench.envs.sandbox` prints what is active on this machine.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import signal
import site
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

CHILD = Path(__file__).with_name("sandbox_child.py")
SETUP_FAILED = 125  # keep in sync with sandbox_child.SETUP_FAILED


class SandboxError(RuntimeError):
    """Raised by tools when sandboxed code fails (the message is what the model sees)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    timeout_s: float = 10.0  # wall clock, including interpreter start-up
    cpu_time_s: int = 5  # RLIMIT_CPU: SIGXCPU at this many seconds of CPU
    memory_mb: int = 1024  # RLIMIT_AS: allocations beyond it fail (MemoryError)
    max_processes: int = 16  # RLIMIT_NPROC: processes/threads the code may add
    max_file_mb: int = 64  # RLIMIT_FSIZE: largest file the code may write
    max_open_files: int = 256  # RLIMIT_NOFILE
    max_output_chars: int = 8000  # stdout and stderr are each cut to this many characters
    tmp_mb: int = (
        64  # one private tmpfs for /tmp, /dev/shm, /var/tmp and the working dir (RAM, outside memory_mb)
    )
    sandbox_uid: int = 65534  # the unprivileged uid code runs as when workbench runs as root


@dataclass
class SandboxResult:
    """What happened to one run. `failure` is None when the code ran to a zero exit status."""

    stdout: str
    stderr: str
    exit_code: int | None
    signal: int | None
    timed_out: bool
    duration_s: float
    cpu_s: float | None
    truncated: bool
    isolation: dict[str, str] = field(default_factory=dict)
    limits: SandboxLimits = field(default_factory=SandboxLimits)

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def failure(self) -> str | None:
        """Why the run failed, in one line (which limit was hit, or the exit status)."""
        lim = self.limits
        if self.timed_out:
            return f"timed out: wall-clock limit of {lim.timeout_s:g} s exceeded"
        if self.signal == signal.SIGXCPU or (
            self.cpu_s is not None and self.cpu_s >= lim.cpu_time_s and self.signal == signal.SIGKILL
        ):
            return f"CPU time limit of {lim.cpu_time_s} s exceeded"
        if "MemoryError" in self.stderr:
            return f"memory limit of {lim.memory_mb} MB exceeded (MemoryError)"
        if self.signal == signal.SIGXFSZ:
            return f"file size limit of {lim.max_file_mb} MB exceeded"
        if self.signal is not None:
            return f"killed by signal {signal.Signals(self.signal).name}"
        if self.exit_code == SETUP_FAILED and not self.isolation:
            return "sandbox setup failed"
        if self.exit_code:
            return f"exited with status {self.exit_code}"
        return None

    def describe(self) -> str:
        """Output and failure as one text for the model: stdout, then stderr, then the reason."""
        parts = [self.stdout.rstrip()] if self.stdout.strip() else []
        if self.stderr.strip():
            parts.append(self.stderr.rstrip())
        if self.truncated:
            parts.append("[output truncated]")
        if self.failure:
            parts.append(f"[{self.failure}]")
        return "\n".join(parts) if parts else "(no output: use print() to show results)"


def _minimal_env(workdir: str) -> dict[str, str]:
    """The child's whole environment: nothing inherited, so no API keys or tokens leak."""
    threads = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        **threads,
    }


@functools.lru_cache(maxsize=1)
def _interpreter_paths() -> tuple[list[str], list[str]]:
    """(paths the interpreter needs readable, site-packages dirs to put on the child's sys.path)."""
    site_paths = [p for p in site.getsitepackages() if os.path.isdir(p)]
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return sorted(prefixes | set(site_paths)), site_paths


def _hidden_paths() -> list[str]:
    """What the code must not see besides the host's temp dirs: the workspace (its .env files, other
    runs' results.jsonl) and the home directory. The child adds its own uid's home."""
    paths = [os.environ.get("WORKBENCH_WORKSPACE", ""), os.path.expanduser("~")]
    try:
        paths.append(os.getcwd())  # the workspace by default (see workbench.workspace)
    except OSError:  # the current directory was deleted
        pass
    return sorted({os.path.realpath(p) for p in paths if p})


def _read_capped(handle: IO[bytes], limit_chars: int) -> tuple[str, bool]:
    handle.seek(0)
    raw = handle.read(limit_chars * 4 + 1)
    text = raw.decode("utf-8", errors="replace")
    more = handle.read(1) != b""
    if len(text) > limit_chars or more:
        return text[:limit_chars], True
    return text, False


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Stop a run at its timeout. SIGTERM first: the launcher then SIGKILLs its child and waits
    until the pid namespace is torn down, so no process is orphaned (an orphan would wait for
    the host's init to reap it); SIGKILL the whole group if that takes too long."""
    try:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 2.0)
    except (ProcessLookupError, TimeoutError):
        _kill_group(proc.pid)
        await proc.wait()


def _kill_leftovers(marker: str) -> None:
    """Without a pid namespace, a process that left the group (setsid) survives killpg; its command
    line still names the run's unique working dir, so find it in /proc (best effort)."""
    if not os.path.isdir("/proc"):
        return
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                if marker.encode() in handle.read():
                    os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue


def _parse_report(raw: bytes) -> tuple[dict[str, str], dict[str, object]]:
    isolation: dict[str, str] = {}
    status: dict[str, object] = {}
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "isolation" in record:
            isolation = record["isolation"]
        else:
            status = record
    return isolation, status


async def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as a Python script in the sandbox and return what happened."""
    limits = limits or SandboxLimits()
    workdir = tempfile.mkdtemp(prefix="workbench-sandbox-")
    keep, site_paths = _interpreter_paths()
    started = time.perf_counter()
    timed_out = False
    # Anonymous files (never in the working dir): stdin carries the code, the report fd the
    # isolation and exit status; output files cannot block the child the way a full pipe can.
    with (
        tempfile.TemporaryFile() as code_file,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryFile() as report,
    ):
        code_file.write(code.encode("utf-8", errors="replace"))
        code_file.seek(0)
        config = {
            **asdict(limits),
            "workdir": workdir,
            "report_fd": report.fileno(),
            "keep_paths": keep,
            "site_paths": site_paths,
            "hide_paths": _hidden_paths(),
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                "-u",
                "-B",
                str(CHILD),
                json.dumps(config),
                stdin=code_file,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env=_minimal_env(workdir),
                pass_fds=(report.fileno(),),
                start_new_session=True,
            )
            try:
                await asyncio.wait_for(proc.wait(), limits.timeout_s)
            except TimeoutError:
                timed_out = True
                await _stop(proc)
            finally:  # also on cancellation: never leave sandboxed processes behind
                _kill_group(proc.pid)
            stdout, cut_out = _read_capped(out, limits.max_output_chars)
            stderr, cut_err = _read_capped(err, limits.max_output_chars)
            report.seek(0)
            isolation, status = _parse_report(report.read())
            if not isolation.get("pid_namespace", "").startswith("yes"):
                await asyncio.to_thread(_kill_leftovers, workdir)
        finally:
            await asyncio.to_thread(shutil.rmtree, workdir, True)
    return _result(
        limits,
        stdout,
        stderr,
        cut_out or cut_err,
        isolation,
        status,
        proc.returncode,
        timed_out,
        time.perf_counter() - started,
    )


def _result(
    limits: SandboxLimits,
    stdout: str,
    stderr: str,
    truncated: bool,
    isolation: dict[str, str],
    status: dict[str, object],
    returncode: int | None,
    timed_out: bool,
    duration_s: float,
) -> SandboxResult:
    """Assemble a result from the child's report (or, without one, the launcher's exit status)."""
    if isolation:  # the layers every run gets, whatever the OS allows
        working_dir = "fresh temporary directory, deleted afterwards"
        if isolation.get("tmp", "").startswith("private"):
            working_dir += " (the code works in a copy on its private tmpfs)"
        isolation = {
            "process": "separate process group, killed at the wall-clock timeout",
            **isolation,
            "environment": "nothing inherited (PATH, LANG, HOME/TMPDIR = working dir)",
            "working_dir": working_dir,
            "rlimits": f"CPU {limits.cpu_time_s} s, memory {limits.memory_mb} MB, "
            f"files {limits.max_file_mb} MB, {limits.max_open_files} open files",
        }
    exit_code, sig, cpu_s = status.get("exit_code"), status.get("signal"), status.get("cpu_s")
    if timed_out and not status:  # the code was killed before it could finish
        exit_code, sig = None, int(signal.SIGKILL)
    elif not status and returncode is not None:  # no report: the launcher itself ended
        exit_code, sig = (returncode, None) if returncode >= 0 else (None, -returncode)
    return SandboxResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        signal=sig if isinstance(sig, int) else None,
        timed_out=timed_out,
        duration_s=round(duration_s, 3),
        cpu_s=float(cpu_s) if isinstance(cpu_s, (int, float)) else None,
        truncated=truncated,
        isolation=isolation,
        limits=limits,
    )


def run_python_sync(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Blocking form of `run_python` (not from inside a running event loop)."""
    return asyncio.run(run_python(code, limits))


@functools.lru_cache(maxsize=1)
def isolation_report() -> dict[str, str]:
    """Which isolation layers are active on this machine (probed once with an empty script)."""
    return run_python_sync("pass", SandboxLimits(timeout_s=30)).isolation


def main() -> None:
    """`python -m workbench.envs.sandbox`: print the active isolation, one layer per line."""
    report = isolation_report()
    if not report:
        print("sandbox did not start: see `run_python_sync('print(1)')` for the error")
        raise SystemExit(1)
    width = max(len(k) for k in report)
    for key, value in report.items():
        print(f"{key.ljust(width)}  {value}")


if __name__ == "__main__":
    main()
