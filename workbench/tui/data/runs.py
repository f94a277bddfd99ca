"""Discover every run under a workspace from its `metadata.json` alone (DESIGN §9), read through
the store's run model (`store.runs`), which also says a dead run's status.

Listing never opens results or weights: one small JSON per run, cached by (mtime, size) so the
Runs screen can re-scan every second. A run marked `running` whose process is gone (killed,
OOM) is shown as `died` so a stale status never looks alive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from workbench.store.files import read_json
from workbench.store.runs import METADATA, effective_status, parse_run_metadata, pid_alive
from workbench.workspace import RUN_FOLDERS

__all__ = ["RunCatalog", "RunInfo", "filter_runs", "parse_time", "pid_alive", "run_from_metadata"]

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

    @property
    def key(self) -> str:
        """Stable identity for table rows and marks."""
        return str(self.path)

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

    def matches(self, query: str) -> bool:
        """Case-insensitive substring search over the visible fields."""
        text = f"{self.kind} {self.env} {self.model} {self.status} {self.run_id}".lower()
        return all(part in text for part in query.lower().split())


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    return stamp.astimezone() if stamp.tzinfo else stamp


def run_from_metadata(path: Path, meta: dict[str, Any], kind: str) -> RunInfo:
    """One metadata.json as a row, through the store's run model. ValueError when it is not
    run metadata."""
    run = parse_run_metadata(meta, kind)
    done, total = run.progress()
    return RunInfo(kind=run.kind, path=path, run_id=run.run_id or path.name, env=run.env_label,
                   model=run.model or "-", status=effective_status(run), done=done, total=total,
                   reward=run.headline_reward, created_at=parse_time(run.created_at), pid=run.pid, metadata=meta)


class RunCatalog:
    """Scans a workspace for runs; re-reads a metadata.json only when it changed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[Path, tuple[tuple[int, int], RunInfo]] = {}

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
        except (OSError, ValueError):
            return cached[1] if cached else None
        try:
            info = run_from_metadata(meta_path.parent, meta, kind)
        except ValueError:  # not run metadata (another tool's file): not a run
            return None
        self._cache[meta_path] = (stamp, info)
        return info


def filter_runs(runs: list[RunInfo], kind: str | None, status: str | None, query: str) -> list[RunInfo]:
    return [r for r in runs
            if (kind is None or r.kind == kind) and (status is None or r.status == status)
            and (not query or r.matches(query))]
