"""Launch `vllm serve` and manage its process (training's `[inference] launch = true` builds on
this in `workbench.train.vllm` and, for `workbench serve` replicas, `workbench.train.launch_servers`).

`vllm_plan` turns serving settings (the `[inference]` and `[lora]` tables) into the exact command
and environment:

    vllm serve MODEL --host H --port P --served-model-name NAME
        --tensor-parallel-size TP --data-parallel-size DP
        [--gpu-memory-utilization F] [--max-model-len N] [--dtype D] [--tokenizer T]
        [--enable-auto-tool-choice] [--tool-call-parser PARSER] [--reasoning-parser qwen3|deepseek_r1]
        [--enable-lora --max-lora-rank R --max-loras K]       # when lora.enabled
    env: CUDA_VISIBLE_DEVICES=<inference.gpu_ids>, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (LoRA)

`R` is `lora.r` rounded up to a rank vLLM accepts; `K` is `max_async_level + 1`, because
rollouts from that many policy versions (one adapter each) can be in flight together.
The trainer then pushes each step's adapter with `weight_sync.WeightSync`.

`ManagedServer` runs any such command in its own process group with its output in a log
file, waits for `GET /health`, and stops the whole group (SIGTERM, then SIGKILL). It is
independent of vLLM, so its tests run on a CPU with a stand-in executable. A server that picks
its own port (`workbench serve --port 0`) is found by its announcement line in the log
(`announce`), which leaves no window between choosing a free port and binding it.

vLLM is an optional extra (`pip install 'workbench[vllm]'`); nothing here imports it.
Full fine-tuning with a launched vLLM: stock `vllm serve` has no route that reloads weights
from a folder (prime-rl adds `/update_weights` through a worker extension), so
`WeightSync.update_weights` works against `workbench serve` and prime-rl's server only.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from workbench.errors import UserError
from workbench.inference.adapters import VLLM_LORA_RANKS
from workbench.inference.parent_watch import watched_command

# The same interpreter as workbench, so the `vllm` extra of this environment is the one run.
VLLM_EXECUTABLE = (sys.executable, "-m", "vllm.entrypoints.cli.main")
INSTALL_HINT = "inference.launch needs vLLM on a machine with a GPU: pip install 'workbench[vllm]'"


class ServeSettings(Protocol):
    """What `vllm serve` needs from a config (training's `[inference]` table has these fields).
    Read only, so a config field of a narrower type (a Literal for a str) fits."""

    @property
    def tensor_parallel_size(self) -> int: ...
    @property
    def data_parallel_size(self) -> int: ...
    @property
    def gpu_ids(self) -> list[int]: ...
    @property
    def gpu_memory_utilization(self) -> float | None: ...
    @property
    def max_model_len(self) -> int | None: ...
    @property
    def enable_auto_tool_choice(self) -> bool: ...
    @property
    def tool_call_parser(self) -> str | None: ...
    @property
    def reasoning_parser(self) -> str | None:  # thinking models: vLLM splits <think> into reasoning_content
        ...
    @property
    def dtype(self) -> str:  # vLLM's --dtype: "auto" (its default), "float16", "bfloat16", "float32"
        ...


class LoraSettings(Protocol):
    """The LoRA settings that size vLLM's adapter slots (training's `[lora]` table)."""

    @property
    def enabled(self) -> bool: ...
    @property
    def r(self) -> int: ...


class ServerStartError(UserError):
    """The server process exited or stayed unhealthy; the message ends with its log tail."""


def vllm_lora_rank(r: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that fits an adapter of rank `r`."""
    for rank in VLLM_LORA_RANKS:
        if rank >= r:
            return rank
    raise UserError(f"lora.r = {r} is above vLLM's largest --max-lora-rank ({VLLM_LORA_RANKS[-1]})")


def vllm_unavailable_reason() -> str | None:
    """Why `vllm serve` cannot run here (None when it can)."""
    if not _vllm_installed():
        return "vLLM is not installed"
    if not _cuda_visible():
        return "no CUDA GPU is visible"
    return None


def _vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def require_vllm() -> None:
    """UserError (one line) unless vLLM can be launched on this machine."""
    reason = vllm_unavailable_reason()
    if reason is not None:
        raise UserError(f"{INSTALL_HINT} ({reason})")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (vLLM needs a fixed port; tiny race accepted)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class LaunchPlan:
    """What to run: the command, the variables set on top of the current environment, and
    where the server will answer."""

    command: list[str]
    env: dict[str, str]
    base_url: str  # with /v1, what OpenAIClient and WeightSync take
    served_model_name: str

    @property
    def health_url(self) -> str:
        return self.base_url.removesuffix("/v1") + "/health"


