"""Runs that look alike read differently on the Runs screen (issue 35.1, 35.2, 35.7, 35.10):
a short run id, start times to the second, a model column that grows with the terminal, an eval
of `-m outputs/runs/latest` labelled by the run and step it meant at launch (here, in Rollouts and
on its step's row of the Checkpoints view), evals grouped by environment with the best run per
model, and a message where a table is empty. Pilot and snapshot tests over a workspace of three
near-identical evals, an eval of `latest` and the training run it resolved to."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tui_data import VariedClient, install_test_envs, make_eval, make_train_run, text_of, wait_for
from workbench.inference.echo import EchoClient
from workbench.tui.app import WorkbenchApp
from workbench.tui.data.runs import best_per_model, short_id
from workbench.tui.run_actions import a_run
from workbench.tui.screens.rollouts import RolloutsScreen
from workbench.tui.widgets.runs_table import RunsTable, clip_label, layout
from workbench.tui.widgets.virtual_table import VirtualTable

TRAIN = "reverse-words--tiny--20260102-030405-abcd"


def build(root: Path) -> dict[str, Path]:
    install_test_envs(root)
    train = make_train_run(root, TRAIN, steps=6, status="finished")  # checkpoints 3 and 6
    alike = {
        f"alike{i}": make_eval(
            "reverse-words",
            EchoClient(mode="echo"),
            3,
            1,
            f"20260102-0405{seconds:02d}-{tag}",
            model="echo",
            created_at=f"2026-01-02T04:05:{seconds:02d}+00:00",
        )
        for i, (seconds, tag) in enumerate(((7, "1a2b"), (31, "3c4d"), (52, "5e6f")))
    }
    latest = make_eval(
        "reverse-words",
        VariedClient(),
        4,
        2,
        "20260102-050000-7a8b",
        model="outputs/runs/latest",
        created_at="2026-01-02T05:00:00+00:00",
    )
    # a newer training run: `latest` means it now, and the eval above must not say so
    newer = make_train_run(root, "reverse-words--tiny--20260103-000000-9c9d", steps=3, status="finished")
    stamp = time.time() + 60
    os.utime(newer / "checkpoints" / "step_000003", (stamp, stamp))
    return {"root": root, "train": train, "latest": latest, **alike}


@contextlib.contextmanager
def identity_workspace(root: Path) -> Iterator[dict[str, Path]]:
    root.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORKBENCH_WORKSPACE", str(root))
        mp.setenv("TZ", "UTC")
        time.tzset()
        mp.chdir(root)
        try:
            yield build(root)
        finally:
            mp.undo()
            time.tzset()


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    with identity_workspace(tmp_path_factory.mktemp("identity") / "ws") as runs:
        yield runs


def app_for(ws: dict[str, Path]) -> WorkbenchApp:
    return WorkbenchApp(ws["root"], poll_s=0.2)


async def loaded(pilot, app: WorkbenchApp, count: int = 6) -> RunsTable:
    table = app.screen.query_one(RunsTable)
    await wait_for(pilot, lambda: len(table.runs) == count)
    return table


def row_of(table: RunsTable, path: Path) -> str:
    lines = text_of(table).splitlines()
    return lines[1 + next(i for i, r in enumerate(table.runs) if r.path == path)]


# ----- pure parts --------------------------------------------------------------------------------
def test_short_ids_and_labels_keep_what_tells_runs_apart():
    assert short_id("20260102-040507-1a2b") == "1a2b" and short_id(TRAIN) == "abcd"
    assert short_id("my-experiment") == "my-experiment"  # a name the user chose: all of it
    assert [a_run(kind) for kind in ("eval", "train", "gepa")] == [
        "an eval run",
        "a training run",
        "a GEPA run",
    ]
    label = f"{TRAIN} step 20"
    assert clip_label(label, 21) == "reverse…-abcd step 20"  # the step and both ends of the run name
    assert clip_label("first step 6", 10) == "fi… step 6" and clip_label("tiny", 10) == "tiny"
    for width in (79, 99, 139, 159):  # every layout fills the width it is given, and no more
        assert sum(w + 2 for _, w in layout(width)) - 1 <= width
    widths = {w: dict(layout(w)) for w in (79, 99, 159)}
    assert widths[79]["started"] == 11 and widths[99]["started"] == 14  # seconds from 100 columns
    assert widths[79]["model"] < widths[99]["model"] < widths[159]["model"] == 40
    assert "error" not in widths[99] and widths[159]["error"] >= 12


# ----- the Runs screen ---------------------------------------------------------------------------
async def test_three_alike_evals_read_differently(ws):
    app = app_for(ws)
    async with app.run_test(size=(100, 30)) as pilot:
        table = await loaded(pilot, app)
        rows = {name: row_of(table, ws[name]) for name in ("alike0", "alike1", "alike2")}
        for name, tag, seconds in (("alike0", "1a2b", "04:05:07"), ("alike1", "3c4d", "04:05:31")):
            assert tag in rows[name] and seconds in rows[name], rows[name]
        assert len(set(rows.values())) == 3
        header = text_of(table).splitlines()[0].split()
        assert header[:3] == ["✓", "id", "kind"] and "started" in header


async def test_an_eval_of_latest_is_labelled_by_the_run_and_step_it_meant(ws):
    app = app_for(ws)
    async with app.run_test(size=(160, 40)) as pilot:
        table = await loaded(pilot, app)
        run = next(r for r in table.runs if r.path == ws["latest"])
        assert run.model == "outputs/runs/latest" and run.model_label == f"{TRAIN} step 6"
        assert "reverse-words--tiny--202601…-abcd step 6" in row_of(table, ws["latest"])  # 40 cells
        await pilot.resize_terminal(100, 30)
        await wait_for(pilot, lambda: dict(table.columns)["model"] == 21)
        assert "reverse-…-abcd step 6" in row_of(table, ws["latest"])
        table.move_cursor(next(i for i, r in enumerate(table.runs) if r.path == ws["latest"]))
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RolloutsScreen))
        screen = app.screen
        assert isinstance(screen, RolloutsScreen)
        await wait_for(pilot, lambda: screen.loaded)
        assert f"{TRAIN} step 6" in text_of(screen.query_one("#rollouts-title"))
        assert "outputs/runs/latest" not in text_of(screen.query_one("#rollouts-title"))


async def test_the_checkpoints_view_shows_an_eval_on_its_steps_row(ws):
    app = app_for(ws)
    async with app.run_test(size=(100, 30)) as pilot:
        table = await loaded(pilot, app)
        table.move_cursor(next(i for i, r in enumerate(table.runs) if r.path == ws["train"]))
        await pilot.press("K")
        screen = app.screen
        checkpoints = screen.query_one("#ckpt-table", VirtualTable)
        await wait_for(pilot, lambda: checkpoints.row_count == 2 and screen.evals)
        assert [label for label, _ in screen.evals] == ["step 6"]  # the eval of `latest`, by its step
        lines = text_of(checkpoints).splitlines()
        at = lines[0].index("evaluated")
        row3, row6 = lines[1], lines[2]
        reward = next(
            r for r in app.screen_stack[0].query_one(RunsTable).runs if r.path == ws["latest"]
        ).reward
        assert row6.startswith(" 6") and row6[at:].split()[0] == f"{reward:.3f}"
        assert row3[at:].split()[0] == "-"  # no eval of step 3
        evals = screen.query_one("#ckpt-evals", VirtualTable)
        assert any("step 6" in line for line in text_of(evals).splitlines()[1:])


async def test_e_groups_evals_by_environment_with_the_best_run_per_model(ws):
    app = app_for(ws)
    async with app.run_test(size=(100, 30)) as pilot:
        table = await loaded(pilot, app)
        await pilot.press("e")
        await wait_for(pilot, lambda: table.grouped and len(table.runs) == 2)
        # one env; its models best first: the eval of the checkpoint beats the echo model, and of the
        # three echo evals (all 0.0) the newest stands for them
        assert [r.path for r in table.runs] == [ws["latest"], ws["alike2"]]
        header = text_of(table).splitlines()[0]
        assert " runs " in header and "progress" not in header
        assert row_of(table, ws["alike2"]).split()[5] == "3"  # id kind env model status runs: of three
        assert "by environment" in text_of(app.screen.query_one("#runs-summary"))
        await pilot.press("e")
        await wait_for(pilot, lambda: not table.grouped and len(table.runs) == 6)
        assert "progress" in text_of(table).splitlines()[0]


def test_best_per_model_prefers_finished_runs_then_reward(ws):
    from dataclasses import replace

    from workbench.tui.data.runs import RunCatalog

    runs = [r for r in RunCatalog(ws["root"]).scan() if r.kind == "eval"]
    stopped = [replace(r, status="stopped", reward=1.0) if r.path == ws["alike0"] else r for r in runs]
    best = dict((run.model_label, (run.path, n)) for run, n in best_per_model(stopped))
    assert best["echo"] == (ws["alike2"], 3)  # a stopped run's higher reward does not win
    better = [replace(r, reward=0.5) if r.path == ws["alike1"] else r for r in runs]
    assert dict((run.model_label, run.path) for run, _ in best_per_model(better))["echo"] == ws["alike1"]


async def test_empty_tables_say_why(ws):
    app = app_for(ws)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await pilot.press("slash", *"nothing-like-this", "enter")
        empty = app.screen.query_one("#runs-empty")
        await wait_for(pilot, lambda: empty.display)
        assert "No run matches these filters" in text_of(empty)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not empty.display)


# ----- snapshots -----------------------------------------------------------------------------------
def on_latest(ws: dict[str, Path]):
    async def run_before(pilot) -> None:
        table = await loaded(pilot, pilot.app)
        table.move_cursor(row=next(i for i, r in enumerate(table.runs) if r.path == ws["latest"]))
        await pilot.pause(0.3)

    return run_before


def test_runs_at_100_columns(ws, snap_compare):
    assert snap_compare(app_for(ws), terminal_size=(100, 30), run_before=on_latest(ws))


def test_runs_at_160_columns(ws, snap_compare):
    assert snap_compare(app_for(ws), terminal_size=(160, 40), run_before=on_latest(ws))
