"""Start `python -m workbench ...` children by forking this process, not a new interpreter.

A trainer rank (`workbench train --nproc N`) or an inference replica (`[inference] launch`)
spends most of its start-up importing torch and transformers: about 7 of its first 8 CPU-seconds
on 2 cores, before it does anything. The process starting it has usually imported them already
(the launcher preloads them, a trainer has them anyway), so `WorkbenchPopen` forks it and the
child runs `python -m workbench ARGS` in the copy: only the imports are shared (copy-on-write, so
N ranks also hold one copy of the libraries' pages), and the child gets its own argv, environment,
cwd, stdio, session and signals, as a fresh interpreter would.

It forks only when that is safe and gives the same child; otherwise it starts a fresh interpreter
as `subprocess.Popen` does (`WorkbenchPopen.forked` says which):
- Linux only (fork after library imports is unsafe on macOS), and not with
  `WORKBENCH_FORK_LAUNCH=0` in the environment;
- no thread but this one (an idle `threading.Timer`, start-up's garbage-collector fallback,
  excepted, and library pools recorded by `note_idle_threads` before any computation): a lock held
  by another thread at the fork stays held forever in the child. Torch's OpenMP workers, started by
  its first parallel operation, rule it out (a forked child that computes then hangs);
- CUDA not initialized in this process (a CUDA context cannot cross a fork);
- the child's environment differs from this process's only in variables read after start-up
  (`_RUNTIME_VARIABLES`: the rank and rendezvous, the run folder, the visible GPUs, the thread
  count, which the child applies with `torch.set_num_threads` as a fresh process would take it);
- the plain Popen arguments the launchers use (no shell, executable, pass_fds, uid/gid/umask).

The child side (`run_module_as_main`, `fresh_stdio`, `default_signals`) is also what the tests'
zygote (tests/zygote.py) runs in the children it forks.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib.util
import io
import os
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Mapping
from typing import Any

DISABLE_VARIABLE = "WORKBENCH_FORK_LAUNCH"
# Read by the child after it starts (torch.distributed's rendezvous, the trainer's run folder,
# CUDA when it first initializes) or applied by the child itself (OMP_NUM_THREADS): a child may
# get values of its own for these and still be forked.
_RUNTIME_VARIABLES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORKBENCH_TRAIN_RUN_DIR",
        "CUDA_VISIBLE_DEVICES",
        "OMP_NUM_THREADS",
    }
)


_idle_threads: frozenset[int] = frozenset()  # native library threads known to be idle (note_idle_threads)


class WorkbenchPopen(subprocess.Popen):  # type: ignore[type-arg] - bytes or text, as the caller asks
    """`subprocess.Popen` for `[sys.executable, "-m", "workbench", ...]` whose child is a fork of
    this process when that is safe (see the module docstring), a fresh interpreter otherwise.
    `wait`, `poll`, signals, pipes and return codes are Popen's own: the child is ours either way."""

    forked = False  # whether this child is a fork of this process (False: a fresh interpreter)

    def _execute_child(
        self,
        args: Any,
        executable: Any,
        preexec_fn: Any,
        close_fds: bool,
        pass_fds: Any,
        cwd: Any,
        env: Any,
        startupinfo: Any,
        creationflags: Any,
        shell: bool,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        restore_signals: bool,
        gid: Any,
        gids: Any,
        uid: Any,
        umask: int,
        start_new_session: bool,
        process_group: Any,
    ) -> None:
        plain = (
            not shell
            and executable is None
            and close_fds
            and not pass_fds
            and gid is None
            and gids is None
            and uid is None
            and umask == -1
        )
        if not plain or fork_refusal(args, env) is not None:
            super()._execute_child(
                args,
                executable,
                preexec_fn,
                close_fds,
                pass_fds,
                cwd,
                env,
                startupinfo,  # type: ignore[misc]
                creationflags,
                shell,
                p2cread,
                p2cwrite,
                c2pread,
                c2pwrite,
                errread,
                errwrite,
                restore_signals,
                gid,
                gids,
                uid,
                umask,
                start_new_session,
                process_group,
            )
            return
        child_env = {
            os.fsdecode(k): os.fsdecode(v) for k, v in (env if env is not None else os.environ).items()
        }
        for stream in (sys.stdout, sys.stderr):  # nothing buffered here is written twice
            with contextlib.suppress(Exception):
                stream.flush()  # type: ignore[union-attr]
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(
                [os.fsdecode(a) for a in args[3:]],
                child_env,
                os.fsdecode(cwd) if cwd is not None else None,
                (p2cread, c2pwrite, errwrite),
                preexec_fn,
                start_new_session,
                process_group if process_group is not None and process_group >= 0 else None,
            )
        self.pid = pid
        self.forked = True
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]


