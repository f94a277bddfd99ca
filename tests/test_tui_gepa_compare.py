"""The TUI's GEPA view of a run that is an arm of `workbench gepa compare`: a Compare tab with every
arm (RL's too), its held-out gain against the rollouts it spent. A run in no comparison has no
such tab (the GEPA snapshots stay as they were)."""

from __future__ import annotations

from pathlib import Path

from tests.tui_data import make_gepa_run, text_of, wait_for
from workbench.store.comparisons import COMPARE_FOLDER, ComparisonRow, with_rates, write_comparison_json
from workbench.tui.app import WorkbenchApp
from workbench.tui.screens.gepa import GepaScreen
from workbench.tui.widgets.runs_table import RunsTable

SIZE = (80, 24)


def write_comparison(gepa_run: Path, training_run: Path) -> Path:
    """A comparison with two arms, as `gepa compare` writes it: the GEPA run, and an RL run."""
    common = {"heldout_start": 16, "heldout_n": 8, "max_calls": 64, "verdict": "no clear difference"}
    rows = [
        with_rates(
            ComparisonRow(
                optimizer="bootstrap",
                run_dir=str(gepa_run),
                status="finished",
                val_seed=0.42,
                val_best=0.71,
                heldout_seed=0.25,
                heldout_best=0.40,
                diff=0.15,
                ci_low=-0.01,
                ci_high=0.31,
                metric_calls=60,
                wall_s=30.0,
                rollouts_spent=60,
                **common,
            )
        ),
        with_rates(
            ComparisonRow(
                optimizer="rl",
                run_dir=str(training_run),
                status="finished",
                heldout_seed=0.25,
                heldout_best=0.30,
                diff=0.05,
                ci_low=-0.02,
                ci_high=0.12,
                metric_calls=64,
                wall_s=12.0,
                rollouts_spent=64,
                **common,
            )
        ),
    ]
    folder = gepa_run.parent.parent / COMPARE_FOLDER / "20260103-040506-abcd"
    config = {"env_id": "reverse-words", "model": "echo", "max_calls": 64}
    write_comparison_json(folder, config, heldout=8, rollouts=2, rows=rows)
    return folder


async def open_gepa(pilot, app: WorkbenchApp) -> GepaScreen:
    table = app.screen.query_one(RunsTable)
    await wait_for(pilot, lambda: table.runs)
    table.move_cursor(row=next(i for i, r in enumerate(table.runs) if r.kind == "gepa"))
    await pilot.pause()
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(app.screen, GepaScreen))
    screen = app.screen
    assert isinstance(screen, GepaScreen)
    await wait_for(pilot, lambda: screen.gepa is not None)
    return screen


async def test_gepa_view_shows_the_comparison_it_is_in(workspace: Path):
    run = make_gepa_run(workspace)
    write_comparison(run, workspace / "outputs" / "runs" / "reverse-words--echo--rl")
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_gepa(pilot, app)
        await wait_for(pilot, lambda: screen.comparison is not None)
        assert [row.optimizer for row in screen.comparison.rows] == ["bootstrap", "rl"]
        await wait_for(pilot, lambda: "5" in screen.active_bindings)  # in the footer now
        await pilot.press("5")
        bars = screen.query_one("#gepa-compare")
        await wait_for(pilot, lambda: bars.region.height > 0 and "bootstrap" in text_of(bars))
        shown = text_of(bars)
        assert "budget 64 rollouts" in shown and "held-out 8 rows × 2" in shown
        lines = {
            line.split()[0]: line
            for line in shown.splitlines()
            if line.split()[:1] in (["bootstrap"], ["rl"])
        }
        # rollouts spent, held-out gain, gain per 100 rollouts (0.15/60*100) and per minute (0.15/0.5)
        assert "60" in lines["bootstrap"] and "+0.150" in lines["bootstrap"]
        assert "+0.2500" in lines["bootstrap"] and "+0.3000" in lines["bootstrap"]
        assert "64" in lines["rl"] and "+0.050" in lines["rl"] and "+0.0781" in lines["rl"]


async def test_gepa_view_of_a_run_in_no_comparison_has_no_compare_tab(workspace: Path):
    run = make_gepa_run(workspace)
    other = run.parent / "20260101-000000-ffff"  # a comparison of other runs
    write_comparison(other, workspace / "outputs" / "runs" / "x")
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_gepa(pilot, app)
        await pilot.press("5")
        assert screen.comparison is None and not screen.query("#gepa-compare")
        assert "4" in screen.active_bindings and "5" not in screen.active_bindings  # not in the footer
