"""A lazy, compact index over a rollouts file (`results.jsonl`, `rollouts/step_N.jsonl`).

Opening a run with 10,000 rollouts must take well under half a second, and one with 100,000
must not hold the run in memory. So the index keeps, per line, only a few numbers in flat
arrays — byte offset and length, example id, rollout index, reward, error/truncated/
infrastructure flags (about 40 bytes a rollout) — and per example a `GroupRow` (its lines, mean,
std, flags). A rollout (or one example's group) is read back from disk, by offset, when it is
shown; whole-run numbers (the variance report) come from the rows alone.

`refresh()` reads only bytes appended since the last call (a live eval grows group by group),
in chunks, and never consumes a torn last line; a file that shrank (a resume compacts it) is
re-read. Group mean and std are those of the project's own `Group`, so they mean what they
mean everywhere; `load_group` gives that `Group` with its rollouts read from disk.
"""

from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from workbench.types import Group, Rollout

CHUNK = 8 << 20  # bytes read at a time: memory stays bounded however large the file
# Bits of a line's flags. INFRASTRUCTURE: its error is one the serving side caused
# (`RolloutError.infrastructure`), so its group is no result (`Group.infrastructure_failures`).
ERROR, TRUNCATED, INFRASTRUCTURE = 1, 2, 4


@dataclass(slots=True)
class GroupRow:
    """One example's group as the tables show it, without its rollouts."""

    example_id: int
    lines: list[int]  # the index's line numbers, in rollout_index order
    mean: float
    std: float  # population std, as `Group.std`
    errors: bool  # at least one rollout errored
    truncated: bool  # at least one rollout was truncated
    infrastructure_failures: int = 0  # rollouts the serving side failed, as `Group.infrastructure_failures`

    @property
    def size(self) -> int:
        return len(self.lines)


@dataclass(frozen=True)
class RolloutFilter:
    """Which groups to show. All conditions must hold; the default shows everything."""

    errors: bool = False  # groups with at least one errored rollout
    truncated: bool = False  # groups with at least one truncated rollout
    zero_variance: bool = False  # groups whose rollouts all scored the same
    reward_min: float | None = None  # group mean reward bounds (inclusive)
    reward_max: float | None = None
    search: str = ""  # case-insensitive text anywhere in a group's records

    @property
    def active(self) -> bool:
        return self != RolloutFilter()

    def parts(self) -> list[tuple[str, str]]:
        """(the key that toggles or sets it, what it keeps) of each filter that is on."""
        parts = [
            (key, name)
            for key, name, on in (
                ("e", "errors", self.errors),
                ("t", "truncated", self.truncated),
                ("z", "zero-variance", self.zero_variance),
            )
            if on
        ]
        if self.reward_min is not None or self.reward_max is not None:
            parts.append(("r", f"reward {_fmt_bound(self.reward_min)}..{_fmt_bound(self.reward_max)}"))
        if self.search:
            parts.append(("/", f"/{self.search}"))
        return parts

    def describe(self) -> str:
        """The filters that are on, joined by "+" (a group must pass all of them), or "none"."""
        return " + ".join(name for _, name in self.parts()) or "none"

    def explain_empty(self) -> str:
        """Why a filtered list is empty, and how to get groups back."""
        parts = self.parts()
        keys = ", ".join(f"{key} ({name})" for key, name in parts)
        every = "every filter" if len(parts) > 1 else "the filter"
        return (
            f"No group passes {every}: {self.describe()}. Filters combine: a group must pass all "
            f"of them. Turn one off with {keys}; a clears them all."
        )


