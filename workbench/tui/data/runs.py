"""Discover every run under a workspace from its `metadata.json` alone (DESIGN §9), read through
the store's run model (`store.runs`), which also says a dead run's status.

Listing never opens results or weights: one small JSON per run, cached by (mtime, size) so the
Runs screen can re-scan every second. A run marked `running` whose process is gone (killed,
OOM) is shown as `died` so a stale status never looks alive.

An eval of a training run's checkpoint is labelled by what it evaluated, "<run> step N" (or
"<run> base"), not by its model string: a checkpoint folder's path is cut off in a narrow
column, `-m outputs/runs/latest` names another run once a newer one is trained, and a sweep
through a `-b` server evaluates every checkpoint under the server's one model name. The label
comes from the training run's sweep record when it has one, else from the model the eval
resolved at launch (`resolved_model` in its metadata), else from the checkpoint path
(`checkpoint_label`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from workbench.store.files import read_json
from workbench.store.runs import METADATA, effective_status, parse_run_metadata, pid_alive
from workbench.store.sweeps import BASE, SWEEP_FILE, read_sweep
from workbench.workspace import RUN_FOLDERS

__all__ = [
    "RunCatalog",
    "RunInfo",
    "checkpoint_label",
    "filter_runs",
    "parse_time",
    "pid_alive",
    "run_from_metadata",
    "short_id",
]

KINDS = ("eval", "train", "gepa")
STATUSES = ("running", "finished", "stopped", "failed", "died", "starting")


@dataclass
class RunInfo:
    """One row of the Runs screen: what metadata.json says, normalized across kinds."""

    kind: str  # eval | train | gepa
    path: Path  # the run folder (for a pending launch: its log file)
    run_id: str
    env: str
    model: str
    status: str
    done: int | None = None
    total: int | None = None
    reward: float | None = None
    created_at: datetime | None = None
    pid: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict, repr=False)
    checkpoint: str | None = None  # for an eval of a training checkpoint: "<run> step N" / "<run> base"

    @property
    def model_label(self) -> str:
        """The model as a reader tells runs apart: the checkpoint label, else the model."""
        return self.checkpoint or self.model

    @property
    def key(self) -> str:
        """Stable identity for table rows and marks."""
        return str(self.path)

    @property
    def short_id(self) -> str:
        """The few characters that tell this run from its neighbours (`short_id`)."""
        return short_id(self.run_id)

    @property
    def model_path(self) -> str | None:
        """The model folder the run loaded, as resolved at launch (an eval of `-m RUN` or
        `-m outputs/runs/latest`: the checkpoint it meant then), or None when not recorded."""
        resolved = self.metadata.get("resolved_model")
        path = resolved.get("path") if isinstance(resolved, dict) else None
        return path if isinstance(path, str) else None

    @property
    def progress(self) -> str:
        if self.done is None:
            return "-"
        return f"{self.done}/{self.total}" if self.total else str(self.done)

    @property
    def is_launch(self) -> bool:
        """A child started from the TUI that has not written its run folder yet."""
        return "launch" in self.metadata

    @property
    def is_live(self) -> bool:
        return self.status in ("running", "starting")

    @property
    def error(self) -> str | None:
        """Why a failed run failed, in one line: the first line of the `error` its metadata.json
        keeps (a pending launch's rows keep their log's error line there too); None for a row that
        did not fail, or whose error is not known."""
        error = self.metadata.get("error")
        if self.status not in ("failed", "died") or not isinstance(error, str):
            return None
        first = next((line.strip() for line in error.splitlines() if line.strip()), "")
        return first or None

    def matches(self, query: str) -> bool:
        """Case-insensitive substring search over the visible fields."""
        text = (
            f"{self.kind} {self.env} {self.model} {self.checkpoint or ''} {self.status} {self.run_id}".lower()
        )
        return all(part in text for part in query.lower().split())


RUN_ID_TAIL = re.compile(r"\d{8}-\d{6}-([0-9a-f]{4})$")  # workspace.new_run_id's random part


def short_id(run_id: str) -> str:
    """A run id as a table shows it: the random part of a generated id ('20260102-030405-3f2a',
    also at the end of a training run's folder name: '3f2a'), else the whole name (a
    `run_name` the user chose)."""
    match = RUN_ID_TAIL.search(run_id)
    return match.group(1) if match else run_id


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    return stamp.astimezone() if stamp.tzinfo else stamp


STEP_NAME = re.compile(r"^step_(\d+)$")
SERVED_STEP = re.compile(r"^(.+)-step_(\d+)$")  # a LoRA checkpoint loaded into a server: <run>-step_N


def checkpoint_label(model: str) -> str | None:
    """'<run> step N' when `model` is a training checkpoint (a `<run>/checkpoints/step_N` folder,
    or the `<run>-step_N` name a sweep loads it under into a server), else None."""
    path = Path(model)
    step = STEP_NAME.match(path.name)
    if step is not None and path.parent.name == "checkpoints" and path.parent.parent.name:
        return f"{path.parent.parent.name} step {int(step.group(1))}"
    served = SERVED_STEP.match(model)
    return f"{served.group(1)} step {int(served.group(2))}" if served is not None else None


def run_from_metadata(path: Path, meta: dict[str, Any], kind: str) -> RunInfo:
    """One metadata.json as a row, through the store's run model. ValueError when it is not
    run metadata."""
    run = parse_run_metadata(meta, kind)
    done, total = run.progress()
    resolved = run.resolved_model.label if run.resolved_model is not None else None
    return RunInfo(
        kind=run.kind,
        path=path,
        run_id=run.run_id or path.name,
        env=run.env_label,
        model=run.model or "-",
        status=effective_status(run),
        done=done,
        total=total,
        reward=run.headline_reward,
        created_at=parse_time(run.created_at),
        pid=run.pid,
        metadata=meta,
        checkpoint=(resolved or checkpoint_label(run.model)) if run.kind == "eval" else None,
    )


def unreadable_run(path: Path, kind: str) -> RunInfo:
    """A run folder whose metadata.json cannot be read: still listed, so it does not vanish."""
    return RunInfo(kind=kind, path=path, run_id=path.name, env="-", model="-", status="unreadable")


class RunCatalog:
    """Scans a workspace for runs; re-reads a metadata.json only when it changed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[Path, tuple[tuple[int, int], RunInfo]] = {}
        self._sweeps: dict[Path, tuple[tuple[int, int], dict[Path, str]]] = {}

    def scan(self) -> list[RunInfo]:
        """All runs, newest first. A metadata.json being replaced or unreadable is skipped this round."""
        runs: list[RunInfo] = []
        seen: set[Path] = set()
        for kind in ("eval", "train", "gepa"):
            for meta_path in self.root.glob(f"{RUN_FOLDERS[kind]}/{METADATA}"):
                seen.add(meta_path)
                info = self._load(meta_path, kind)
                if info is not None:
                    runs.append(info)
        for stale in set(self._cache) - seen:
            del self._cache[stale]
        self._label_sweep_evals(runs)
        runs.sort(key=lambda r: (r.created_at.timestamp() if r.created_at else 0.0, r.run_id), reverse=True)
        return runs

    def _load(self, meta_path: Path, kind: str) -> RunInfo | None:
        try:
            st = meta_path.stat()
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._cache.get(meta_path)
        if cached is not None and cached[0] == stamp and not cached[1].is_live:
            return cached[1]
        try:
            meta = read_json(meta_path)
            info = run_from_metadata(meta_path.parent, meta, kind)
        except (OSError, ValueError):  # garbage, a hand edit gone wrong, no permission: listed as such
            info = unreadable_run(meta_path.parent, kind)
        self._cache[meta_path] = (stamp, info)
        return info

    def _label_sweep_evals(self, runs: list[RunInfo]) -> None:
        """Label each eval that a training run's sweep recorded with that run and step."""
        labels: dict[Path, str] = {}
        for run in runs:
            if run.kind == "train":
                labels.update(self.sweep_labels(run.path))
        if not labels:  # no sweeps: nothing to resolve (this runs every second)
            return
        for run in runs:
            if run.kind == "eval":
                label = labels.get(run.path.resolve())
                if label is not None:
                    run.checkpoint = label

    def sweep_labels(self, run_dir: Path) -> dict[Path, str]:
        """{eval run folder: '<run> step N'} from `checkpoint_evals.jsonl`, re-read when it changes."""
        path = run_dir / SWEEP_FILE
        try:
            st = path.stat()
        except OSError:
            return {}
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._sweeps.get(path)
        if cached is None or cached[0] != stamp:
            found = {}
            for point in read_sweep(run_dir):
                eval_dir = Path(point.eval_run)
                eval_dir = eval_dir if eval_dir.is_absolute() else self.root / eval_dir
                found[eval_dir.resolve()] = (
                    f"{run_dir.name} {'base' if point.step == BASE else f'step {point.step}'}"
                )
            cached = self._sweeps[path] = (stamp, found)
        return cached[1]


def filter_runs(runs: list[RunInfo], kind: str | None, status: str | None, query: str) -> list[RunInfo]:
    return [
        r
        for r in runs
        if (kind is None or r.kind == kind)
        and (status is None or r.status == status)
        and (not query or r.matches(query))
    ]


def best_per_model(runs: list[RunInfo]) -> list[tuple[RunInfo, int]]:
    """The Runs screen grouped by environment, as `prime eval view` shows evals: for each
    environment (in name order) and each model evaluated on it (as labelled: `model_label`), the
    best eval — finished ones first, then by reward, then the newest — with how many evals that
    model has there; an environment's models best first."""
    groups: dict[tuple[str, str], list[RunInfo]] = {}
    for run in runs:
        if run.kind == "eval" and not run.is_launch:
            groups.setdefault((run.env, run.model_label), []).append(run)

    def rank(run: RunInfo) -> tuple[bool, float, float]:
        started = run.created_at.timestamp() if run.created_at else 0.0
        reward = run.reward if run.reward is not None else float("-inf")
        return (run.status == "finished", reward, started)

    best = [(max(group, key=rank), len(group)) for group in groups.values()]
    return sorted(best, key=lambda item: (item[0].env.casefold(), tuple(-x for x in rank(item[0]))))
