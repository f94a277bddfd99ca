"""The one `gepa compare` a test ran, as its `comparison.json` says (the raw file, not the store's
reader: the tests check the format users and their scripts read)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ComparisonFile:
    folder: Path  # environments/<env>/outputs/gepa/compare/<run_id>/
    data: dict[str, Any]  # comparison.json as written
    rows: dict[str, dict[str, Any]]  # its rows by arm (optimizer), in the file's order


def only_comparison(workspace: Path, env: str = "reverse_text") -> ComparisonFile:
    """The workspace's single comparison of `env` (a test that ran one `gepa compare`)."""
    (folder,) = (workspace / "environments" / env / "outputs" / "gepa" / "compare").iterdir()
    data = json.loads((folder / "comparison.json").read_text())
    return ComparisonFile(folder, data, {row["optimizer"]: row for row in data["rows"]})
