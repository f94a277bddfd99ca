"""Start `workbench ...` as child processes, find them again, and stop them gracefully.

A child runs in its own session (`start_new_session=True`): Ctrl-C or closing the TUI's
terminal never reaches it, and quitting the TUI never kills it. Its stdout and stderr go to
`outputs/tui/launches/<id>.log`, with a `<id>.json` record beside it (command, pid, start
time) so a later TUI session still knows what it launched. A run folder is linked to its
launch by the pid the run writes into its `metadata.json`. Stopping sends SIGINT — exactly a
Ctrl-C in a terminal — so the CLI keeps every finished result and marks the run `stopped`; a run
still there after a grace period gets SIGTERM (`stop_escalating`), and each step is reported.

A launch that ends before it writes a run folder (a config error) stays listed as a row of its own,
in later TUI sessions too: its record keeps the exit code and the error line of its log — until the
user dismisses it (`Launcher.dismiss`), which deletes that record and log and nothing else.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
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
    error: str | None = None  # the last error line of its log, once it ended with an error
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def command(self) -> str:
        return shlex.join(["workbench", *self.args])

    @property
    def log(self) -> Path:
        return Path(self.log_path)

    @classmethod
    def from_dict(cls, data: Any) -> Launch:
        """A record as saved (keys it does not know, from a newer version, are ignored). TypeError
        when it is not a launch record."""
        if not isinstance(data, dict):
            raise TypeError("a launch record is a JSON object")
        return cls(**{key: value for key, value in data.items() if key in LAUNCH_FIELDS})


LAUNCH_FIELDS = {f.name for f in fields(Launch)}
INTERRUPTED = (130, -2)  # a Ctrl-C: the CLI's exit code, or killed by SIGINT before it could say so
# How long a run has after Ctrl-C before it gets SIGTERM. An eval or GEPA run saves as it goes and
# exits within a second or two of SIGINT; ten seconds is ample for that, and short enough that a run
# ignoring SIGINT (a hung library, a child that swallowed it) is not left running behind a "stopping"
# the user believes. A training run finishes its step first: its grace grows with its step time.
STOP_GRACE_S = 10.0


@dataclass
class StopProgress:
    """One stop under way (`Launcher.stop_escalating`): what was sent and what came of it."""

    pid: int
    what: str
    grace_s: float
    phase: str = "interrupted"  # interrupted | terminated | stopped | still running | gone
    said: list[str] = field(default_factory=list)  # every line reported, in order

    @property
    def done(self) -> bool:
        return self.phase in ("stopped", "still running", "gone")


def eval_args(
    env: str, model: str, num_examples: int, rollouts: int, extra: list[str] | None = None
) -> list[str]:
    return ["eval", "run", env, "-m", model, "-n", str(num_examples), "-r", str(rollouts), *(extra or [])]


def gepa_args(
    env: str,
    model: str,
    reflection_model: str | None,
    max_calls: int,
    num_train: int,
    num_val: int,
    extra: list[str] | None = None,
) -> list[str]:
    """`gepa run ENV -m MODEL [-M REFLECTION] -B CALLS -n TRAIN -N VAL` (no -M: the CLI reflects with -m)."""
    reflect = ["-M", reflection_model] if reflection_model and reflection_model != model else []
    return [
        "gepa",
        "run",
        env,
        "-m",
        model,
        *reflect,
        "-B",
        str(max_calls),
        "-n",
        str(num_train),
        "-N",
        str(num_val),
        *(extra or []),
    ]


def set_args(text: str) -> list[str]:
    """`KEY=VALUE ...` (shell-quoted where a value has spaces) as `--set KEY=VALUE` arguments, which
    `workbench train`, `eval run` and `gepa run` all take. ValueError with a one-line reason."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"overrides: {exc}") from None
    args: list[str] = []
    for word in words:
        key, sep, _ = word.partition("=")
        if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
            raise ValueError(
                f"overrides are KEY=VALUE (e.g. max_steps=20 sampling.temperature=0.8), got '{word}'"
            )
        args += ["--set", word]
    return args


def extra_args(text: str) -> list[str]:
    """More command-line arguments as typed (shell quoting). ValueError with a one-line reason."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"more args: {exc}") from None


def with_args(spec: LaunchSpec, extra: list[str]) -> LaunchSpec:
    return LaunchSpec(spec.kind, [*spec.args, *extra], spec.env, spec.model) if extra else spec


def last_error(log: Path, *, failed: bool = True, limit: int = 65536) -> str | None:
    """The line of an ended child's log that says why it failed: the CLI's own `error: ...` line (a
    user error is one line), else the last line of a traceback, else (`failed`: it exited non-zero)
    the last line it printed. With `failed=False` (the exit code is unknown: the child ended after
    the TUI that started it closed), only a line that shows an error; None when the log shows none."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - limit))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = [
        line.strip() for line in text.splitlines() if line.strip() and not line.startswith("$ workbench")
    ]
    said = next((line for line in reversed(lines) if line.startswith("error:")), None)
    if said is not None:
        return said
    if lines and (failed or "Traceback (most recent call last)" in text):
        return lines[-1]
    return None


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
    env = (
        data.get("env_id")
        or "+".join(str(e.get("id", "?")) for e in data.get("env", []) if isinstance(e, dict))
        or "-"
    )
    model = data.get("model")
    if isinstance(model, dict):
        model = model.get("name")
    return str(env), str(model or "-")


