"""A pre-imported `python -m workbench` for the tests' CLI children (a "zygote", as Android's).

Most of a test's CLI child is start-up: a `workbench eval run ... -m tiny` child spends about
4.8 of its 5.6 CPU-seconds importing torch and transformers, and the suite starts about 215 such
children (forking them cut the suite from 1,059 to 765 busy CPU-s). The zygote imports them once, then
forks a child per command: the child gets the command's argv, cwd, environment, stdin/stdout/
stderr and session exactly as `subprocess.Popen` would have given a fresh interpreter, and
runs `python -m workbench` as `-m` does (or `python -m tests.servers`, the tests' own model
servers: `FORKED_MODULES`). Only the imports are shared.

`ZygotePopen` is a `subprocess.Popen` whose child comes from the zygote: `wait`, `poll`,
`communicate`, `send_signal`, pipes and return codes (negative for a signal) behave as for
any child; the zygote reaps the child and reports its wait status over a socket.

What stays a fresh interpreter (`ZygotePopen` falls back to `subprocess.Popen` by itself):
- an environment that differs from the zygote's in any variable a library may read when it
  is imported (`_IMPORT_TIME_PREFIXES`: HF_, TORCH, OMP_, PYTHON..., see `_incompatible`);
- `preexec_fn`, `pass_fds`, user/group/umask changes, `close_fds=False`;
- `WORKBENCH_TEST_ZYGOTE=0` in the environment: every child fresh (to rule the zygote out).
Tests about start-up itself (which modules a command imports) call `subprocess` directly.

One zygote serves the whole test session (all xdist workers): the first worker that needs it
starts it, detached (not a child of any worker, so leftover-process checks never see it); it
exits when the pytest process that owns the session does.

Run as a program it is the zygote: `python -m tests.zygote SOCKET OWNER_PID`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# The `python -m MODULE` commands a zygote forks: the CLI, and the tests' own server processes
# (tests/servers.py), which load a model through the same imports.
FORKED_MODULES = frozenset({"workbench", "tests.servers"})

# A variable with one of these prefixes may be read by a module the zygote imports (torch's
# OpenMP threads, huggingface_hub's cache paths, rich's console width, Python's own flags): a
# child whose value differs from the zygote's must start fresh. Other variables (a test's
# workspace, a secret for a judge) are read when the command runs, after the fork: the child
# gets them as asked.
_IMPORT_TIME_PREFIXES = (
    "PYTHON",
    "LD_",
    "HOME",
    "XDG_",
    "LANG",
    "LC_",
    "TMP",
    "TEMP",
    "HF_",
    "HUGGINGFACE",
    "TRANSFORMERS",
    "TOKENIZERS",
    "SAFETENSORS",
    "TORCH",
    "PYTORCH",
    "CUDA",
    "NVIDIA",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS",
    "GOTO",
    "NUMEXPR",
    "ACCELERATE",
    "TQDM",
    "USE_",
    "DISABLE_",
    "TRITON",
    "AIOHTTP",
    "SSL_",
    "REQUESTS_",
    "CURL_",
)
# Prefixes that matter only once a module that reads them when imported is in the zygote: the
# libraries it does not import, and the CLI's consoles (rich reads the terminal's variables when
# a console is made; `_preload` leaves the CLI to each child).
_MODULE_PREFIXES = {
    "textual": ("TEXTUAL",),
    "verifiers": ("VF_",),
    "datasets": ("DATASETS",),
    "dspy": ("DSPY",),
    "litellm": ("LITELLM",),
    "gepa": ("GEPA",),
    "wandb": ("WANDB",),
    "peft": ("PEFT",),
    "workbench.cli.render": (
        "TERM",
        "COLORTERM",
        "COLUMNS",
        "LINES",
        "NO_COLOR",
        "FORCE_COLOR",
        "TTY_",
        "JUPYTER",
    ),
}
# ... but not these, which differ between xdist workers and between tests, and which no module
# reads when imported (PYTHONPATH is applied to the child's sys.path after the fork, and
# PYTHONUNBUFFERED to its stdio; torch writes its compile cache folder into os.environ once a
# test compiles something, and reads it only when compiling).
_RUNTIME_VARIABLES = frozenset(
    {"PYTHONPATH", "PYTHONUNBUFFERED", "PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "HF_HUB_OFFLINE"}
)  # set again in the child: `_apply_offline`
_XDIST_PREFIX = "PYTEST_XDIST_"

_MAX_MESSAGE = 1 << 20
# The environment the zygote imports under: the session's, as it is when the tests are collected
# (tests/conftest.py imports this module once it has set its own variables), not that of the test
# that happens to start the zygote, whose monkeypatched variables would turn every later child away.
_SESSION_ENV = dict(os.environ)
_ZYGOTE_PYTHONPATH = ""  # the zygote's own PYTHONPATH: its entries leave a child's sys.path


def enabled() -> bool:
    return os.environ.get("WORKBENCH_TEST_ZYGOTE", "1") != "0"


def _incompatible(zygote_env: Mapping[str, str], env: Mapping[str, str]) -> str | None:
    """The first variable that keeps a child with `env` from being forked from a zygote imported
    under `zygote_env`, or None when it may be."""
    imported = tuple(
        prefix
        for module, prefixes in _MODULE_PREFIXES.items()
        if module in sys.modules
        for prefix in prefixes
    )
    for key in sorted(set(zygote_env) | set(env)):
        if key in _RUNTIME_VARIABLES or key.startswith(_XDIST_PREFIX) or zygote_env.get(key) == env.get(key):
            continue
        if key.upper().startswith(_IMPORT_TIME_PREFIXES + imported):
            return key
    return None


# -- client side (the test process) ------------------------------------------------------


class ZygotePopen(subprocess.Popen):
    """`subprocess.Popen` of `[sys.executable, "-m", MODULE, ...]` (MODULE in `FORKED_MODULES`)
    whose child is forked by the zygote (see the module docstring); anything else, or an
    ineligible call, runs fresh."""

    _status: socket.socket | None = None  # where the zygote reports the forked child's wait status
    forked = False  # whether the zygote forked this child (False: a fresh interpreter)

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
        fresh = (
            not enabled()
            or shell
            or executable is not None
            or preexec_fn is not None
            or not close_fds
            or pass_fds
            or gid is not None
            or gids is not None
            or uid is not None
            or umask != -1
            or not _is_forked_module_command(args)
        )
        if not fresh:
            request = {
                "module": os.fsdecode(args[2]),
                "args": [os.fsdecode(a) for a in args[3:]],
                "cwd": os.fsdecode(cwd) if cwd is not None else os.getcwd(),
                "env": {
                    os.fsdecode(k): os.fsdecode(v)
                    for k, v in (env if env is not None else os.environ).items()
                },
                "new_session": bool(start_new_session),
                "process_group": process_group if process_group is not None and process_group >= 0 else None,
            }
            fds = [
                p2cread if p2cread != -1 else 0,
                c2pwrite if c2pwrite != -1 else 1,
                errwrite if errwrite != -1 else 2,
            ]
            status = _zygote().spawn(request, fds)
            if isinstance(status, str):
                _log(args, f"fresh ({status})")
            else:
                self._status, self.pid = status
                self.forked = True
                _log(args, "forked")
                self._child_created = True
                self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
                return
        super()._execute_child(
            args,
            executable,
            preexec_fn,
            close_fds,
            pass_fds,
            cwd,
            env,
            startupinfo,
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

    def _internal_poll(self, _deadstate: Any = None, **kwargs: Any) -> int | None:
        if self._status is None:
            return super()._internal_poll(_deadstate=_deadstate, **kwargs)
        if self.returncode is None:
            self._read_status(timeout=0.0)
        return self.returncode

    def _wait(self, timeout: float | None) -> int:
        if self._status is None:
            return super()._wait(timeout)
        if self.returncode is None and not self._read_status(timeout=timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        assert self.returncode is not None
        return self.returncode

    def _read_status(self, timeout: float | None) -> bool:
        """Read the child's wait status from the zygote if it came within `timeout` seconds."""
        assert self._status is not None
        self._status.settimeout(timeout)
        try:
            data = _read_line(self._status)
        except (TimeoutError, BlockingIOError):
            return False
        self._status.close()
        # An empty line: the zygote itself went away; the child is gone with it (SIGKILL'd).
        self._handle_exitstatus(int(data) if data else 9)
        return True


