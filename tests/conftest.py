"""Shared fixtures: an isolated workspace per test and the tiny model built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty workspace folder, current directory and $WORKBENCH_WORKSPACE."""
    monkeypatch.setenv("WORKBENCH_WORKSPACE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path
