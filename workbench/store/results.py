"""Eval (and GEPA/train sample) results: `results.jsonl` in a run folder (its `metadata.json`
belongs to `store.runs`).

Groups are appended as they finish and flushed, so a killed process loses at most the group
being written. On resume, only complete groups count; a partial group's lines are dropped.

`read_groups` loads a whole run; `iter_groups` streams it a group at a time (what an eval's
resume and a paired comparison use, so memory does not grow with the run).
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
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
        try:
            self._file.close()
        except OSError:  # a full disk: what did not fit is no result (resume redoes its group)
            pass


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


def iter_groups(run_dir: Path, rollouts_per_example: int | None = None) -> Iterator[Group]:
    """The complete groups of a run (as `read_groups`), one at a time: each is yielded once its
    last line is read, so only groups whose lines are still to come are held (one at a time for
    a file written by `ResultsWriter`, whose groups are contiguous). Two passes over the file:
    the first counts each example's lines."""
    path = run_dir / RESULTS
    counts = Counter(record["example_id"] for record in iter_jsonl(path))
    pending: dict[int, list[Rollout]] = defaultdict(list)
    for record in iter_jsonl(path):
        example_id = record["example_id"]
        expected = counts.get(example_id, 0)
        if rollouts_per_example is not None and expected != rollouts_per_example:
            continue  # a partial (or doubled) group: never yielded, so never held
        rollouts = pending[example_id]
        rollouts.append(Rollout.from_record(record))
        if len(rollouts) == expected:
            del pending[example_id]
            yield Group(example_id, sorted(rollouts, key=lambda r: r.rollout_index))


def compact_results(run_dir: Path, groups: Iterable[Group]) -> None:
    """Rewrite results.jsonl with exactly `groups` (drops partial groups before a resume). They
    may come from `iter_groups` of the same file: it is replaced only once all are written."""
    path = run_dir / RESULTS
    tmp = path.with_name(f".{RESULTS}.tmp")
    with tmp.open("wb") as f:
        for group in groups:
            f.write(b"".join(orjson.dumps(r.to_record()) + b"\n" for r in group.rollouts))
    os.replace(tmp, path)
