"""A lazy index over a rollouts file (`results.jsonl`, `rollouts/step_N.jsonl`).

Opening a run with 10,000 rollouts must take well under a second, so the index keeps, per line,
only its byte offset and a *light* `Rollout` (reward, per-function rewards, flags, usage) with
the conversation dropped. The full record is read back from its offset when a rollout is shown.
`refresh()` reads only bytes appended since the last call (a live eval grows group by group)
and never consumes a torn last line; a file that shrank (a resume compacts it) is re-read.
Groups are built with the project's own `Group`, so mean/std mean what they mean everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from workbench.types import Group, Rollout

# Heavy fields dropped from the light copy kept in memory (read back from disk on demand).
HEAVY_FIELDS = ("prompt", "completion", "info", "state", "tokens")


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

    def describe(self) -> str:
        parts = [name for name, on in (("errors", self.errors), ("truncated", self.truncated),
                                       ("zero-variance", self.zero_variance)) if on]
        if self.reward_min is not None or self.reward_max is not None:
            parts.append(f"reward {_fmt_bound(self.reward_min)}..{_fmt_bound(self.reward_max)}")
        if self.search:
            parts.append(f"/{self.search}")
        return ", ".join(parts) or "none"


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
    """Byte offsets + light rollouts of one JSON-lines rollouts file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets: list[tuple[int, int]] = []  # (start, length) of each complete line
        self.rollouts: list[Rollout] = []  # light copies, same order as offsets
        self._pos = 0  # bytes consumed (always at a line boundary)
        self._groups: list[Group] | None = None
        self._line_of: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self.rollouts)

    def refresh(self) -> bool:
        """Index lines appended since the last call. Returns True when anything changed."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size < self._pos:  # rewritten (compacted on resume): start over
            self.__init__(self.path)  # type: ignore[misc]
        if size == self._pos:
            return False
        with self.path.open("rb") as f:
            f.seek(self._pos)
            chunk = f.read(size - self._pos)
        end = chunk.rfind(b"\n")
        if end < 0:
            return False  # only a torn line so far
        base, start, added = self._pos, 0, 0
        while start <= end:
            stop = chunk.index(b"\n", start)
            line = chunk[start:stop]
            if line.strip():
                added += self._add(line, base + start)
            start = stop + 1
        self._pos = base + end + 1
        if added:
            self._groups = None
        return added > 0

    def _add(self, line: bytes, offset: int) -> int:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            return 0
        if not isinstance(record, dict) or "example_id" not in record:
            return 0
        for name in HEAVY_FIELDS:
            record.pop(name, None)
        record["prompt"] = []
        light = Rollout.from_record(record)
        key = (light.example_id, light.rollout_index)
        self._line_of[key] = len(self.rollouts)
        self.offsets.append((offset, len(line)))
        self.rollouts.append(light)
        return 1

    def groups(self) -> list[Group]:
        """Groups of light rollouts, by example id (cached until new lines arrive)."""
        if self._groups is None:
            by_example: dict[int, list[Rollout]] = {}
            for rollout in self.rollouts:
                by_example.setdefault(rollout.example_id, []).append(rollout)
            self._groups = [Group(eid, sorted(rs, key=lambda r: r.rollout_index))
                            for eid, rs in sorted(by_example.items())]
        return self._groups

    def raw(self, example_id: int, rollout_index: int) -> bytes:
        """The exact JSON line of one rollout, read from disk."""
        start, length = self.offsets[self._line_of[(example_id, rollout_index)]]
        with self.path.open("rb") as f:
            f.seek(start)
            return f.read(length)

    def record(self, example_id: int, rollout_index: int) -> dict[str, Any]:
        return orjson.loads(self.raw(example_id, rollout_index))

    def load(self, example_id: int, rollout_index: int) -> Rollout:
        """The full rollout (conversation included)."""
        return Rollout.from_record(self.record(example_id, rollout_index))

    def search(self, query: str) -> set[int]:
        """Example ids whose records contain `query` (case-insensitive, raw text of the line)."""
        needle = query.lower().encode()
        if not needle:
            return {r.example_id for r in self.rollouts}
        data = self.path.read_bytes()
        return {self.rollouts[i].example_id for i, (start, length) in enumerate(self.offsets)
                if needle in data[start:start + length].lower()}

    def filtered(self, flt: RolloutFilter) -> list[Group]:
        """The groups passing `flt`, in example order."""
        groups = self.groups()
        if not flt.active:
            return groups
        hits = self.search(flt.search) if flt.search else None
        return [g for g in groups if group_passes(g, flt) and (hits is None or g.example_id in hits)]


def group_passes(group: Group, flt: RolloutFilter) -> bool:
    """Everything but search (which needs the file)."""
    if flt.errors and not any(r.error is not None for r in group.rollouts):
        return False
    if flt.truncated and not any(r.is_truncated for r in group.rollouts):
        return False
    if flt.zero_variance and group.std >= 1e-9:
        return False
    if flt.reward_min is not None and group.mean < flt.reward_min - 1e-12:
        return False
    return not (flt.reward_max is not None and group.mean > flt.reward_max + 1e-12)


def group_flags(group: Group) -> str:
    """Short markers for a group row: E errors, T truncated, 0 zero variance."""
    flags = ""
    if any(r.error is not None for r in group.rollouts):
        flags += "E"
    if any(r.is_truncated for r in group.rollouts):
        flags += "T"
    if len(group.rollouts) > 1 and group.std < 1e-9:
        flags += "0"
    return flags


def by_example(groups: Sequence[Group]) -> dict[int, Group]:
    return {g.example_id: g for g in groups}
