"""`python -m workbench ...` for the tests, run in this process: a command's exit code, output and
files without a fresh interpreter importing torch and transformers again (4-5 CPU-s a command).

`run` takes `subprocess.run`'s arguments and returns its `CompletedProcess`. A
`[sys.executable, "-m", "workbench", ...]` command goes through the CLI's own entry point
(`workbench.cli.main.run`: the one-line errors and exit codes a user gets) under Click's
`CliRunner.isolation` (stdin, stdout and stderr captured), in the command's working directory and
environment; both, and torch's thread count, are restored afterwards. `timeout` is not enforced
in-process (pytest-timeout's limit is).

It starts a real process instead where in-process would not be the same command: any other
program, or an environment that changes what is read when the interpreter or a library starts
(`read_at_start`: PYTHONPATH, huggingface_hub's endpoint and cache folders). A test that proves
something about a process (signals, kill -9, servers, trainer ranks, the modules a start-up
imports) starts it with `subprocess` itself.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from click.testing import CliRunner

WORKBENCH = [sys.executable, "-m", "workbench"]

Command = Sequence[str | Path]


def read_at_start(name: str) -> bool:
    """Whether the variable `name` is read when the interpreter or a library starts (a value the
    command's own process would see but this one, started long ago, never applies)."""
    return name.startswith("PYTHON") or (name.startswith("HF_") and name != "HF_HUB_OFFLINE")


def in_process(command: Command, env: Mapping[str, str] | None) -> bool:
    """Whether `command` with `env` runs here the same as in a process of its own."""
    if [str(part) for part in command[:3]] != WORKBENCH:
        return False
    if env is None:
        return True
    changed = {k for k in env.keys() | os.environ.keys() if env.get(k) != os.environ.get(k)}
    return not any(read_at_start(name) for name in changed)


def run(
    command: Command,
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    capture_output: bool = False,
    text: bool = False,
    timeout: float | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """`subprocess.run(command, ...)`, in this process where it can be (the module docstring)."""
    if not in_process(command, env):
        return subprocess.run(
            command,
            cwd=cwd,
            env=env,
            input=input,
            capture_output=capture_output,
            text=text,
            timeout=timeout,
            check=check,
        )
    args = [str(part) for part in command[3:]]
    with _environment(env), contextlib.chdir(cwd or os.getcwd()), _torch_threads_kept():
        with CliRunner().isolation(input=input) as (out, err, _):
            code = _run_cli(args)
            sys.stdout.flush()
            sys.stderr.flush()
            stdout, stderr = out.getvalue(), err.getvalue()
    outputs: list[str | bytes | None] = [
        stream.decode(errors="replace") if text else stream for stream in (stdout, stderr)
    ]
    if not capture_output:  # where a child's output would have gone: this process's (pytest's capture)
        sys.stdout.write(stdout.decode(errors="replace"))
        sys.stderr.write(stderr.decode(errors="replace"))
        outputs = [None, None]
    if check and code:
        raise subprocess.CalledProcessError(code, list(command), outputs[0], outputs[1])
    return subprocess.CompletedProcess(list(command), code, outputs[0], outputs[1])


def _run_cli(args: list[str]) -> int:
    """The command's exit code, as the interpreter turns its SystemExit into one."""
    from workbench.cli.main import run as run_cli

    argv, sys.argv = sys.argv, ["workbench", *args]  # what the command's own process would have
    try:
        run_cli(args, prog_name="python -m workbench")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    finally:
        sys.argv = argv
    return 0


@contextlib.contextmanager
def _environment(env: Mapping[str, str] | None) -> Iterator[None]:
    """`env` as the whole environment (None: this one), and this one back afterwards, with
    whatever the command set (Workbench's library defaults, HF_HUB_OFFLINE) taken away."""
    saved = dict(os.environ)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _torch_threads_kept() -> Iterator[None]:
    """A command may size torch's thread pool for its process (a trainer next to its replicas)."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        if torch is not None and threads is not None and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
