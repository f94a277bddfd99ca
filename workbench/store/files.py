"""Small file helpers: atomic JSON and text writes and JSON-lines reading that tolerates a torn last line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson


def write_json_atomic(path: Path, data: Any) -> None:
    """Write to a temporary file and rename: readers never see a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    """The same for text (a prompt, an environment's source)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete JSON line; a torn final line (a killed writer) is skipped."""
    if not path.exists():
        return
    with path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                yield orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
