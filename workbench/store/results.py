"""Eval (and GEPA/train sample) results: `results.jsonl` in a run folder (its `metadata.json`
belongs to `store.runs`).

Groups are appended as they finish and flushed, so a killed process loses at most the group
being written. On resume, only complete groups count; a partial group's lines are dropped.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import orjson

from workbench.store.files import iter_jsonl
from workbench.types import Group, Rollout

RESULTS = "results.jsonl"


class ResultsWriter:
    """Appends groups to results.jsonl, one rollout per line."""

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / RESULTS
        self._file = self.path.open("ab")

    def write_group(self, group: Group) -> None:
        self._file.write(b"".join(orjson.dumps(r.to_record()) + b"\n" for r in group.rollouts))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_groups(run_dir: Path, rollouts_per_example: int | None = None) -> list[Group]:
    """The complete groups of a run, in file order (a group is complete with r rollouts)."""
    by_example: dict[int, list[Rollout]] = defaultdict(list)
    for record in iter_jsonl(run_dir / RESULTS):
        by_example[record["example_id"]].append(Rollout.from_record(record))
    groups = []
    for example_id, rollouts in by_example.items():
        if rollouts_per_example is None or len(rollouts) == rollouts_per_example:
            groups.append(Group(example_id, sorted(rollouts, key=lambda r: r.rollout_index)))
    return groups


def compact_results(run_dir: Path, groups: list[Group]) -> None:
    """Rewrite results.jsonl with exactly `groups` (drops partial groups before a resume)."""
    path = run_dir / RESULTS
    tmp = path.with_name(f".{RESULTS}.tmp")
    with tmp.open("wb") as f:
        for group in groups:
            f.write(b"".join(orjson.dumps(r.to_record()) + b"\n" for r in group.rollouts))
    os.replace(tmp, path)
