"""What the Environments screen shows: each environment (`workbench env list --json`, run as a
child process), its README, and its newest eval run (from the run catalog).

The listing comes from a child on purpose: describing an environment imports its module, and
environment modules import reward code and sometimes transformers, which the TUI never loads.
This module only reads what the child printed and files on disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from workbench.tui.data.runs import RunInfo

ENV_LIST_ARGS = ["env", "list", "--json"]
ORIGINS = ("workspace", "bundled", "installed")
README_LIMIT = 200_000  # characters of a README shown: a huge one must not stall the screen


@dataclass(frozen=True)
class EnvEntry:
    """One environment as `workbench env list --json` describes it."""

    env_id: str  # dashed: what `eval run` takes
    kind: str  # SingleTurnEnv, MultiTurnEnv, ToolEnv, EnvGroup, Environment or ?
    origin: str  # workspace | bundled | installed
    description: str
    arguments: dict[str, Any] = field(default_factory=dict)  # name -> default (None: none, or None)
    location: str = ""  # its folder (workspace, bundled) or module file (installed)
    error: str | None = None  # why it does not import


def parse_env_list(text: str) -> list[EnvEntry]:
    """The entries of `env list --json` output. ValueError when it is not that output."""
    rows = json.loads(text)
    if not isinstance(rows, list):
        raise ValueError("env list --json printed no list")
    entries = []
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise ValueError("env list --json printed an entry without an id")
        arguments = row.get("arguments")
        entries.append(
            EnvEntry(
                env_id=row["id"],
                kind=str(row.get("kind") or "?"),
                origin=str(row.get("origin") or "?"),
                description=str(row.get("description") or ""),
                arguments=arguments if isinstance(arguments, dict) else {},
                location=str(row.get("location") or ""),
                error=row.get("error") if isinstance(row.get("error"), str) else None,
            )
        )
    return entries


def env_list_failure(output: str, returncode: int) -> str:
    """One line saying why `env list` failed: its `error:` line, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    said = next((line for line in reversed(lines) if line.startswith("error:")), None)
    return said or (lines[-1] if lines else f"workbench env list exited with code {returncode}")


def argument_lines(entry: EnvEntry, width: int = 60) -> list[str]:
    """`name = default` per argument of `load_environment`, each cut to `width` characters."""
    lines = []
    for name, default in entry.arguments.items():
        shown = json.dumps(default, ensure_ascii=False) if default is not None else "None"
        line = f"{name} = {shown}"
        lines.append(line if len(line) <= width else line[: width - 1] + "…")
    return lines


def readme_of(entry: EnvEntry) -> str | None:
    """The environment's README: README.md in its folder (a workspace or bundled env, or an
    installed package's own folder), else the long description its distribution was installed
    with (pip keeps the README there). None when there is neither."""
    if entry.location:
        place = Path(entry.location)
        folder = place if place.is_dir() else place.parent
        if (folder / "README.md").is_file():
            try:
                return (folder / "README.md").read_text(encoding="utf-8", errors="replace")[:README_LIMIT]
            except OSError:
                return None
    if entry.origin == "installed":
        try:
            info = metadata.metadata(entry.env_id.replace("-", "_"))
        except metadata.PackageNotFoundError:
            return None
        body = info.get_payload() or info.get("Description")  # type: ignore[attr-defined]
        return str(body)[:README_LIMIT] if body else None
    return None


def latest_evals(runs: list[RunInfo]) -> dict[str, RunInfo]:
    """The newest eval run of each environment id (`runs` newest first, as `RunCatalog.scan` gives
    them); running and failed runs count too: the newest is what the user did last."""
    newest: dict[str, RunInfo] = {}
    for run in runs:
        if run.kind == "eval" and not run.is_launch and run.env not in newest:
            newest[run.env] = run
    return newest


def origin_order(entries: list[EnvEntry]) -> list[EnvEntry]:
    """Workspace environments first (what the user writes), then bundled, then installed; by id."""
    rank = {origin: i for i, origin in enumerate(ORIGINS)}
    return sorted(entries, key=lambda e: (rank.get(e.origin, len(ORIGINS)), e.env_id))