def list_configs(root: Path) -> list[Path]:
    """configs/{rl,eval,gepa}/*.toml, sorted by folder then name."""
    found: list[Path] = []
    for folder in ("eval", "rl", "gepa"):
        # not dot-files: the config editor's dry run checks its unsaved text as `.<name>.check.toml`
        found += sorted(p for p in (root / "configs" / folder).glob("*.toml") if not p.name.startswith("."))
    return found


class Launcher:
    """Owns the child processes started from this TUI session, and reads earlier sessions' records."""

    def __init__(self, root: Path, python: str | None = None, *, stop_grace_s: float = STOP_GRACE_S) -> None:
        self.root = root
        self.python = python or sys.executable
        self.stop_grace_s = stop_grace_s  # SIGINT, then SIGTERM this long after (at least)
        self.stopping: dict[int, StopProgress] = {}  # by pid: stops under way or ended (UI thread only)
        self.folder = root / LAUNCHES
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._session: dict[str, Launch] = {}
        self._records: dict[Path, tuple[float, Launch | None]] = {}  # earlier sessions' records by mtime
        self._settled: dict[str, str | None] = {}  # earlier sessions' ended launches: their error line
        # `poll` (the Runs screen's scan thread) saves a record when its child ends; `dismiss` (the
        # UI thread) deletes records: one at a time, so a dismissed record is never saved again.
        self._lock = threading.Lock()

    def start(self, spec: LaunchSpec) -> Launch:
        """Start `workbench ARGS` in the workspace; returns at once (the run writes its own files)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC)
        launch_id = f"{stamp.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"
        log_path = self.folder / f"{launch_id}.log"
        # Not a terminal: the CLI writes plain whole lines as they happen (cli.render.LineProgress).
        env = {**os.environ, "WORKBENCH_WORKSPACE": str(self.root), "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
        for name in (
            "FORCE_COLOR",
            "TTY_COMPATIBLE",
            "TTY_INTERACTIVE",
        ):  # the TUI's terminal is not the child's
            env.pop(name, None)
        with log_path.open("wb") as log:
            log.write(f"$ {spec.command}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                [self.python, "-m", "workbench", *spec.args],
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        launch = Launch(
            launch_id,
            spec.kind,
            list(spec.args),
            spec.env,
            spec.model,
            proc.pid,
            str(log_path),
            stamp.isoformat(timespec="seconds"),
        )
        self._procs[launch_id] = proc
        self._session[launch_id] = launch
        self._save(launch)
        return launch

    def poll(self) -> None:
        """Reap children that exited (so their pids stop looking alive); record exit codes and, for
        a failure, the error line of the log, so a later TUI session can still say what went wrong."""
        with self._lock:
            for launch_id, proc in list(self._procs.items()):
                code = proc.poll()
                if code is not None:
                    launch = self._session[launch_id]
                    launch.returncode = code
                    if code != 0 and code not in INTERRUPTED:
                        launch.error = last_error(launch.log) or f"exited with code {code}"
                    self._save(launch)
                    self._procs.pop(launch_id, None)  # pop: the scan thread and a quit may both be polling

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
        return [launch for launch in self._all() if launch.id in self._session or self.is_running(launch)]

    def _all(self) -> list[Launch]:
        """Every launch: this session's and every record on disk, newest first."""
        found = dict(self._session)
        for path in self.folder.glob("*.json") if self.folder.is_dir() else []:
            if path.stem not in found and (launch := self._record(path)) is not None:
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

    def status_of(self, launch: Launch) -> tuple[str, str | None]:
        """(status, error line) of a launch: `starting` while it runs; once it ended, `finished`,
        `stopped` (Ctrl-C), `failed` (with its error), or `died` (gone without a word: killed)."""
        if self.is_running(launch):
            return "starting", None
        code = launch.returncode
        if code is None:  # it ended after the session that started it closed: its log says how
            if launch.id not in self._settled:
                self._settled[launch.id] = last_error(launch.log, failed=False)
            error = self._settled[launch.id]
            return ("failed", error) if error else ("died", None)
        if code == 0:
            return "finished", None
        if code in INTERRUPTED:
            return "stopped", None
        return "failed", launch.error or f"exited with code {code}"

    def pending_rows(self, runs: list[RunInfo], every: list[Launch] | None = None) -> list[RunInfo]:
        """Rows for launches whose run folder has not appeared: still starting, or ended without one
        (this session's, whatever the outcome; earlier sessions' when they failed — a config error
        stays listed, with its error, until its record is deleted), so a launch shows up at once.
        `every`: the launch records when the caller has read them already (`_all`)."""
        folders = {r.pid: r.path for r in runs if r.pid}
        rows = []
        for launch in self._all() if every is None else every:
            folder = folders.get(launch.pid)
            if folder is not None:
                self._link(launch, folder)
                continue
            if launch.extra.get("run"):  # its folder appeared; since resumed (other pid), archived or deleted
                continue
            status, error = self.status_of(launch)
            if launch.id not in self._session and status not in ("starting", "failed"):
                continue
            meta: dict[str, Any] = {"launch": asdict(launch)}
            if error:
                meta["error"] = error  # where a run's metadata.json keeps it
            rows.append(
                RunInfo(
                    kind=launch.kind,
                    path=launch.log,
                    run_id=launch.id,
                    env=launch.env,
                    model=launch.model,
                    status=status,
                    created_at=parse_time(launch.started_at),
                    pid=launch.pid,
                    metadata=meta,
                )
            )
        return rows

    def _link(self, launch: Launch, folder: Path) -> None:
        """Remember in the launch's record the run folder it wrote: once a resume (another process)
        owns that folder, or it is archived or deleted, the ended launch must not come back as a
        row of its own (its pid no longer names any run)."""
        if launch.extra.get("run") == str(folder):
            return
        with self._lock:  # `dismiss` deletes records under it: a dismissed record is never saved again
            launch.extra["run"] = str(folder)
            if (self.folder / f"{launch.id}.json").is_file():
                self._save(launch)

    def rows(self, runs: list[RunInfo]) -> list[RunInfo]:
        """Every row of the Runs screen, newest first: the runs (`RunCatalog.scan`) and the pending
        launches. A launched run is placed by its launch time, so when its folder appears its row
        takes the place of the pending row it replaces instead of jumping to wherever its own
        start time (seconds later, after loading) would sort it."""
        every = self._all()  # read the records once per refresh (this runs every second)
        launched = {
            launch.pid: parse_time(launch.started_at)
            for launch in every
            if launch.id in self._session or self.is_running(launch)
        }  # = self.launches()

        def when(run: RunInfo) -> float:
            stamp = launched.get(run.pid) if run.pid and not run.is_launch else None
            stamp = stamp or run.created_at
            return stamp.timestamp() if stamp else 0.0

        rows = sorted(
            [*self.pending_rows(runs, every), *runs], key=lambda run: (when(run), run.run_id), reverse=True
        )
        stopping = {pid for pid, progress in list(self.stopping.items()) if not progress.done}
        if not stopping:
            return rows
        # a run being stopped says so (a copy: the catalog caches its rows)
        return [replace(r, status="stopping") if r.is_live and r.pid in stopping else r for r in rows]

    def live_count(self, runs: list[RunInfo]) -> int:
        """How many runs are going: children of this session still alive, and runs in the workspace
        whose process is alive (`runs` from `RunCatalog.scan`), each counted once."""
        pids = {launch.pid for launch in self.launches() if self.is_running(launch)}
        pids |= {run.pid for run in runs if run.status == "running" and run.pid}
        return len(pids)

    def stop(self, pid: int, sig: signal.Signals = signal.SIGINT) -> bool:
        """Send SIGINT (a Ctrl-C) to a run, or `sig`. Our children lead their own process group,
        so the whole group gets it, as a terminal would do. Returns False when the process is gone."""
        launch = self.for_pid(pid)
        try:
            if launch is not None and self.is_running(launch):
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def alive(self, pid: int) -> bool:
        """Whether the process still runs. A child of this session is asked through its Popen,
        which also reaps it (an ended child not yet waited for would look alive to kill(pid, 0))."""
        proc = next((p for key, p in list(self._procs.items()) if self._session[key].pid == pid), None)
        return proc.poll() is None if proc is not None else pid_alive(pid)

    async def stop_escalating(
        self,
        pid: int,
        what: str,
        *,
        grace_s: float | None = None,
        report: Callable[[StopProgress], None] | None = None,
        poll_s: float = 0.1,
    ) -> StopProgress:
        """Stop a run and say each step: SIGINT ("stopping (SIGINT sent)"); if it is still there
        after `grace_s` (default `stop_grace_s`), SIGTERM ("did not stop after N s: SIGTERM sent");
        then "stopped" once it is gone, or "still running" if even SIGTERM did not end it within
        another grace period (never SIGKILL: that is the user's call, and the line says how).
        `report` gets the progress after each step; `self.stopping[pid]` holds it meanwhile."""
        grace = self.stop_grace_s if grace_s is None else grace_s
        progress = self.stopping[pid] = StopProgress(pid, what, grace)

        def say(phase: str, line: str) -> None:
            progress.phase = phase
            progress.said.append(line)
            if report is not None:
                report(progress)

        if not self.stop(pid):
            say("gone", "the process is already gone")
            return progress
        say("interrupted", "stopping (SIGINT sent)")
        if await self._gone_within(pid, grace, poll_s):
            say("stopped", "stopped")
            return progress
        if not self.stop(pid, signal.SIGTERM):
            say("stopped", "stopped")
            return progress
        say("terminated", f"did not stop after {grace:g} s: SIGTERM sent")
        if await self._gone_within(pid, grace, poll_s):
            say("stopped", "stopped (SIGTERM)")
        else:
            say("still running", f"still running {grace:g} s after SIGTERM: `kill -9 {pid}` ends it")
        return progress

    async def _gone_within(self, pid: int, seconds: float, poll_s: float) -> bool:
        """Whether the process ends within `seconds` (checked every `poll_s`: it may not be our
        child, so there is nothing to wait on)."""
        deadline = time.monotonic() + seconds
        while self.alive(pid):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    def dismiss(self, launch_id: str) -> Launch:
        """Forget a launch that has ended: delete its record and its output log, both in
        outputs/tui/launches/ (never a run folder), so its row is gone in this session and later
        ones. For a launch whose run folder never appeared (its pending row). ValueError with a
        one-line reason when there is no such record, or its process still runs; OSError when
        the files cannot be deleted."""
        if not launch_id or Path(launch_id).name != launch_id or launch_id.startswith("."):
            raise ValueError(f"not a launch id: {launch_id!r}")
        record = self.folder / f"{launch_id}.json"
        with self._lock:
            launch = self._session.get(launch_id) or self._record(record)
            if launch is None or launch.id != launch_id:
                raise ValueError(f"no launch record {launch_id}")
            if self.is_running(launch):
                raise ValueError(f"launch {launch_id} is still running (pid {launch.pid})")
            record.unlink(missing_ok=True)
            (self.folder / f"{launch_id}.log").unlink(missing_ok=True)
            self._session.pop(launch_id, None)
            self._procs.pop(launch_id, None)  # ended (is_running reaped it): nothing left to poll
            self._records.pop(record, None)
            self._settled.pop(launch_id, None)
        return launch

    def _record(self, path: Path) -> Launch | None:
        """A launch record from disk, parsed once per change (polled every second)."""
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return None
        cached = self._records.get(path)
        if cached is None or cached[0] != mtime:
            try:
                launch: Launch | None = Launch.from_dict(read_json(path))
            except (OSError, ValueError, TypeError):
                launch = None
            cached = self._records[path] = (mtime, launch)
        return cached[1]

    def _save(self, launch: Launch) -> None:
        write_json_atomic(self.folder / f"{launch.id}.json", asdict(launch))


