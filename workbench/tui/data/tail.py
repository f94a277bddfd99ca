"""Incremental readers for files that other processes append to (logs, metrics.jsonl).

Each reader remembers how many bytes it consumed and reads only what was appended, so polling
every second costs one `stat` when nothing changed. A torn last line is left for the next poll;
a file that shrank (rewritten on resume) is read again from the start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


class _Appended:
    """Complete lines appended to a file since the last poll."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.reset = False  # True after a poll that found the file rewritten

    def new_lines(self) -> list[bytes]:
        self.reset = False
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.pos:
            self.pos, self.reset = 0, True
        if size == self.pos:
            return []
        with self.path.open("rb") as f:
            f.seek(self.pos)
            chunk = f.read(size - self.pos)
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.pos += end + 1
        return chunk[:end].split(b"\n")


class TextTail:
    """The last `keep` lines of a text file, updated by `poll()`."""

    def __init__(self, path: Path, keep: int = 2000) -> None:
        self._source = _Appended(path)
        self.keep = keep
        self.lines: list[str] = []

    @property
    def path(self) -> Path:
        return self._source.path

    def poll(self) -> list[str]:
        """New lines since the last poll (all kept lines again after a rewrite)."""
        raw = self._source.new_lines()
        if self._source.reset:
            self.lines = []
        new = [line.decode("utf-8", errors="replace").rstrip("\r") for line in raw]
        self.lines = (self.lines + new)[-self.keep :]
        return self.lines if self._source.reset else new

    @property
    def was_reset(self) -> bool:
        return self._source.reset


class JsonlTail:
    """Every record of a JSON-lines file (metrics.jsonl), updated incrementally by `poll()`."""

    def __init__(self, path: Path) -> None:
        self._source = _Appended(path)
        self.records: list[dict[str, Any]] = []

    def poll(self) -> bool:
        """Read appended records; True when the records changed."""
        raw = self._source.new_lines()
        if self._source.reset:
            self.records = []
        added = False
        for line in raw:
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict):
                self.records.append(record)
                added = True
        return added or self._source.reset