def vllm_plan(
    inference: ServeSettings,
    *,
    model: str,
    served_model_name: str,
    port: int,
    host: str = "127.0.0.1",
    lora: LoraSettings | None = None,
    max_loras: int = 1,
    tokenizer: str | None = None,
    executable: Sequence[str] = VLLM_EXECUTABLE,
) -> LaunchPlan:
    """The `vllm serve` command and environment for `inference` (see the module docstring)."""
    tp, dp = inference.tensor_parallel_size, inference.data_parallel_size
    if inference.gpu_ids and len(inference.gpu_ids) != tp * dp:
        raise UserError(
            f"inference.gpu_ids lists {len(inference.gpu_ids)} GPU(s) but tensor_parallel_size * "
            f"data_parallel_size = {tp} * {dp} = {tp * dp}"
        )
    if inference.tool_call_parser and not inference.enable_auto_tool_choice:
        raise UserError("inference.tool_call_parser needs inference.enable_auto_tool_choice = true (as vLLM)")
    command = [
        *executable,
        "serve",
        model,
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        served_model_name,
        "--tensor-parallel-size",
        str(tp),
        "--data-parallel-size",
        str(dp),
    ]
    if inference.gpu_memory_utilization is not None:
        command += ["--gpu-memory-utilization", str(inference.gpu_memory_utilization)]
    if inference.max_model_len is not None:
        command += ["--max-model-len", str(inference.max_model_len)]
    if inference.dtype != "auto":  # vLLM's own default
        command += ["--dtype", inference.dtype]
    if tokenizer:
        command += ["--tokenizer", tokenizer]
    if inference.enable_auto_tool_choice:
        command.append("--enable-auto-tool-choice")
    if inference.tool_call_parser:
        command += ["--tool-call-parser", inference.tool_call_parser]
    if inference.reasoning_parser:
        command += ["--reasoning-parser", inference.reasoning_parser]
    env: dict[str, str] = {}
    if inference.gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in inference.gpu_ids)
    if lora is not None and lora.enabled:
        command += [
            "--enable-lora",
            "--max-lora-rank",
            str(vllm_lora_rank(lora.r)),
            "--max-loras",
            str(max_loras),
        ]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # else vLLM has no /v1/load_lora_adapter
    connect_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    url_host = f"[{connect_host}]" if ":" in connect_host else connect_host
    return LaunchPlan(command, env, f"http://{url_host}:{port}/v1", served_model_name)


@dataclass
class ManagedServer:
    """A server process in its own process group, logging to `log_path`.

    Use as `with server:` / `async with server:` (start, wait for health, stop at the end),
    or call `start`, `wait_until_healthy` and `stop` yourself.
    """

    command: list[str]
    log_path: Path
    health_url: str
    env: dict[str, str] = field(default_factory=dict)  # on top of os.environ
    startup_timeout_s: float = 900.0  # a large model's first load and CUDA graph capture take minutes
    stop_timeout_s: float = 30.0
    name: str = "vLLM"
    poll_s: float = 0.5
    # When set, the server chooses its own port and prints its base URL: group 1 of this pattern,
    # matched against the log, is the base URL (with /v1); `health_url` may then start empty.
    announce: re.Pattern[str] | None = None
    base_url: str | None = None  # known from the start, or read from the announcement
    # Run the command under parent_watch's wrapper: it dies with this process, even on kill -9
    # (for servers without a --parent-pid of their own, like `vllm serve`).
    die_with_parent: bool = False
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # closed in stop()
        self._log.write(f"$ {' '.join(self.command)}\n".encode())
        self._log.flush()
        command = watched_command(self.command, os.getpid()) if self.die_with_parent else list(self.command)
        try:
            self.process = subprocess.Popen(
                command,
                env={**os.environ, **self.env},
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own group: stop() reaches its workers too
            )
        except OSError as exc:
            self._close_log()
            raise ServerStartError(f"could not start {self.name} ({self.command[0]}): {exc}") from exc

    def wait_until_healthy(self) -> None:
        """Return once `health_url` answers 200; ServerStartError if the process exits first
        or `startup_timeout_s` passes (the process is then stopped)."""
        wait_until_all_healthy([self])

    def ready(self, deadline: float) -> bool:
        """One look: True once healthy, False while still starting; ServerStartError if the
        process has exited or `deadline` (time.monotonic()) has passed (the process is then stopped)."""
        assert self.process is not None, "start() first"
        code = self.process.poll()
        if code is not None:
            self._close_log()
            raise ServerStartError(
                f"{self.name} exited with code {code} before it was ready; "
                f"last lines of {self.log_path}:\n{self.log_tail()}"
            )
        if self._healthy():
            return True
        if time.monotonic() >= deadline:
            self.stop()
            raise ServerStartError(
                f"{self.name} was not healthy at {self.health_url or '(no URL announced yet)'} after "
                f"{self.startup_timeout_s:g}s (stopped it); last lines of {self.log_path}:\n"
                f"{self.log_tail()}"
            )
        return False

    def _healthy(self) -> bool:
        if not self.health_url and not self._read_announcement():
            return False
        try:
            with urllib.request.urlopen(self.health_url, timeout=5) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _read_announcement(self) -> bool:
        if self.announce is None:
            return False
        try:
            found = self.announce.search(self.log_path.read_text(errors="replace"))
        except OSError:
            return False
        if found is None:
            return False
        self.base_url = found.group(1)
        self.health_url = self.base_url.removesuffix("/v1") + "/health"
        return True

    def stop(self) -> int | None:
        """SIGTERM the process group, SIGKILL it after `stop_timeout_s`; returns the exit code."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                process.wait(30)
        self._signal_group(signal.SIGKILL)  # workers it forked and left behind
        self._close_log()
        return process.returncode

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, sig)  # start_new_session: the group id is the pid
        except (ProcessLookupError, PermissionError):
            pass

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ManagedServer:
        self.start()
        try:
            self.wait_until_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> ManagedServer:
        return await asyncio.to_thread(self.__enter__)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)


def wait_until_all_healthy(servers: Sequence[ManagedServer]) -> None:
    """Wait for several started servers at once: return when every one is healthy, raise the
    first ServerStartError as soon as any one fails (without waiting for the slow loaders)."""
    started = time.monotonic()
    pending = list(servers)
    while pending:
        pending = [server for server in pending if not server.ready(started + server.startup_timeout_s)]
        if pending:
            time.sleep(min(server.poll_s for server in pending))
