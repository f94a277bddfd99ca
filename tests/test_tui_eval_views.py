"""The eval views of issue 35: the reward histogram and pass@k panel of Rollouts (numbers equal to
the eval summary's and verifiers' definition), the difficulty rule's "no signal" label in the
variance view, filters that say why they leave no group, empty tables that say so, `?` that
names where each key works, and chart legends that never cover the curves. Pilot tests over runs
made by the project's own code (tests/tui_data.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tui_data import (
    SERVER_FAILED,
    make_train_run,
    shared_workspace,
    text_of,
    wait_for,
    write_results,
)
from workbench.engine.difficulty import DEFAULT_RULE, DifficultyRule, difficulty_counts
from workbench.engine.summary import DEFAULT_PASS_THRESHOLD, summarize
from workbench.store.results import read_groups
from workbench.tui.app import WorkbenchApp
from workbench.tui.data.reward_stats import (
    PASS_THRESHOLD,
    pass_at_k_of,
    reward_histogram,
    reward_stats,
    run_pass_threshold,
)
from workbench.tui.data.rollout_index import RolloutIndex
from workbench.tui.screens.group import GroupScreen
from workbench.tui.screens.keys import KeysScreen
from workbench.tui.screens.rollouts import RolloutsScreen
from workbench.tui.screens.runs import RunsScreen
from workbench.tui.screens.variance import VarianceScreen
from workbench.tui.widgets.groups_table import GroupsTable
from workbench.tui.widgets.metric_plot import LEGEND_MARK, MetricPlot
from workbench.tui.widgets.reward_panel import RewardPanel
from workbench.tui.widgets.runs_table import RunsTable
from workbench.types import Group, Rollout


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    with shared_workspace(tmp_path_factory.mktemp("evalviews") / "ws") as runs:
        yield runs


def app_for(root: Path) -> WorkbenchApp:
    return WorkbenchApp(root, poll_s=0.2)


def group(example_id: int, *rewards: float) -> Group:
    return Group(
        example_id,
        [
            Rollout(example_id=example_id, rollout_index=i, prompt=[], completion=[], reward=r)
            for i, r in enumerate(rewards)
        ],
    )


async def open_rollouts(pilot, app: WorkbenchApp, run_dir: Path) -> RolloutsScreen:
    table = app.screen.query_one(RunsTable)
    await wait_for(pilot, lambda: any(r.path == run_dir for r in table.runs))
    table.move_cursor(next(i for i, r in enumerate(table.runs) if r.path == run_dir))
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(app.screen, RolloutsScreen))
    screen = app.screen
    assert isinstance(screen, RolloutsScreen)
    await wait_for(pilot, lambda: screen.loaded and screen.rollout is not None)
    return screen


async def push_rollouts(pilot, app: WorkbenchApp, path: Path) -> RolloutsScreen:
    await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
    screen = RolloutsScreen(path)
    app.push_screen(screen)
    await wait_for(pilot, lambda: screen.loaded)
    return screen


# ----- pass@k and the reward histogram -----------------------------------------------------------
def test_pass_at_k_is_the_eval_summarys_and_verifiers(workspace: Path):
    """The summary's pass@k and avg@k at each k it lists, for 0/1 and partial-credit rewards and
    groups of uneven size (a short group counts for the k it can); a spoiled group is left out."""
    path = write_results(
        workspace / "run",
        {
            0: [1.0, 0.0, 0.0, 0.0],
            1: [1.0, 0.6, 0.2, 0.0],
            2: [0.0, 0.0, 0.0, 0.0],
            3: [1.0, 1.0, 1.0, 1.0],
            5: [0.7, 0.1],  # short: counts for pass@1 and pass@2 only
            4: [0.0, 1.0, 0.0, 1.0],  # spoiled by a server failure: no result
        },
        {(4, 0): SERVER_FAILED},
    )
    summary = summarize(read_groups(path.parent))
    stats = reward_stats(_refreshed(path))
    assert stats.pass_k is not None and stats.pass_k.n == 4 and stats.pass_k.examples == 5
    assert stats.left_out == 1 and stats.rollouts == 18
    assert summary["pass_threshold"] == stats.pass_k.threshold == PASS_THRESHOLD == DEFAULT_PASS_THRESHOLD
    assert set(summary["pass_at_k"]) == {"pass@1", "pass@2", "pass@4"}
    for name, value in summary["pass_at_k"].items():
        assert stats.pass_k.pass_at[int(name.removeprefix("pass@"))] == pytest.approx(value, abs=1e-12)
    assert stats.pass_k.avg == pytest.approx(summary["avg_at_k"]["avg@4"])
    # by hand, k = 3 (which the summary does not list): 1 - C(n-c, k) / C(n, k), groups of 4 only
    by_hand = [1 - math.comb(4 - c, 3) / math.comb(4, 3) for c in (1, 2, 0, 4)]
    assert stats.pass_k.pass_at[3] == pytest.approx(sum(by_hand) / 4)
    assert stats.pass_k.pass_all[2] == pytest.approx((0 + 1 / 6 + 0 + 1 + 0) / 5)  # C(c, 2) / C(n, 2)


def test_pass_at_k_uses_the_runs_pass_threshold(workspace: Path):
    """A rollout is correct from the environment's threshold up, as the eval's summary recorded it
    (verifiers' own case: 1 of 4 at least 0.7, pass@1 = 0.25); 0.5 where none is recorded."""
    path = write_results(workspace / "run", {0: [0.9, 0.6, 0.2, 0.5]})
    assert run_pass_threshold(path) == PASS_THRESHOLD == 0.5
    assert reward_stats(_refreshed(path)).pass_k.pass_at[1] == pytest.approx(0.75)
    (path.parent / "metadata.json").write_text(json.dumps({"summary": {"pass_threshold": 0.7}}))
    assert run_pass_threshold(path) == 0.7
    strict = reward_stats(_refreshed(path), run_pass_threshold(path)).pass_k
    assert strict is not None and strict.pass_at[1] == pytest.approx(0.25)
    assert strict.pass_at[4] == 1.0 and strict.pass_all[2] == 0.0
    assert pass_at_k_of([], [], 0.5) is None


def test_reward_histogram_bars():
    assert reward_histogram([0.0, 1.0, 1.0, 0.0, 1.0]) == [("0", 2), ("1", 3)]  # a 0/1 reward: two bars
    bars = reward_histogram([0.05, 0.1, 0.33, 0.5, 0.71, 0.9, 1.0, 1.0])
    assert [label for label, _ in bars] == ["0-0.2", "0.2-0.4", "0.4-0.6", "0.6-0.8", "0.8-1"]
    assert [count for _, count in bars] == [2, 1, 1, 1, 3]  # 1.0 is in the top bin
    assert sum(count for _, count in reward_histogram([-0.5, 0.1, 0.2, 0.3, 0.4, 2.0])) == 6
    assert reward_histogram([]) == []


def _refreshed(path: Path) -> RolloutIndex:
    index = RolloutIndex(path)
    index.refresh()
    return index


async def test_rollouts_panel_shows_the_histogram_and_pass_at_k(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=(100, 34)) as pilot:
        screen = await open_rollouts(pilot, app, ws["varied"])
        panel = screen.query_one(RewardPanel)
        await wait_for(pilot, lambda: panel.stats is not None)
        expected = reward_stats(_refreshed(ws["varied"] / "results.jsonl"))
        assert panel.display and panel.stats == expected
        assert dict(panel.query_one("#reward-histogram").items) == dict(expected.histogram)
        assert expected.pass_k is not None
        shown = text_of(panel.query_one("#pass-at-k"))
        table = [line.split() for line in shown.splitlines()]
        for k in range(1, expected.pass_k.n + 1):  # every k = 1..n, with pass@k and pass^k
            assert [
                str(k),
                f"{expected.pass_k.pass_at[k]:.3f}",
                f"{expected.pass_k.pass_all[k]:.3f}",
            ] in table
        assert "reward ≥ 0.5" in shown
        await pilot.press("d")  # hidden, and back
        assert not panel.display
        await pilot.press("d")
        assert panel.display
    app = app_for(ws["root"])
    async with app.run_test(size=(80, 24)) as pilot:  # too short for it: hidden until asked for
        screen = await open_rollouts(pilot, app, ws["varied"])
        panel = screen.query_one(RewardPanel)
        assert not panel.display
        await pilot.press("d")
        assert panel.display


# ----- difficulty: "no signal" is not "too hard" ----------------------------------------------------
def test_low_variance_groups_are_labelled_by_their_mean():
    flat_mid, flat_low, flat_high, nearly_flat_high, varied = (
        group(0, 0.35, 0.35, 0.35, 0.35),  # the case: same reward every time, mid mean
        group(1, 0.0, 0.0, 0.0, 0.05),
        group(2, 1.0, 1.0, 1.0, 1.0),
        group(3, 1.0, 0.95, 1.0, 0.95),
        group(4, 0.0, 1.0, 0.0, 1.0),
    )
    groups = (flat_mid, flat_low, flat_high, nearly_flat_high, varied)
    assert [DEFAULT_RULE.classify(g) for g in groups] == [
        "no signal",
        "too hard",
        "too easy",
        "too easy",
        "in range",
    ]
    assert difficulty_counts(groups) == {"too easy": 2, "in range": 1, "no signal": 1, "too hard": 1}
    # training's filter still drops what cannot teach, whatever it is called
    assert not DifficultyRule.from_variance(0.0, 0.0, 1.0).teaches(flat_mid)


async def test_variance_view_says_no_signal_for_a_flat_mid_group(workspace: Path):
    path = write_results(
        workspace / "run",
        {0: [0.35, 0.35, 0.35, 0.35], 1: [0.0, 1.0, 0.0, 1.0], 2: [0.0] * 4, 3: [1.0] * 4},
    )
    app = app_for(workspace)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        screen = VarianceScreen(path)
        app.push_screen(screen)
        await wait_for(pilot, lambda: screen.report is not None)
        table = screen.query_one("#variance-table")
        await wait_for(pilot, lambda: len(table.rows) == 4)
        verdicts = {row[0]: row[3].plain for row in table.rows}
        assert verdicts == {"0": "no signal", "1": "in range", "2": "too hard", "3": "too easy"}
        await wait_for(pilot, lambda: "no signal" in text_of(screen.query_one("#variance-shares")))
        shares = " ".join(text_of(screen.query_one("#variance-shares")).split())
        assert "no signal 25% (1)" in shares and "too hard 25% (1)" in shares
        assert "else no signal" in shares  # the rule, said on screen


# ----- filters, empty tables ------------------------------------------------------------------
async def test_filters_that_leave_no_group_say_which_and_how_to_clear_them(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_rollouts(pilot, app, ws["varied"])
        table = screen.query_one(GroupsTable)
        await pilot.press("e")
        await wait_for(pilot, lambda: 0 < table.row_count < 12)
        await pilot.press("z")  # errored groups never have zero variance here: nothing passes both
        await wait_for(pilot, lambda: table.row_count == 0)
        title = text_of(screen.query_one("#rollouts-title"))
        assert "filters (all must hold): errors + zero-variance" in title
        shown = " ".join(text_of(table).split())
        assert "No group passes every filter: errors + zero-variance" in shown
        assert "e (errors), z (zero-variance); a clears them all" in shown
        assert screen.rollout is None
        view = screen.query_one("#conversation")
        await wait_for(
            pilot, lambda: [text_of(w).strip() for w in view.query(".empty")] == ["no rollout selected"]
        )
        await pilot.press("a")
        await wait_for(pilot, lambda: table.row_count == 12)


async def test_empty_tables_say_so(workspace: Path):
    path = workspace / "empty" / "results.jsonl"
    path.parent.mkdir()
    path.write_text("")
    app = app_for(workspace)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await push_rollouts(pilot, app, path)
        assert "no groups in this file" in text_of(screen.query_one(GroupsTable))
        await pilot.press("v")
        variance = app.screen
        assert isinstance(variance, VarianceScreen)
        await wait_for(pilot, lambda: variance.report is not None)
        assert "no groups in this run yet" in text_of(variance.query_one("#variance-table"))


# ----- ? names where each key works ------------------------------------------------------------
async def test_keys_say_where_each_key_works(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=(100, 34)) as pilot:
        await open_rollouts(pilot, app, ws["varied"])
        await pilot.press("question_mark")
        keys = app.screen
        assert isinstance(keys, KeysScreen)
        rows = set(keys.rows)
        assert {
            ("j", "Down", "groups table"),
            ("k", "Up", "groups table"),
            ("pgdn", "Page down", "groups table"),
            ("⏎", "Open group", "groups table"),
            ("j", "Scroll down", "conversation"),
            ("n", "Next match", "conversation"),
            ("n", "Next example", "Rollouts"),
            ("f", "Find in rollout", "Rollouts"),
            ("F", "Full screen", "Rollouts"),
            ("e", "Errors", "Rollouts"),
            ("esc", "Back", "every screen"),
            ("q", "Quit", "every screen"),
        } <= rows
        assert len(keys.rows) == len(rows)  # no row twice
        assert [key for key, _, _ in keys.rows].count("esc") == 1
        assert len({where for _, _, where in keys.rows}) >= 4
        assert sum(where == "Rollouts" for _, _, where in keys.rows) < len(keys.rows) / 2
        await pilot.press("escape")
        await pilot.press("enter")  # the Group view: its tab is its own, listed once
        await wait_for(pilot, lambda: isinstance(app.screen, GroupScreen))
        await pilot.press("question_mark")
        rows = app.screen.rows
        assert [key for key, _, _ in rows].count("tab") == 1 and (
            "tab",
            "Table / conversation",
            "Group",
        ) in rows
        assert ("⏎", "Open rollout", "rollouts table") in rows


# ----- chart legends ------------------------------------------------------------------------------
async def test_chart_legend_names_the_curves_above_the_plot_at_100_columns(workspace: Path):
    make_train_run(workspace, steps=6, status="finished")
    app = app_for(workspace)
    async with app.run_test(size=(100, 30)) as pilot:
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.runs) == 1)
        await pilot.press("enter")
        plot = app.screen.query_one("#plot-0", MetricPlot)  # reward: mean and std
        await wait_for(pilot, lambda: len(plot.lines) == 2)
        await pilot.pause(0.2)
        lines = text_of(plot).splitlines()
        assert f"{LEGEND_MARK} mean" in lines[0] and f"{LEGEND_MARK} std" in lines[0]
        assert not any("mean" in line or "std" in line for line in lines[1:])  # nothing drawn over the curves
        assert plot.size.width < 40  # the narrow case this is about
