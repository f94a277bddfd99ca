"""Snapshot tests (pytest-textual-snapshot) of issue 35's new screens, at 100 and 160 columns: the
Environments screen on a workspace environment with a README and evals, and the config editor
with a mistake the dry run found, marked at its line (a deterministic state: a valid config's plan
may grow machine-dependent lines).

Update the pictures after an intended change:
pytest tests/test_tui_snapshots_envs_configs.py --snapshot-update
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tui_data import shared_workspace, wait_for
from workbench.tui.app import WorkbenchApp
from workbench.tui.screens.config_editor import ConfigEditorScreen
from workbench.tui.screens.environments import EnvironmentsScreen
from workbench.tui.widgets.virtual_table import VirtualTable

SIZES = {"100": (100, 30), "160": (160, 40)}
README = """# reverse-words

Reverse a phrase **character by character**. Partial credit: the similarity of the answer
to the reversed phrase.

| argument | default |
| --- | --- |
| (none) | |
"""
CONFIG = """# workbench train configs/rl/reverse-words.toml
# RL on the workspace's reverse-words environment (a fixed test config).
model = "tiny"
max_steps = 20
batch_size = 16
rollouts_per_example = 4
learning_rate = 1e-3
max_stepz = 5

[sampling]
max_tokens = 32

[[env]]
id = "reverse-words"
"""


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    with shared_workspace(tmp_path_factory.mktemp("snap35") / "ws") as runs:
        root = runs["root"]
        (root / "environments" / "reverse_words" / "README.md").write_text(README)
        (root / "configs" / "rl").mkdir(parents=True)
        (root / "configs" / "rl" / "reverse-words.toml").write_text(CONFIG)
        yield runs


@pytest.mark.parametrize("width", SIZES)
def test_environments(ws, snap_compare, width: str):
    async def run_before(pilot) -> None:
        await pilot.press("E")
        screen = pilot.app.screen
        assert isinstance(screen, EnvironmentsScreen)
        await wait_for(pilot, lambda: screen.loaded)
        screen.query_one(VirtualTable).select_key("reverse-words")
        await pilot.pause(0.3)

    assert snap_compare(
        WorkbenchApp(ws["root"], poll_s=0.2), terminal_size=SIZES[width], run_before=run_before
    )


@pytest.mark.parametrize("width", SIZES)
def test_config_editor(ws, snap_compare, width: str):
    async def run_before(pilot) -> None:
        await pilot.press("ctrl+o")
        screen = pilot.app.screen
        assert isinstance(screen, ConfigEditorScreen)
        await wait_for(pilot, lambda: screen.result is not None and not screen.checking)
        assert screen.problems and screen.problems[0].line == 8
        # The file list holds the focus: the editor's cursor was drawn on some runs and not on
        # others (blinking off and focus set did not settle it).
        screen.query_one("#editor-files").focus()
        await pilot.pause(0.3)

    assert snap_compare(
        WorkbenchApp(ws["root"], poll_s=0.2), terminal_size=SIZES[width], run_before=run_before
    )