def _fmt_bound(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def parse_reward_range(text: str) -> tuple[float | None, float | None]:
    """'0.2..0.8', '0.5..', '..0.1', '0.3-0.6' or a single number (exact) -> (min, max).
    Raises ValueError with a readable message."""
    text = text.strip()
    if not text:
        return None, None
    parts = re.split(r"\s*(?:\.\.|:|,|\s-\s|(?<=\d)-(?=[\d.]))\s*", text, maxsplit=1)
    if len(parts) == 1:
        value = float(parts[0])
        return value, value
    low = float(parts[0]) if parts[0] else None
    high = float(parts[1]) if parts[1] else None
    if low is not None and high is not None and low > high:
        raise ValueError(f"empty range: {low:g} > {high:g}")
    return low, high


class RolloutIndex:
    """Offsets and a few numbers per line of one JSON-lines rollouts file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._clear()

    def _clear(self) -> None:
        self.starts = array("q")  # byte offset of each complete line
        self.lengths = array("q")
        self.example_ids = array("q")
        self.rollout_indices = array("q")
        self.rewards = array("d")
        self.flags = array("B")
        self._pos = 0  # bytes consumed (always at a line boundary)
        self._groups: list[GroupRow] | None = None
        self._group_of: dict[int, GroupRow] = {}
        self._line_of: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def reward_mean(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    def refresh(self) -> bool:
        """Index lines appended since the last call. Returns True when anything changed."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        reset = size < self._pos
        if reset:  # rewritten (compacted on resume): start over
            self._clear()
        if size == self._pos:
            return reset
        added = 0
        with self.path.open("rb") as f:
            while self._pos < size:
                f.seek(self._pos)
                chunk = f.read(min(CHUNK, size - self._pos))
                while b"\n" not in chunk and self._pos + len(chunk) < size:  # a line longer than a chunk
                    chunk += f.read(min(CHUNK, size - self._pos - len(chunk)))
                end = chunk.rfind(b"\n")
                if end < 0:
                    break  # only a torn line left
                added += self._add_lines(chunk, end)
        if added or reset:
            self._groups = None
        return added > 0 or reset

    def _add_lines(self, chunk: bytes, end: int) -> int:
        base, start, added = self._pos, 0, 0
        while start <= end:
            stop = chunk.index(b"\n", start)
            if stop > start:
                added += self._add(chunk[start:stop], base + start)
            start = stop + 1
        self._pos = base + end + 1
        return added

    def _add(self, line: bytes, offset: int) -> int:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            return 0
        if not isinstance(record, dict) or "example_id" not in record:
            return 0
        example_id, rollout_index = int(record["example_id"]), int(record.get("rollout_index", 0))
        self._line_of[(example_id, rollout_index)] = len(self.rewards)
        self.starts.append(offset)
        self.lengths.append(len(line))
        self.example_ids.append(example_id)
        self.rollout_indices.append(rollout_index)
        reward = record.get("reward")
        self.rewards.append(float(reward) if isinstance(reward, (int, float)) else 0.0)
        error = record.get("error")
        self.flags.append(
            (ERROR if error else 0)
            | (TRUNCATED if record.get("is_truncated") else 0)
            | (INFRASTRUCTURE if isinstance(error, dict) and error.get("infrastructure") else 0)
        )
        return 1

    def groups(self) -> list[GroupRow]:
        """One row per example, by example id (cached until new lines arrive)."""
        if self._groups is None:
            lines_of: dict[int, list[int]] = {}
            for line, example_id in enumerate(self.example_ids):
                lines_of.setdefault(example_id, []).append(line)
            rows = []
            for example_id in sorted(lines_of):
                lines = sorted(lines_of[example_id], key=self.rollout_indices.__getitem__)
                rewards = [self.rewards[i] for i in lines]
                mean = sum(rewards) / len(rewards)
                flags = failures = 0
                for i in lines:
                    flags |= self.flags[i]
                    failures += self.flags[i] & INFRASTRUCTURE != 0
                rows.append(
                    GroupRow(
                        example_id,
                        lines,
                        mean,
                        math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)),
                        bool(flags & ERROR),
                        bool(flags & TRUNCATED),
                        failures,
                    )
                )
            self._groups = rows
            self._group_of = {row.example_id: row for row in rows}
        return self._groups

    def group(self, example_id: int) -> GroupRow | None:
        """One example's row (None: not in this file)."""
        self.groups()
        return self._group_of.get(example_id)

    def rollout_index_at(self, row: GroupRow, position: int) -> int:
        """The rollout_index of the `position`-th rollout (0-based) of a group."""
        return self.rollout_indices[row.lines[position]]

    def raw(self, example_id: int, rollout_index: int) -> bytes:
        """The exact JSON line of one rollout, read from disk."""
        line = self._line_of[(example_id, rollout_index)]
        with self.path.open("rb") as f:
            f.seek(self.starts[line])
            return f.read(self.lengths[line])

    def record(self, example_id: int, rollout_index: int) -> dict[str, Any]:
        return orjson.loads(self.raw(example_id, rollout_index))

    def load(self, example_id: int, rollout_index: int) -> Rollout:
        """The full rollout (conversation included)."""
        return Rollout.from_record(self.record(example_id, rollout_index))

    def load_group(self, example_id: int) -> Group:
        """One example's rollouts, read from disk (a group is a handful of lines)."""
        row = self.group(example_id)
        lines = row.lines if row is not None else []
        with self.path.open("rb") as f:
            rollouts = []
            for line in lines:
                f.seek(self.starts[line])
                rollouts.append(Rollout.from_record(orjson.loads(f.read(self.lengths[line]))))
        return Group(example_id, rollouts)

    def load_groups(self) -> list[Group]:
        """Every group with its rollouts (the whole file: for analyses over all of it)."""
        return [self.load_group(row.example_id) for row in self.groups()]

    def search(self, query: str) -> set[int]:
        """Example ids whose records contain `query` (case-insensitive, raw text of the line),
        reading the file a chunk at a time."""
        needle = query.lower().encode()
        if not needle:
            return set(self.example_ids)
        found: set[int] = set()
        with self.path.open("rb") as f:
            line, count = 0, len(self.starts)
            while line < count:
                first = line
                while line < count and self.starts[line] + self.lengths[line] - self.starts[first] <= CHUNK:
                    line += 1
                line = max(line, first + 1)
                f.seek(self.starts[first])
                data = f.read(self.starts[line - 1] + self.lengths[line - 1] - self.starts[first])
                for i in range(first, line):
                    at = self.starts[i] - self.starts[first]
                    if needle in data[at : at + self.lengths[i]].lower():
                        found.add(self.example_ids[i])
        return found

    def filtered(self, flt: RolloutFilter) -> list[GroupRow]:
        """The groups passing `flt`, in example order."""
        groups = self.groups()
        if not flt.active:
            return groups
        hits = self.search(flt.search) if flt.search else None
        return [g for g in groups if group_passes(g, flt) and (hits is None or g.example_id in hits)]


def group_passes(group: GroupRow, flt: RolloutFilter) -> bool:
    """Everything but search (which needs the file)."""
    if flt.errors and not group.errors:
        return False
    if flt.truncated and not group.truncated:
        return False
    if flt.zero_variance and group.std >= 1e-9:
        return False
    if flt.reward_min is not None and group.mean < flt.reward_min - 1e-12:
        return False
    return not (flt.reward_max is not None and group.mean > flt.reward_max + 1e-12)


def group_flags(group: GroupRow) -> str:
    """Short markers for a group row: E errors, T truncated, 0 zero variance."""
    flags = ""
    if group.errors:
        flags += "E"
    if group.truncated:
        flags += "T"
    if group.size > 1 and group.std < 1e-9:
        flags += "0"
    return flags
