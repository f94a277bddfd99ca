"""The TUI as a daily driver (issue 16): every table sorts and takes vim keys, `#` jumps to an
example, the Group view lists an example's rollouts, Compare refuses runs of other examples and
shows A and B side by side, and checkpoint evals are labelled by run and step. Pilot tests at
80x24 over the runs of tests/tui_data.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from rich.text import Text

from tests.tui_data import make_train_run, shared_workspace, text_of, wait_for
from workbench.store.sweeps import SWEEP_FILE, SweepKey, SweepPoint
from workbench.tui.app import WorkbenchApp
from workbench.tui.data.runs import RunCatalog, checkpoint_label
from workbench.tui.screens.compare import CompareScreen
from workbench.tui.screens.group import GroupScreen
from workbench.tui.screens.rollouts import RolloutsScreen
from workbench.tui.widgets.conversation import ConversationView
from workbench.tui.widgets.format import clip_head
from workbench.tui.widgets.groups_table import GroupsTable
from workbench.tui.widgets.runs_table import RunsTable
from workbench.tui.widgets.virtual_table import VirtualTable, sort_value

SIZE = (80, 24)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    with shared_workspace(tmp_path_factory.mktemp("daily") / "ws") as runs:
        yield runs


def app_for(root: Path) -> WorkbenchApp:
    return WorkbenchApp(root, poll_s=0.2)


async def runs_table(pilot, app: WorkbenchApp, count: int = 5) -> RunsTable:
    table = app.screen.query_one(RunsTable)
    await wait_for(pilot, lambda: len(table.runs) == count)
    return table


async def open_rollouts(pilot, app: WorkbenchApp, run_dir: Path) -> RolloutsScreen:
    table = await runs_table(pilot, app)
    table.move_cursor(next(i for i, r in enumerate(table.runs) if r.path == run_dir))
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(app.screen, RolloutsScreen))
    screen = app.screen
    assert isinstance(screen, RolloutsScreen)
    await wait_for(pilot, lambda: screen.loaded and screen.rollout is not None)
    return screen


# ----- sorting and keys ------------------------------------------------------------------------
def test_sort_values_put_numbers_in_order_and_blanks_last():
    assert [sort_value(c) for c in ("0.250", Text("3/10"), "-", "Eval", "")] == [
        0.25,
        3.0,
        None,
        "eval",
        None,
    ]
    table = VirtualTable((("x", 5),))
    table._data = [("2",), ("-",), ("10",), ("b",), ("1",)]
    for reverse, expected in ((False, ["1", "2", "10", "b", "-"]), (True, ["10", "2", "1", "b", "-"])):
        table.sort_column, table.sort_reverse = 0, reverse
        table._apply_order()
        assert [row[0] for row in table.rows] == expected


async def test_runs_sort_by_any_column_with_arrow_and_vim_keys(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        table = await runs_table(pilot, app)
        given = [r.key for r in table.runs]
        await pilot.press("G")
        assert table.cursor_row == 4
        await pilot.press("k", "k")
        assert table.cursor_row == 2
        await pilot.press("g", "j")
        assert table.cursor_row == 1
        current = table.current
        for _ in range(
            8
        ):  # o cycles through the columns: mark, id, kind, env, model, status, progress, reward
            await pilot.press("o")
        assert table.sort_column == 7 and "reward▲" in text_of(table).splitlines()[0]  # no letter lost
        rewards = [r.reward for r in table.runs if r.reward is not None]
        missing = [r.reward is None for r in table.runs]
        assert rewards == sorted(rewards) and missing == sorted(missing)  # no reward: last
        assert table.current is current  # the cursor kept its run
        await pilot.press("O")
        rewards = [r.reward for r in table.runs if r.reward is not None]
        assert rewards == sorted(rewards, reverse=True) and "reward▼" in text_of(table).splitlines()[0]
        await pilot.pause(0.5)  # refreshes (poll 0.2 s) keep the sort
        assert table.sort_column == 7 and [r.reward for r in table.runs if r.reward is not None] == rewards
        for _ in range(2):  # started, then back to the given order (newest first)
            await pilot.press("o")
        assert table.sort_column is None and [r.key for r in table.runs] == given


# ----- group view and jump ---------------------------------------------------------------------
async def test_group_view_lists_an_examples_rollouts_and_opens_one(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_rollouts(pilot, app, ws["varied"])
        await pilot.press("number_sign", *"7", "enter")
        groups = screen.query_one(GroupsTable)
        await wait_for(pilot, lambda: groups.current is not None and groups.current.example_id == 7)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GroupScreen))
        group_screen = app.screen
        assert isinstance(group_screen, GroupScreen)
        table = group_screen.query_one(VirtualTable)
        await wait_for(pilot, lambda: group_screen.rollout is not None)
        header = text_of(table).splitlines()[0]
        assert table.row_count == 4 and all(
            name in header for name in ("#", "reward", "lcs_rew", "length", "stop")
        )
        assert [row[0] for row in table.rows] == ["1", "2", "3", "4"]  # counted from 1
        rewards = [r.reward for r in group_screen.group.rollouts]
        assert [float(row[1].plain) for row in table.rows] == pytest.approx(rewards, abs=1e-3)
        await pilot.press("o", "o", "O")  # sort by reward, highest first
        best = max(group_screen.group.rollouts, key=lambda r: r.reward)
        await pilot.press("g")
        await wait_for(pilot, lambda: group_screen.rollout.rollout_index == best.rollout_index)
        await pilot.press("enter")  # open it: back in Rollouts on that rollout, conversation focused
        await wait_for(pilot, lambda: app.screen is screen)
        await wait_for(pilot, lambda: screen.rollout.rollout_index == best.rollout_index)
        assert screen.rollout.example_id == 7 and isinstance(app.focused, ConversationView)
        assert f"rollout {best.rollout_index + 1}/4" in text_of(screen.query_one("#breakdown"))
        await pilot.press("number_sign", *"99", "enter")  # not in the file: one line, nothing moves
        assert screen.rollout.example_id == 7


async def test_groups_sort_by_mean(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_rollouts(pilot, app, ws["varied"])
        table = screen.query_one(GroupsTable)
        await pilot.press("o", "o", "o")  # example, n, mean
        means = [float(row[2].plain) for row in table.rows]
        assert table.sort_column == 2 and means == sorted(means) and "mean▲" in text_of(table).splitlines()[0]
        await pilot.press("g")
        assert screen.group is not None and screen.group.mean == pytest.approx(min(means), abs=1e-3)


# ----- compare ----------------------------------------------------------------------------------
async def mark_and_compare(pilot, app: WorkbenchApp, first: Path, second: Path, key: str) -> None:
    table = await runs_table(pilot, app)
    for path in (first, second):
        table.move_cursor(next(i for i, r in enumerate(table.runs) if r.path == path))
        await pilot.press("space")
    await pilot.press(key)


async def test_compare_refuses_other_environments_unless_asked(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        await mark_and_compare(pilot, app, ws["varied"], ws["tools"], "c")
        await wait_for(pilot, lambda: any("not compared" in str(n.message) for n in app._notifications))
        await wait_for(pilot, lambda: not isinstance(app.screen, CompareScreen))
        message = next(str(n.message) for n in app._notifications if "not compared" in str(n.message))
        assert "lookup-facts" in message and "reverse-words" in message and "\n" not in message
        await pilot.press("C")  # asked: compared anyway
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await wait_for(pilot, lambda: screen.loaded)


async def test_compare_shows_a_and_b_side_by_side_and_filters_each_change(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        await mark_and_compare(pilot, app, ws["varied"], ws["base"], "c")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await wait_for(
            pilot, lambda: screen.loaded and screen.query_one("#compare-conv-b", ConversationView).rollout
        )
        comparison = screen.comparison
        table = screen.query_one("#compare-table", VirtualTable)
        for change in ("fixed", "broke", "better", "worse"):
            await pilot.press("f")
            assert screen.change == change and table.row_count == len(comparison.only(change))
            assert f"showing {change}" in text_of(screen.query_one("#compare-title"))
        assert (
            comparison.count("better") + comparison.count("worse") + comparison.count("same")
            == comparison.shared
        )
        await pilot.press("f")  # all again
        assert table.row_count == len(comparison.rows)
        await pilot.press("number_sign", *"3", "enter")
        a = screen.query_one("#compare-conv-a", ConversationView)
        b = screen.query_one("#compare-conv-b", ConversationView)
        await wait_for(
            pilot, lambda: a.rollout is not None and a.rollout.example_id == 3 and b.rollout.example_id == 3
        )
        assert (a.rollout.rollout_index, b.rollout.rollout_index) == (0, 0)
        head = text_of(screen.query_one("#compare-head-b"))
        assert "rollout 1/4" in head and f"B - A {b.rollout.reward - a.rollout.reward:+.3f}" in head
        await pilot.press("right_square_bracket")
        assert (a.rollout.rollout_index, b.rollout.rollout_index) == (1, 1)
        assert "rollout 2/4" in text_of(screen.query_one("#compare-head-a"))


# ----- checkpoint labels -------------------------------------------------------------------------
def test_checkpoint_labels_from_paths_names_and_sweeps(workspace: Path):
    assert checkpoint_label("outputs/runs/swept/checkpoints/step_000006") == "swept step 6"
    assert checkpoint_label("swept-step_2") == "swept step 2"  # a LoRA checkpoint served by a -b sweep
    assert checkpoint_label("Qwen/Qwen3-0.6B") is None and checkpoint_label("tiny") is None
    assert clip_head("reverse-words-long-run step 12", 13) == "reve… step 12"

    # A sweep through a -b server with full weights: every eval names the server's base model,
    # and only the sweep record tells the steps apart.
    run = make_train_run(workspace, "swept", steps=2, status="finished")
    evals = workspace / "environments" / "reverse_words" / "outputs" / "evals" / "reverse-words--base"
    lines = []
    for step in (-1, 2, 6):
        folder = evals / f"2026010{step + 2}-000000-abcd"
        folder.mkdir(parents=True)
        (folder / "metadata.json").write_bytes(
            orjson.dumps(
                {
                    "kind": "eval",
                    "status": "finished",
                    "run_id": folder.name,
                    "env_id": "reverse-words",
                    "model": "base",
                    "created_at": "2026-01-02T03:04:05+00:00",
                }
            )
        )
        key = SweepKey(
            env_id="reverse-words", num_examples=2, rollouts_per_example=1, seed=0, server="http://x/v1"
        )
        lines.append(
            SweepPoint(
                key=key, step=step, model="base", eval_run=str(folder), reward_mean=0.5
            ).model_dump_json()
        )
    (run / SWEEP_FILE).write_text("\n".join(lines) + "\n")
    labels = {r.run_id: r.model_label for r in RunCatalog(workspace).scan() if r.kind == "eval"}
    assert sorted(labels.values()) == ["swept base", "swept step 2", "swept step 6"]


# ----- 80x24 -----------------------------------------------------------------------------------
async def test_charts_keep_their_titles_and_new_views_fit_80x24(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        table = await runs_table(pilot, app)
        table.move_cursor(next(i for i, r in enumerate(table.runs) if r.kind == "train"))
        await pilot.press("enter")
        plots = list(app.screen.query("MetricPlot"))
        await wait_for(pilot, lambda: all(p.lines for p in plots))
        for plot in plots:  # the title line names the curve, cut to fit rather than dropped
            assert plot.title.split()[0] in text_of(plot).splitlines()[0], plot.title
        await pilot.press("escape")
        screen = await open_rollouts(pilot, app, ws["varied"])
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GroupScreen))
        group = app.screen
        assert isinstance(group, GroupScreen)
        await wait_for(pilot, lambda: group.rollout is not None)
        assert group.query_one(VirtualTable).size.height >= 5  # header + 4 rollouts
        assert group.query_one(ConversationView).size.height >= 6
        await pilot.press("escape")
        assert app.screen is screen


async def test_monitor_stop_asks_first(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        table = await runs_table(pilot, app)
        table.move_cursor(next(i for i, r in enumerate(table.runs) if r.kind == "train"))
        await pilot.press("enter")
        monitor = app.screen
        await pilot.press("x")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen")
        assert "Stop training reverse-words" in text_of(app.screen.query_one("#confirm-question"))
        await pilot.press("n")  # kept running: nothing was signalled (the run's keepalive pid lives on)
        await wait_for(pilot, lambda: app.screen is monitor)
        assert monitor.run.is_live


async def test_keys_and_palette_name_the_table_keys(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        await runs_table(pilot, app)
        await pilot.press("question_mark")
        rows = {(key, action, where) for key, action, where in app.screen.rows}
        assert {
            ("o", "Sort by next column", "table"),
            ("O", "Reverse sort", "table"),
            ("g", "First row", "table"),
            ("G", "Last row", "table"),
        } <= rows
        await pilot.press("escape")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Sort by next column" in titles and len(titles) == len(set(titles))


async def test_long_log_lines_scroll_sideways_at_80x24(workspace: Path):
    run = make_train_run(workspace, steps=2, status="finished")
    tail = "the end of a very long line"
    with (run / "run.log").open("a") as f:
        f.write("2026-01-02T03:04:09+00:00 " + "x" * 150 + " " + tail + "\n")
    app = app_for(workspace)
    async with app.run_test(size=SIZE) as pilot:
        table = await runs_table(pilot, app, count=1)
        table.move_cursor(0)
        await pilot.press("t")
        log = app.screen.query_one("LogTail")
        await wait_for(pilot, lambda: log.line_count == 4)
        assert tail not in text_of(log) and log.max_scroll_x > 0
        await pilot.press("end")  # the newest line, and along it: the arrow keys a column at a time,
        await pilot.press("right")  # ctrl+pagedown a screen at a time (pressing right ~130 times took 13 s)
        await wait_for(pilot, lambda: log.scroll_x == 1)
        while log.scroll_x < log.max_scroll_x:
            before = log.scroll_x
            await pilot.press("ctrl+pagedown")
            await wait_for(pilot, lambda before=before: log.scroll_x > before)
        assert tail in text_of(log)


async def test_a_held_key_moves_at_once_and_the_conversation_follows_where_it_stops(ws):
    """Repeated keys only move the cursor; the conversation is drawn once they pause, and it is
    the rollout the cursor stopped on (never a stale one)."""
    from textual import events

    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_rollouts(pilot, app, ws["varied"])
        table = screen.query_one(GroupsTable)
        view = screen.query_one(ConversationView)
        for _ in range(7):  # what a terminal sends while j is held: repeats queued faster than frames
            app.post_message(events.Key("j", "j"))
        await wait_for(pilot, lambda: table.cursor_row == 7)
        await wait_for(pilot, lambda: view.rollout is screen.rollout and screen.rollout.example_id == 7)
        assert "example 7 · rollout 1/4" in text_of(screen.query_one("#breakdown"))
