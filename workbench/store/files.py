"""Small file helpers: atomic JSON and text writes and JSON-lines reading that tolerates a torn last line."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

# What the machine, not the program, gets wrong while writing a run: a full disk or quota, a
# read-only or vanished folder, a file too big, an I/O error. One line for the user, never "a bug".
STORAGE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG, errno.ENOENT}
)


def is_storage_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS


def write_json_atomic(path: Path, data: Any) -> None:
    """Write to a temporary file and rename: readers never see a half-written file, and a failed
    write (a full disk) leaves no temporary file behind."""
    write_bytes_atomic(path, orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def write_text_atomic(path: Path, text: str) -> None:
    """The same for text (a prompt, an environment's source)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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
