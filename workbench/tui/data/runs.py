"""Discover every run under a workspace from its `metadata.json` alone (DESIGN §9).

Listing never opens results or weights: one small JSON per run, cached by (mtime, size) so the
Runs screen can re-scan every second. A run marked `running` whose process is gone (killed,
OOM) is shown as `died` so a stale status never looks alive.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from workbench.store.files import read_json

EVAL_GLOB = "environments/*/outputs/evals/*/*/metadata.json"
GEPA_GLOB = "environments/*/outputs/gepa/*/*/metadata.json"
TRAIN_GLOB = "outputs/runs/*/metadata.json"

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


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    return stamp.astimezone() if stamp.tzinfo else stamp


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def run_from_metadata(path: Path, meta: dict[str, Any], kind: str) -> RunInfo:
    """Normalize one metadata.json; missing keys become None (shown as '-')."""
    kind = str(meta.get("kind") or kind)
    status = str(meta.get("status") or "unknown")
    pid = _int(meta.get("pid"))
    if status == "running" and pid is not None and not pid_alive(pid):
        status = "died"
    if kind == "train":
        done, total = _int(meta.get("step")), _int(meta.get("max_steps"))
    elif kind == "gepa":
        config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
        done = _int(meta.get("metric_calls_used", meta.get("metric_calls")))
        total = _int(meta.get("max_calls", config.get("max_calls")))
    else:
        done, total = _int(meta.get("completed_rollouts")), _int(meta.get("total_rollouts"))
    reward = _number(meta.get("reward_mean"))
    if kind == "gepa":
        reward = _number(meta.get("best_score", meta.get("reward_mean")))
    env = meta.get("env_id") or "+".join(meta.get("env_ids") or []) or "-"
    return RunInfo(kind=kind, path=path, run_id=str(meta.get("run_id") or path.name), env=str(env),
                   model=str(meta.get("model") or "-"), status=status, done=done, total=total, reward=reward,
                   created_at=parse_time(meta.get("created_at")), pid=pid, metadata=meta)


class RunCatalog:
    """Scans a workspace for runs; re-reads a metadata.json only when it changed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[Path, tuple[tuple[int, int], RunInfo]] = {}

    def scan(self) -> list[RunInfo]:
        """All runs, newest first. A metadata.json being replaced or unreadable is skipped this round."""
        runs: list[RunInfo] = []
        seen: set[Path] = set()
        for pattern, kind in ((EVAL_GLOB, "eval"), (TRAIN_GLOB, "train"), (GEPA_GLOB, "gepa")):
            for meta_path in self.root.glob(pattern):
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
        if not isinstance(meta, dict):
            return None
        info = run_from_metadata(meta_path.parent, meta, kind)
        self._cache[meta_path] = (stamp, info)
        return info


def filter_runs(runs: list[RunInfo], kind: str | None, status: str | None, query: str) -> list[RunInfo]:
    return [r for r in runs
            if (kind is None or r.kind == kind) and (status is None or r.status == status)
            and (not query or r.matches(query))]
