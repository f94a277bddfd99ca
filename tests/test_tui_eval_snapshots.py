"""Snapshot tests (pytest-textual-snapshot) of the eval views of issue 35 at 100 and 160 columns:
Rollouts with its reward histogram and pass@k panel, and a rollout full screen with a find on,
over the runs of tests/tui_data.py (fixed ids, times and timings, TZ=UTC).

Update the pictures after an intended change:
pytest tests/test_tui_eval_snapshots.py --snapshot-update
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tui_data import shared_workspace, wait_for
from workbench.tui.app import WorkbenchApp
from workbench.tui.screens.rollouts import RolloutsScreen
from workbench.tui.widgets.conversation import ConversationView
from workbench.tui.widgets.reward_panel import RewardPanel
from workbench.tui.widgets.runs_table import RunsTable


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    with shared_workspace(tmp_path_factory.mktemp("evalsnap") / "ws") as runs:
        yield runs


def open_varied(ws: dict[str, Path], *keys: str, ready=None):
    """run_before: open the varied eval's rollouts, wait for the panel, press keys, wait for `ready`."""

    async def run_before(pilot) -> None:
        app = pilot.app
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.runs) == 5)
        table.move_cursor(row=next(i for i, r in enumerate(table.runs) if r.path == ws["varied"]))
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RolloutsScreen))
        screen = app.screen
        assert isinstance(screen, RolloutsScreen)
        panel = screen.query_one(RewardPanel)
        await wait_for(
            pilot, lambda: screen.loaded and screen.rollout is not None and panel.stats is not None
        )
        await pilot.press(*keys)
        if ready is not None:
            await wait_for(pilot, lambda: ready(screen))
        await pilot.pause(0.3)

    return run_before


@pytest.mark.parametrize("size", [(100, 34), (160, 45)], ids=["100", "160"])
def test_rollouts_with_reward_panel(ws, snap_compare, size):
    assert snap_compare(WorkbenchApp(ws["root"], poll_s=0.2), terminal_size=size, run_before=open_varied(ws))


@pytest.mark.parametrize("size", [(100, 34), (160, 45)], ids=["100", "160"])
def test_rollout_full_screen_with_a_find(ws, snap_compare, size):
    def found(screen) -> bool:
        return bool(screen.query_one(ConversationView).matches) and screen.maximized is not None

    run_before = open_varied(ws, "F", "f", *"reversed", "enter", ready=found)
    assert snap_compare(WorkbenchApp(ws["root"], poll_s=0.2), terminal_size=size, run_before=run_before)
