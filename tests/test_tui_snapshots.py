"""Snapshot tests (pytest-textual-snapshot) of the main TUI screens at 80x24, over the runs of
tests/tui_data.py (fixed ids, times and timings, TZ=UTC, so the pictures are reproducible).

Update the pictures after an intended change: pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tui_data import shared_workspace, wait_for
from workbench.tui.app import WorkbenchApp
from workbench.tui.screens.rollouts import RolloutsScreen
from workbench.tui.widgets.runs_table import RunsTable

SIZE = (80, 24)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    with shared_workspace(tmp_path_factory.mktemp("snap") / "ws") as runs:
        yield runs


def app_for(ws: dict[str, Path]) -> WorkbenchApp:
    return WorkbenchApp(ws["root"], poll_s=0.2)


def on_run(predicate, *keys: str, ready=None):
    """run_before: put the Runs cursor on a run, press keys, wait until `ready(screen)`."""

    async def run_before(pilot) -> None:
        app = pilot.app
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.runs) == 5)
        table.move_cursor(row=next(i for i, r in enumerate(table.runs) if predicate(r)))
        await pilot.press(*keys)
        if ready is not None:
            await wait_for(pilot, lambda: ready(app.screen))
        await pilot.pause(0.3)

    return run_before


def rollouts_ready(screen) -> bool:
    return isinstance(screen, RolloutsScreen) and screen.loaded and screen.rollout is not None


def test_runs_home(ws, snap_compare):
    assert snap_compare(app_for(ws), terminal_size=SIZE, run_before=on_run(lambda r: r.kind == "eval"))


def test_rollouts(ws, snap_compare):
    run_before = on_run(lambda r: r.path == ws["varied"], "enter", ready=rollouts_ready)
    assert snap_compare(app_for(ws), terminal_size=SIZE, run_before=run_before)


def test_rollouts_with_tool_calls(ws, snap_compare):
    run_before = on_run(lambda r: r.path == ws["tools"], "enter", ready=rollouts_ready)
    assert snap_compare(app_for(ws), terminal_size=SIZE, run_before=run_before)


def test_reward_variance(ws, snap_compare):
    run_before = on_run(
        lambda r: r.path == ws["varied"], "v", ready=lambda s: getattr(s, "report", None) is not None
    )
    assert snap_compare(app_for(ws), terminal_size=SIZE, run_before=run_before)


def test_training_monitor(ws, snap_compare):
    def plotted(screen) -> bool:
        plots = screen.query("MetricPlot") if type(screen).__name__ == "TrainMonitorScreen" else []
        return bool(plots) and all(plot.lines for plot in plots)

    run_before = on_run(lambda r: r.kind == "train", "enter", ready=plotted)
    assert snap_compare(app_for(ws), terminal_size=SIZE, run_before=run_before)


def test_checkpoints(ws, snap_compare):
    run_before = on_run(
        lambda r: r.kind == "train", "K", ready=lambda s: len(getattr(s, "checkpoints", [])) == 2
    )
    assert snap_compare(app_for(ws), terminal_size=SIZE, run_before=run_before)


def test_gepa_diff(ws, snap_compare):
    run_before = on_run(
        lambda r: r.kind == "gepa", "enter", "4", ready=lambda s: getattr(s, "gepa", None) is not None
    )
    assert snap_compare(app_for(ws), terminal_size=SIZE, run_before=run_before)
