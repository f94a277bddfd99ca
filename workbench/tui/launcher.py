"""Start `workbench ...` as child processes, find them again, and stop them gracefully.

A child runs in its own session (`start_new_session=True`): Ctrl-C or closing the TUI's
terminal never reaches it, and quitting the TUI never kills it. Its stdout and stderr go to
`outputs/tui/launches/<id>.log`, with a `<id>.json` record beside it (command, pid, start
time) so a later TUI session still knows what it launched. A run folder is linked to its
launch by the pid the run writes into its `metadata.json`. Stopping sends SIGINT — exactly a
Ctrl-C in a terminal — so the CLI keeps every finished result and marks the run `stopped`.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workbench.store.files import read_json, write_json_atomic
from workbench.tui.data.runs import RunInfo, parse_time, pid_alive

LAUNCHES = Path("outputs") / "tui" / "launches"


@dataclass
class LaunchSpec:
    """What to run: the arguments after `workbench`, and how to label it until its run appears."""

    kind: str  # eval | train | gepa
    args: list[str]
    env: str = "-"
    model: str = "-"

    @property
    def command(self) -> str:
        return shlex.join(["workbench", *self.args])


@dataclass
class Launch:
    """A started child process."""

    id: str
    kind: str
    args: list[str]
    env: str
    model: str
    pid: int
    log_path: str
    started_at: str
    returncode: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def command(self) -> str:
        return shlex.join(["workbench", *self.args])

    @property
    def log(self) -> Path:
        return Path(self.log_path)


def eval_args(env: str, model: str, num_examples: int, rollouts: int, extra: list[str] | None = None) -> list[str]:
    return ["eval", "run", env, "-m", model, "-n", str(num_examples), "-r", str(rollouts), *(extra or [])]


def config_spec(path: Path, root: Path) -> LaunchSpec:
    """How to run a config: its first line when it is `# workbench ...` (DESIGN §9), else by folder.
    The config path is given relative to the workspace when it lies inside it."""
    shown = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    kind = {"rl": "train", "eval": "eval", "gepa": "gepa"}.get(path.parent.name, "train")
    args = {"train": ["train", shown], "eval": ["eval", "run", shown], "gepa": ["gepa", "run", shown]}[kind]
    try:
        first_line = path.read_text(encoding="utf-8").splitlines()[0].strip()
    except (OSError, IndexError, UnicodeDecodeError):
        first_line = ""
    if first_line.startswith("# workbench "):
        words = shlex.split(first_line[2:])[1:]
        if words and any(w.endswith(path.name) for w in words):
            args = [shown if w.endswith(path.name) else w for w in words]
            kind = "eval" if words[0] == "eval" else "gepa" if words[0] == "gepa" else "train"
    env, model = _env_and_model(path)
    return LaunchSpec(kind, args, env, model)


def _env_and_model(path: Path) -> tuple[str, str]:
    """Best-effort labels from a config file (shown until the run's own metadata appears)."""
    try:
        import tomllib

        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "-", "-"
    env = data.get("env_id") or "+".join(str(e.get("id", "?")) for e in data.get("env", []) if isinstance(e, dict)) or "-"
    model = data.get("model")
    if isinstance(model, dict):
        model = model.get("name")
    return str(env), str(model or "-")


def list_configs(root: Path) -> list[Path]:
    """configs/{rl,eval,gepa}/*.toml, sorted by folder then name."""
    found: list[Path] = []
    for folder in ("eval", "rl", "gepa"):
        found += sorted((root / "configs" / folder).glob("*.toml"))
    return found


class Launcher:
    """Owns the child processes started from this TUI session."""

    def __init__(self, root: Path, python: str | None = None) -> None:
        self.root = root
        self.python = python or sys.executable
        self.folder = root / LAUNCHES
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._session: dict[str, Launch] = {}
        self._records: dict[Path, tuple[float, Launch | None]] = {}  # earlier sessions' records by mtime

    def start(self, spec: LaunchSpec) -> Launch:
        """Start `workbench ARGS` in the workspace; returns at once (the run writes its own files)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC)
        launch_id = f"{stamp.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"
        log_path = self.folder / f"{launch_id}.log"
        env = {**os.environ, "WORKBENCH_WORKSPACE": str(self.root), "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
        with log_path.open("wb") as log:
            log.write(f"$ {spec.command}\n".encode())
            log.flush()
            proc = subprocess.Popen([self.python, "-m", "workbench", *spec.args], cwd=self.root, env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        launch = Launch(launch_id, spec.kind, list(spec.args), spec.env, spec.model, proc.pid, str(log_path),
                        stamp.isoformat(timespec="seconds"))
        self._procs[launch_id] = proc
        self._session[launch_id] = launch
        self._save(launch)
        return launch

    def poll(self) -> None:
        """Reap children that exited (so their pids stop looking alive) and record exit codes."""
        for launch_id, proc in list(self._procs.items()):
            code = proc.poll()
            if code is not None:
                launch = self._session[launch_id]
                launch.returncode = code
                self._save(launch)
                del self._procs[launch_id]

    def is_running(self, launch: Launch) -> bool:
        proc = self._procs.get(launch.id)
        if proc is not None:
            return proc.poll() is None
        return launch.returncode is None and pid_alive(launch.pid)

    def wait(self, launch: Launch, timeout: float | None = None) -> int | None:
        """Wait for a child started in this session; its exit code (None: not ours)."""
        proc = self._procs.get(launch.id)
        if proc is None:
            return launch.returncode
        code = proc.wait(timeout)
        self.poll()
        return code

    def launches(self) -> list[Launch]:
        """This session's launches plus earlier sessions' that are still running, newest first."""
        found = dict(self._session)
        for path in self.folder.glob("*.json") if self.folder.is_dir() else []:
            if path.stem in found:
                continue
            launch = self._record(path)
            if launch is not None and launch.returncode is None and pid_alive(launch.pid):
                found[launch.id] = launch
        return sorted(found.values(), key=lambda launch: launch.started_at, reverse=True)

    def for_pid(self, pid: int | None) -> Launch | None:
        if pid is None:
            return None
        return next((launch for launch in self.launches() if launch.pid == pid), None)

    def logs_of(self, run: RunInfo) -> list[tuple[str, Path]]:
        """(label, path) of every log a run has: the launch output first, then run.log."""
        logs: list[tuple[str, Path]] = []
        launch = launch_of(run) or self.for_pid(run.pid)
        if launch is not None and launch.log.is_file():
            logs.append(("output", launch.log))
        if not run.is_launch and (run.path / "run.log").is_file():
            logs.append(("run.log", run.path / "run.log"))
        return logs

    def pending_rows(self, runs: list[RunInfo]) -> list[RunInfo]:
        """Rows for launches whose run folder has not appeared yet (still starting, or exited
        early — a config error — in this session), so a launch shows up in Runs at once."""
        run_pids = {r.pid for r in runs if r.pid}
        rows = []
        for launch in self.launches():
            if launch.pid in run_pids:
                continue
            running = self.is_running(launch)
            if not running and launch.id not in self._session:
                continue
            code = launch.returncode
            status = "starting" if running else "finished" if code == 0 else "stopped" if code in (130, -2) else "failed"
            rows.append(RunInfo(kind=launch.kind, path=launch.log, run_id=launch.id, env=launch.env,
                                model=launch.model, status=status, created_at=parse_time(launch.started_at),
                                pid=launch.pid, metadata={"launch": asdict(launch)}))
        return rows

    def stop(self, pid: int) -> bool:
        """Send SIGINT (a Ctrl-C) to a run. Our children lead their own process group, so the
        whole group gets it, as a terminal would do. Returns False when the process is gone."""
        launch = self.for_pid(pid)
        try:
            if launch is not None and self.is_running(launch):
                os.killpg(pid, signal.SIGINT)
            else:
                os.kill(pid, signal.SIGINT)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def _record(self, path: Path) -> Launch | None:
        """A launch record from disk, parsed once per change (polled every second)."""
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return None
        cached = self._records.get(path)
        if cached is None or cached[0] != mtime:
            try:
                launch: Launch | None = Launch(**read_json(path))
            except (OSError, ValueError, TypeError):
                launch = None
            cached = self._records[path] = (mtime, launch)
        return cached[1]

    def _save(self, launch: Launch) -> None:
        write_json_atomic(self.folder / f"{launch.id}.json", asdict(launch))


def launch_of(run: RunInfo) -> Launch | None:
    """The launch record attached to a pending row."""
    data = run.metadata.get("launch")
    return Launch(**data) if isinstance(data, dict) else None