def launch_of(run: RunInfo) -> Launch | None:
    """The launch record attached to a pending row."""
    data = run.metadata.get("launch")
    return Launch.from_dict(data) if isinstance(data, dict) else None


# ===== Short commands the TUI waits on (issue 35: the Environments screen, the config editor) =====
# `workbench env list --json`, `env init`, `env install` and a config's dry run are not runs: they
# get no launch record and no Runs row. They still run as child processes, never in the TUI's own
# process: listing environments imports their modules (reward code, sometimes transformers), and a
# dry run loads every environment a config names.


def child_environment(root: Path, columns: int = 120) -> dict[str, str]:
    """The environment of a child `workbench`: this workspace, unbuffered plain-text output
    `columns` wide (rich lays its tables out to COLUMNS when it is not writing to a terminal)."""
    env = {**os.environ, "WORKBENCH_WORKSPACE": str(root), "PYTHONUNBUFFERED": "1", "COLUMNS": str(columns)}
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):  # the TUI's terminal is not the child's
        env.pop(name, None)
    return env


def start_task(launcher: Launcher, args: list[str], *, columns: int = 120) -> subprocess.Popen[str]:
    """Start `workbench ARGS` in the workspace with its stdout and stderr merged into one text pipe
    the caller reads (in a worker thread: `communicate`, or line by line). Its own session, as a
    launch's, so a Ctrl-C in the TUI's terminal never reaches it; the caller may `kill` it (a dry
    run superseded by newer text)."""
    return subprocess.Popen(
        [launcher.python, "-m", "workbench", *args],
        cwd=launcher.root,
        env=child_environment(launcher.root, columns),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
        start_new_session=True,
    )