Popen = ZygotePopen


def run(
    *popenargs: Any,
    input: Any = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run` with a `ZygotePopen`."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with ZygotePopen(*popenargs, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            exc.stdout, exc.stderr = process.communicate()
            raise
        except BaseException:
            process.kill()
            raise
        code = process.poll()
        assert code is not None
        if check and code:
            raise subprocess.CalledProcessError(code, process.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(process.args, code, stdout, stderr)


def _log(args: Any, how: str) -> None:
    """One line per child to $WORKBENCH_TEST_ZYGOTE_LOG, when set: which children were forked."""
    path = os.environ.get("WORKBENCH_TEST_ZYGOTE_LOG")
    if path:
        with open(path, "a") as log:
            log.write(
                f"{how}\t{' '.join(map(os.fsdecode, args if isinstance(args, (list, tuple)) else [args]))[:200]}\n"
            )


def _is_forked_module_command(args: Any) -> bool:
    return (
        isinstance(args, (list, tuple))
        and len(args) >= 3
        and os.fsdecode(args[0]) == sys.executable
        and os.fsdecode(args[1]) == "-m"
        and os.fsdecode(args[2]) in FORKED_MODULES
    )


def _read_line(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
        sock.settimeout(None)  # the rest of a line that has begun comes at once
    return data.decode().strip()


class _Zygote:
    """The session's zygote, started on first use."""

    def __init__(self) -> None:
        session = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
        self.folder = Path(tempfile.gettempdir()) / f"wb-zygote-{session[:16]}"
        self.path = self.folder / "sock"
        # The pytest process that owns the session (an xdist worker's parent): the zygote outlives no one.
        self.owner = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
        self.failed = False  # it could not start or went away: every later child starts fresh

    def spawn(self, request: dict[str, Any], fds: list[int]) -> tuple[socket.socket, int] | str:
        """(status socket, pid) of the forked child, or why it must start fresh."""
        if self.failed:
            return "no zygote"
        payload = json.dumps(request).encode()
        try:
            sock = self._connect()
        except (OSError, RuntimeError):  # no zygote (it could not start, or was killed): children start fresh
            self.failed = True
            return "no zygote"
        try:
            socket.send_fds(sock, [struct.pack("!I", len(payload)) + payload], fds)
            answer = _read_line(sock)
        except OSError as exc:
            sock.close()
            return f"zygote unreachable: {exc}"
        if not answer.isdigit():  # "fresh VARIABLE" (an environment it cannot serve), or the zygote died
            sock.close()
            return answer or "zygote died"
        return sock, int(answer)

    def _connect(self) -> socket.socket:
        with _locked(self.folder):
            if not self.path.exists():
                self._start()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(self.path))
        return sock

    def _start(self) -> None:
        # The launcher binds the socket, then forks the zygote off and exits: the zygote is nobody's
        # child here, and the socket accepts (queues) connections from the moment it exists.
        launcher = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote", str(self.path), str(self.owner)],
            cwd=Path(__file__).resolve().parents[1],
            env=_SESSION_ENV,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        if launcher.wait() != 0:
            raise RuntimeError(f"the test zygote did not start (exit {launcher.returncode})")


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_instance: _Zygote | None = None


def _zygote() -> _Zygote:
    global _instance
    if _instance is None:
        _instance = _Zygote()
    return _instance


# -- the zygote ----------------------------------------------------------------------------


def _preload() -> None:
    """What a Workbench command imports before its work starts (torch, transformers, the model
    classes, Workbench's services), with the environment defaults `workbench.cli.main` sets.
    Not the CLI itself: its consoles read the terminal's variables (COLUMNS, NO_COLOR, ...) when
    made, so they are made in each child, from its own environment."""
    import gc

    gc.disable()
    from workbench.fork_launch import prepare_process_title
    from workbench.startup import quiet_libraries

    prepare_process_title()  # before quiet_libraries and each child rewrite the environment (its docstring)

    quiet_libraries()  # what `workbench.cli.main` does first
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401 - resolves the lazy modules
    from transformers.models.llama import modeling_llama  # noqa: F401

    import workbench.evaluate.service  # noqa: F401
    import workbench.inference.local_client  # noqa: F401

    gc.collect()
    gc.freeze()  # children never scan what they inherit
    gc.enable()


def _serve(path: str, owner: int) -> None:
    env = dict(os.environ)  # before `_preload` adds its defaults: what the imports were made under
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    if os.fork():  # the launcher exits: the zygote is left to init, detached from the test worker
        os._exit(0)
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the zygote's own output goes nowhere; children get their own fds
        os.dup2(devnull, fd)
    _preload()
    wakeup_read, wakeup_write = socket.socketpair()
    wakeup_read.setblocking(False)
    wakeup_write.setblocking(False)
    signal.set_wakeup_fd(wakeup_write.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the selector
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wakeup_read, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    own_fds = [listener.fileno(), wakeup_read.fileno(), wakeup_write.fileno(), selector.fileno(), devnull]
    try:
        while _alive(owner):
            for key, _ in selector.select(timeout=1.0):
                if key.fileobj is listener:
                    connection, _ = listener.accept()
                    _answer(connection, env, children, own_fds)
                else:
                    with contextlib.suppress(BlockingIOError):
                        while wakeup_read.recv(4096):
                            pass
            _reap(children)
    finally:
        for leftover in (path, os.path.join(os.path.dirname(path), "lock")):
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _answer(
    connection: socket.socket,
    zygote_env: dict[str, str],
    children: dict[int, socket.socket],
    own_fds: list[int],
) -> None:
    """Read one spawn request and fork its child (or answer "fresh")."""
    connection.settimeout(30)
    try:
        message, fds, _, _ = socket.recv_fds(connection, _MAX_MESSAGE, 3)
        (length,) = struct.unpack("!I", message[:4])
        body = message[4:]
        while len(body) < length:
            chunk = connection.recv(length - len(body))
            if not chunk:
                raise OSError("short request")
            body += chunk
        request = json.loads(body)
    except (OSError, ValueError, struct.error):
        connection.close()
        return
    try:
        reason = "fds" if len(fds) != 3 else _incompatible(zygote_env, request["env"])
        if reason is not None:
            connection.sendall(f"fresh {reason}\n".encode())
            connection.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the zygote's own fds are closed in the child; nothing else it inherits is
            _child(request, fds, [*own_fds, connection.fileno(), *(c.fileno() for c in children.values())])
        children[pid] = connection
        connection.sendall(f"{pid}\n".encode())
    except OSError:
        connection.close()
    finally:
        for fd in fds:
            os.close(fd)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.sendall(f"{status}\n".encode())
            connection.close()


def _child(request: dict[str, Any], fds: list[int], zygote_fds: list[int]) -> None:
    """In the forked child: become `python -m MODULE ARGS` as a fresh interpreter would be."""
    from workbench.fork_launch import default_signals, fresh_stdio, run_module_as_main

    code = 1
    try:
        default_signals()
        if request["new_session"]:
            os.setsid()
        elif request["process_group"] is not None:
            os.setpgid(0, request["process_group"])
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in {*fds, *zygote_fds} - {0, 1, 2}:
            with contextlib.suppress(OSError):
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _fresh_path(request["env"].get("PYTHONPATH", ""))
        _apply_offline(request["env"])
        fresh_stdio(unbuffered=bool(request["env"].get("PYTHONUNBUFFERED")))
        code = run_module_as_main(request["module"], request["args"])
    finally:
        os._exit(code)


def _apply_offline(env: dict[str, str]) -> None:
    """huggingface_hub reads HF_HUB_OFFLINE into a constant when imported, and its downloads read
    that constant when called: set it from the child's environment (workbench.models.hub does the
    same when it finds the hub unreachable)."""
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = constants._is_true(
        env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE")
    )


def _fresh_path(pythonpath: str) -> None:
    """sys.path as `python -m` makes it: the cwd, then PYTHONPATH, then the interpreter's own."""
    zygote_entries = set(filter(None, _ZYGOTE_PYTHONPATH.split(os.pathsep)))
    base = [p for p in sys.path[1:] if p not in zygote_entries]
    sys.path[:] = [os.getcwd(), *[p for p in pythonpath.split(os.pathsep) if p], *base]


def main() -> None:
    path, owner = sys.argv[1], int(sys.argv[2])
    global _ZYGOTE_PYTHONPATH
    _ZYGOTE_PYTHONPATH = os.environ.get("PYTHONPATH", "")
    try:
        _serve(path, owner)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            sys.exit(0)  # another worker's zygote is already serving
        print(f"test zygote: cannot serve at {path}: {exc} (CLI children start fresh)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