def prepare_process_title() -> None:
    """Let setproctitle take over the process's argv and environment memory now. A process that
    will clear its whole environment before it forks workbench children (the tests' zygote
    rewrites it for each child) calls this first: set up after that, setproctitle finds no room
    and /proc/PID/cmdline keeps the parent's command. Variables added or changed, as Workbench
    itself does, leave it room (measured), so `python -m workbench` needs no such call."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(ImportError):
            import setproctitle

            setproctitle.getproctitle()


def fork_unavailable() -> str | None:
    """Why this process never forks its children (None: it may, the moment allowing)."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if os.environ.get(DISABLE_VARIABLE) == "0":
        return f"{DISABLE_VARIABLE}=0"
    if importlib.util.find_spec("setproctitle") is None:
        return "setproctitle is not installed (a forked child would show this process's command in ps)"
    return None


def fork_refusal(args: Any, env: Mapping[Any, Any] | None) -> str | None:
    """Why `args` with `env` must start as a fresh interpreter here (None: it may be forked)."""
    if (unavailable := fork_unavailable()) is not None:
        return unavailable
    if not (
        isinstance(args, (list, tuple))
        and len(args) >= 3
        and os.fsdecode(args[0]) == sys.executable
        and [os.fsdecode(a) for a in args[1:3]] == ["-m", "workbench"]
    ):
        return "not a `python -m workbench` command"
    if env is not None:
        wanted = {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
        differing = {k for k in wanted.keys() | os.environ.keys() if wanted.get(k) != os.environ.get(k)}
        if differing - _RUNTIME_VARIABLES:
            return f"the child's environment differs in {sorted(differing - _RUNTIME_VARIABLES)[0]}"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialized in this process"
    if (threads := _other_threads()) is not None:
        return threads
    return None


def note_idle_threads() -> None:
    """Record the native threads that exist now as idle library pools, safe to fork over. Call it
    right after importing torch and before any tensor operation (as `train.launch.preload` does):
    importing numpy starts OpenBLAS's worker threads, which re-initialize in a forked child, while
    the OpenMP workers that torch's first parallel operation starts do not (a child that computes
    then hangs; measured), and those come later, so they are never in this set."""
    global _idle_threads
    _idle_threads = frozenset(_native_threads()) - {threading.get_native_id()}


def _other_threads() -> str | None:
    """Why the threads of this process forbid a fork (None: only this one, idle timers, and the
    library pools `note_idle_threads` recorded)."""
    others = [t for t in threading.enumerate() if t is not threading.current_thread()]
    if any(not isinstance(t, threading.Timer) for t in others):
        return "another thread is running"
    known = {threading.get_native_id(), *(t.native_id for t in others)} | _idle_threads
    if set(_native_threads()) - known:
        return "a native thread is running (torch's OpenMP workers start with its first parallel operation)"
    return None


def _native_threads() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return []


# -- in the child ------------------------------------------------------------------------------


def _child(
    args: list[str],
    env: dict[str, str],
    cwd: str | None,
    fds: tuple[int, int, int],
    preexec_fn: Any,
    new_session: bool,
    process_group: int | None,
) -> None:
    """Become `python -m workbench ARGS` with `env`, as `subprocess.Popen` would have started it."""
    code = 1
    try:
        gc.freeze()  # the parent's objects are never collected here (nor their files closed by it)
        default_signals()
        if new_session:
            os.setsid()
        elif process_group is not None:
            os.setpgid(0, process_group)
        for target, fd in enumerate(fds):
            if fd != -1 and fd != target:
                os.dup2(fd, target)
        os.closerange(3, _max_fd())  # close_fds=True, as Popen does for a fresh interpreter
        import setproctitle

        setproctitle.setproctitle(
            " ".join([sys.executable, "-m", "workbench", *args])
        )  # what ps and /proc show
        if preexec_fn is not None:
            preexec_fn()
        if cwd is not None:
            os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        _apply_thread_count(env)
        fresh_stdio(unbuffered=bool(env.get("PYTHONUNBUFFERED")))
        forget_parent_state()
    except BaseException as exc:  # noqa: BLE001 - what a fresh interpreter that failed to start would say
        with contextlib.suppress(BaseException):
            os.write(
                2,
                f"error: could not start `workbench {' '.join(args[:1])}` in a forked process: {exc}\n".encode(),
            )
        os._exit(1)
    try:
        code = run_module_as_main("workbench", args)
    finally:
        os._exit(code)


def default_signals() -> None:
    """Signal dispositions as a fresh interpreter has them (the parent's handlers are its own)."""
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    for sig in (
        signal.SIGCHLD,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGALRM,
    ):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def forget_parent_state() -> None:
    """Drop what would make the parent's clean-up run in the child: its atexit calls and its
    weakref finalizers (a TemporaryDirectory of the parent's must not be removed when a child
    exits), and the CLI modules, so the child's consoles look at the child's own stdout."""
    atexit._clear()
    registry = getattr(weakref.finalize, "_registry", None)
    if isinstance(registry, dict):
        registry.clear()
    weakref.finalize._registered_with_atexit = False  # type: ignore[attr-defined] - re-registers for the child's own
    for name in [
        n
        for n in sys.modules
        if n == "workbench.__main__" or n == "workbench.cli" or n.startswith("workbench.cli.")
    ]:
        del sys.modules[name]


def fresh_stdio(*, unbuffered: bool) -> None:
    """New sys.stdin/stdout/stderr over fds 0-2, buffered as a fresh interpreter buffers them."""
    encoding, errors = (
        (sys.stdout.encoding, sys.stdout.errors) if sys.stdout is not None else ("utf-8", "strict")
    )

    def text(fd: int, errors: str) -> io.TextIOWrapper:
        # CPython's create_stdio: stdin always buffered; -u/PYTHONUNBUFFERED makes writes go
        # straight through; otherwise a tty, and stderr always, are line-buffered.
        raw = io.FileIO(fd, "rb" if fd == 0 else "wb", closefd=False)
        if fd == 0:
            return io.TextIOWrapper(io.BufferedReader(raw), encoding=encoding, errors=errors)
        stream: Any = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(
            stream,
            encoding=encoding,
            errors=errors,
            write_through=unbuffered,
            line_buffering=not unbuffered and (fd == 2 or os.isatty(fd)),
        )

    sys.stdin = sys.__stdin__ = text(0, errors)
    sys.stdout = sys.__stdout__ = text(1, errors)
    sys.stderr = sys.__stderr__ = text(2, "backslashreplace")


def run_module_as_main(module: str, args: list[str]) -> int:
    """`python -m MODULE ARGS` in this process, with the interpreter's exit handling: SystemExit
    codes, a traceback for anything uncaught, the thread joins and atexit calls of a normal exit;
    an uncaught KeyboardInterrupt ends the process by SIGINT, as Python does. Returns the exit code."""
    import runpy
    import types

    sys.argv = ["-m", *args]
    sys.modules["__main__"] = types.ModuleType("__main__")
    code = 0
    try:
        runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined] - what `-m` runs
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130  # not reached: SIGINT's default action ends the process
    except BaseException:  # noqa: BLE001 - printed as an uncaught exception is
        sys.excepthook(*sys.exc_info())
        code = 1
    _finish()
    return code


def _finish() -> None:
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined] - joins non-daemon threads, as interpreter exit does
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    with contextlib.suppress(BaseException):
        print(value, file=sys.stderr)
    return 1


def _apply_thread_count(env: Mapping[str, str]) -> None:
    """OpenMP read OMP_NUM_THREADS when torch was loaded (in the parent): apply the child's own."""
    torch = sys.modules.get("torch")
    value = env.get("OMP_NUM_THREADS", "")
    if torch is not None and value.isdigit() and int(value) > 0:
        torch.set_num_threads(int(value))


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 256
