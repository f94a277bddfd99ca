"""Pilot tests for every TUI screen, over runs produced by the project's code (tests/tui_data.py):
runs home, rollouts, reward variance, training monitor (live), checkpoints, compare, GEPA,
launch, logs, keys and the command palette — at 80x24."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tui_data import (
    CREATED,
    REWARD_FAILED,
    SERVER_FAILED,
    make_eval,
    make_gepa_run,
    make_train_run,
    shared_workspace,
    text_of,
    train_metrics,
    wait_for,
    write_results,
)
from workbench.engine.summary import summarize
from workbench.inference.echo import EchoClient
from workbench.store.results import read_groups
from workbench.train.metrics import MetricsLogger
from workbench.tui.app import WorkbenchApp
from workbench.tui.data.rollout_index import RolloutIndex
from workbench.tui.launcher import Launch, Launcher, LaunchSpec
from workbench.tui.screens.checkpoints import CheckpointsScreen
from workbench.tui.screens.compare import CompareScreen
from workbench.tui.screens.gepa import GepaScreen
from workbench.tui.screens.keys import KeysScreen
from workbench.tui.screens.launch import LaunchScreen
from workbench.tui.screens.log import LogScreen
from workbench.tui.screens.monitor import TrainMonitorScreen
from workbench.tui.screens.rollouts import RolloutsScreen
from workbench.tui.screens.runs import RunsScreen
from workbench.tui.screens.variance import VarianceScreen
from workbench.tui.widgets.conversation import ConversationView, MessageBlock
from workbench.tui.widgets.groups_table import GroupsTable
from workbench.tui.widgets.metric_plot import MetricPlot
from workbench.tui.widgets.runs_table import RunsTable

SIZE = (80, 24)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """One workspace with every kind of run, shared by the read-only tests of this module."""
    with shared_workspace(tmp_path_factory.mktemp("tui") / "ws") as runs:
        yield runs


class RecordingLauncher(Launcher):
    """Records what would be launched, without starting processes."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.started: list[LaunchSpec] = []

    def start(self, spec: LaunchSpec) -> Launch:
        self.started.append(spec)
        return Launch(
            "fake", spec.kind, spec.args, spec.env, spec.model, 0, str(self.folder / "fake.log"), CREATED
        )


def app_for(root: Path, **kw) -> WorkbenchApp:
    return WorkbenchApp(root, poll_s=0.2, **kw)


async def open_row(pilot, app: WorkbenchApp, predicate) -> None:
    """Move the Runs cursor to the first run matching `predicate`."""
    table = app.screen.query_one(RunsTable)
    await wait_for(pilot, lambda: table.runs)
    table.move_cursor(row=next(i for i, r in enumerate(table.runs) if predicate(r)))
    await pilot.pause()


def rows(app: WorkbenchApp) -> list:
    return app.screen.query_one(RunsTable).runs


# ----- runs home ---------------------------------------------------------------------------------
async def test_runs_lists_every_run_and_filters(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(rows(app)) == 5)
        assert {(r.kind, r.env, r.status) for r in rows(app)} == {
            ("train", "reverse-words", "running"),
            ("eval", "reverse-words", "finished"),
            ("gepa", "reverse-words", "finished"),
            ("eval", "lookup-facts", "finished"),
        }
        assert rows(app)[0].kind == "train"  # newest first (then by id)
        await pilot.press("f")  # kind: eval
        assert {r.kind for r in rows(app)} == {"eval"} and len(rows(app)) == 3
        await pilot.press("f", "f", "f")  # train, gepa, all
        assert len(rows(app)) == 5
        await pilot.press("s")  # status: running
        assert [r.kind for r in rows(app)] == ["train"]
        await pilot.press("escape")
        await pilot.press("slash", *"lookup", "enter")
        assert [r.env for r in rows(app)] == ["lookup-facts"]
        summary = text_of(app.screen.query_one("#runs-summary"))
        assert "search: lookup" in summary and "1/5 runs" in summary
        await pilot.press("escape")
        assert len(rows(app)) == 5


async def test_runs_refresh_live_and_show_progress(workspace: Path, monkeypatch):
    app = app_for(workspace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.3)
        assert rows(app) == []
        assert app.screen.query_one("#runs-empty").display
        run = make_train_run(workspace, steps=2)
        await wait_for(pilot, lambda: len(rows(app)) == 1)
        assert rows(app)[0].progress == "2/10"
        meta = json.loads((run / "metadata.json").read_text())
        meta.update(step=3, status="stopped")
        (run / "metadata.json").write_text(json.dumps(meta))
        await wait_for(pilot, lambda: rows(app)[0].status == "stopped" and rows(app)[0].progress == "3/10")


# ----- rollouts ------------------------------------------------------------------------------------
async def open_eval(pilot, app, run_dir: Path) -> RolloutsScreen:
    await open_row(pilot, app, lambda r: r.path == run_dir)
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(app.screen, RolloutsScreen))
    screen = app.screen
    assert isinstance(screen, RolloutsScreen)
    await wait_for(pilot, lambda: screen.loaded and screen.rollout is not None)
    return screen


async def test_rollouts_navigation_filters_search_and_copy(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_eval(pilot, app, ws["varied"])
        table = screen.query_one(GroupsTable)
        assert table.row_count == 12 and (screen.rollout.example_id, screen.rollout.rollout_index) == (0, 0)
        assert "example 0 · rollout 1/4" in text_of(screen.query_one("#breakdown"))
        await pilot.press("right_square_bracket")
        assert screen.rollout.rollout_index == 1
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert screen.rollout.rollout_index == 3  # wraps around
        await pilot.press("n")
        await pilot.pause()
        assert screen.rollout.example_id == 1 and screen.rollout.rollout_index == 0
        await pilot.press("p")
        await pilot.pause()
        assert screen.rollout.example_id == 0
        # the conversation: system, user, then the assistant's answer
        blocks = screen.query(MessageBlock)
        assert [b.border_title for b in blocks] == ["system", "user", "assistant"]
        # copy as JSON: the exact record
        await pilot.press("y")
        copied = json.loads(app.clipboard)
        assert (copied["example_id"], copied["rollout_index"]) == (0, 0) and copied["completion"]

        # filters
        def rollouts(g):
            return screen.index.load_group(g.example_id).rollouts

        for key, check in (
            ("e", lambda g: any(r.error for r in rollouts(g))),
            ("t", lambda g: any(r.is_truncated for r in rollouts(g))),
            ("z", lambda g: g.std == 0),
        ):
            await pilot.press(key)
            await wait_for(pilot, lambda: 0 < table.row_count < 12)
            assert all(check(g) for g in table.groups)
            await pilot.press("a")
            await wait_for(pilot, lambda: table.row_count == 12)
        await pilot.press("r", *"0.5..0.9", "enter")
        await wait_for(pilot, lambda: 0 < table.row_count < 12)
        assert all(0.5 <= g.mean <= 0.9 for g in table.groups)
        assert "reward 0.5..0.9" in text_of(screen.query_one("#rollouts-title"))
        await pilot.press("a")
        await wait_for(pilot, lambda: table.row_count == 12)
        word = screen.index.load(5, 0).prompt[-1]["content"]
        await pilot.press("slash", *word, "enter")
        await wait_for(pilot, lambda: table.row_count < 12)
        assert 5 in [g.example_id for g in table.groups]
        await pilot.press("escape")
        assert isinstance(app.screen, RunsScreen)


async def test_rollouts_show_error_and_tool_calls(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_eval(pilot, app, ws["varied"])
        await pilot.press("e")
        table = screen.query_one(GroupsTable)
        await wait_for(pilot, lambda: 0 < table.row_count < 12)
        group = table.groups[0]
        errored = next(r.rollout_index for r in screen.index.load_group(group.example_id).rollouts if r.error)
        for _ in range(errored):
            await pilot.press("right_square_bracket")
        assert "error (env) RuntimeError" in text_of(screen.query_one("#breakdown"))
        await pilot.press("escape")
        screen = await open_eval(pilot, app, ws["tools"])
        titles = [b.border_title for b in screen.query(MessageBlock)]
        assert "assistant · tool call" in titles and "tool ← lookup" in titles
        tool_call = next(b for b in screen.query(MessageBlock) if b.border_title == "assistant · tool call")
        assert '→ lookup({"query": "Where was Ada Quill born?"})' in " ".join(text_of(tool_call).split())
        tool_result = next(b for b in screen.query(MessageBlock) if b.border_title == "tool ← lookup")
        assert "born in Lake Orvin" in text_of(tool_result)
        assert "exact_answer" in text_of(screen.query_one("#breakdown"))  # this env's own reward function


async def test_rollouts_open_10k_lazily(workspace: Path):
    """A run with 10,000 rollouts opens keeping only a few numbers per rollout; conversations are
    read when shown (how fast: benchmarks/tui_open_run.py holds the 0.5 s bar)."""
    from benchmarks.tui_open_run import make_big_run

    run_dir = make_big_run(workspace, num_examples=1250, rollouts=8)
    app = app_for(workspace)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(rows(app)) == 1)
        app.push_screen(RolloutsScreen(run_dir / "results.jsonl", run=rows(app)[0]))
        await wait_for(
            pilot,
            lambda: (
                isinstance(app.screen, RolloutsScreen)
                and app.screen.loaded
                and app.screen.rollout is not None
            ),
            step=0.01,
        )
        screen = app.screen
        assert screen.query_one(GroupsTable).row_count == 1250
        assert len(screen.index) == 10_000 and not hasattr(screen.index, "rollouts")  # numbers only
        assert screen.rollout.completion  # the shown rollout was read in full


# ----- reward variance -------------------------------------------------------------------------------
async def test_variance_histogram_shares_and_jump_to_example(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        await open_row(pilot, app, lambda r: r.path == ws["varied"])
        await pilot.press("v")
        screen = app.screen
        assert isinstance(screen, VarianceScreen)
        await wait_for(pilot, lambda: screen.report is not None)
        report = screen.report
        histogram = dict(screen.query_one("#std-histogram").items)
        assert sum(histogram.values()) == 12
        no_signal = histogram["0"] + histogram["0-0.05"]  # std under 0.05: too easy or too hard
        assert (
            no_signal == report.counts["too easy"] + report.counts["too hard"]
            and report.counts["too hard"] == 1
        )
        shares = text_of(screen.query_one("#variance-shares"))
        assert "too easy" in shares and "in range" in shares and "too hard" in shares
        table = screen.query_one("#variance-table")
        stds = [float(row[2]) for row in table.rows]
        assert stds == sorted(stds, reverse=True) and stds[0] > 0
        example = int(table.rows[1][0])
        await pilot.press("down", "enter")
        rollouts = app.screen
        assert isinstance(rollouts, RolloutsScreen)
        await wait_for(pilot, lambda: rollouts.rollout is not None)
        assert rollouts.rollout.example_id == example


async def test_variance_reads_no_record_and_shows_summarize_numbers(workspace: Path, monkeypatch):
    """The screen is built from the index's numbers: no record is read back, and the mean reward,
    zero-variance share and verdict are summarize's, which leave out a group a server failure
    spoiled (here it would pull the mean down to 0.5)."""
    path = write_results(
        workspace / "run",
        {
            0: [1.0, 1.0, 1.0, 1.0],
            1: [0.0, 1.0, 1.0, 1.0],
            2: [0.5, 1.0, 0.75, 1.0],
            3: [1.0, 1.0, 1.0, 0.0],
            4: [0.0, 0.0, 0.0, 0.0],
        },
        {(1, 0): REWARD_FAILED, (4, 0): SERVER_FAILED},
    )
    expected = summarize(read_groups(path.parent))
    assert expected["incomplete_groups"] == 1 and expected["zero_variance_frac"] == 0.25

    def no_records(*_):
        raise AssertionError("the variance screen read a record")

    for name in ("load_group", "record", "raw"):
        monkeypatch.setattr(RolloutIndex, name, no_records)
    app = app_for(workspace)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        chosen: list[int] = []
        screen = VarianceScreen(path)
        app.push_screen(screen, chosen.append)
        await wait_for(
            pilot, lambda: screen.report is not None and len(screen.query_one("#variance-table").rows) == 5
        )
        table, shares_widget = screen.query_one("#variance-table"), screen.query_one("#variance-shares")

        def shares() -> str:  # the text shown, its lines joined (a long verdict wraps)
            return " ".join(text_of(shares_widget).split())

        await wait_for(pilot, lambda: expected["verdict"] in shares())  # laid out
        assert "5 groups" in shares() and f"mean reward {expected['reward_mean']:.3f}" in shares()
        assert "zero-variance groups 25%" in shares()
        assert [row[0] for row in table.rows] == ["1", "3", "2", "0", "4"]  # std desc, then example id
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: chosen)
        assert chosen == [3] and app.screen is not screen


# ----- training monitor ---------------------------------------------------------------------------
async def test_monitor_curves_update_live(workspace: Path, monkeypatch):
    varied = await asyncio.to_thread(make_eval, "reverse-words", EchoClient(), 4, 2, "tiny-eval")
    run = make_train_run(workspace, rollouts_from=varied)
    app = WorkbenchApp(workspace)  # the default 1 s poll
    async with app.run_test(size=SIZE) as pilot:
        await open_row(pilot, app, lambda r: r.kind == "train")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, TrainMonitorScreen))
        screen = app.screen
        assert isinstance(screen, TrainMonitorScreen)
        reward = screen.query_one("#plot-0", MetricPlot)
        await wait_for(pilot, lambda: reward.lines and reward.lines[0][1][-1] == 6)
        assert [label for label, *_ in reward.lines] == ["mean", "std"]
        assert screen.query_one("#plot-1", MetricPlot).lines[0][2][-1] == pytest.approx(
            train_metrics(6)["train/loss"]
        )
        kl = {label: values for label, _, values in screen.query_one("#plot-3", MetricPlot).lines}
        assert kl["mismatch"][-1] == pytest.approx(
            train_metrics(6)["policy/mismatch_kl"]
        )  # trainer vs sampler
        assert kl["mismatch max"][-1] == pytest.approx(train_metrics(6)["policy/mismatch_kl_max"])
        eta = text_of(screen.query_one("#monitor-eta"))
        assert "step 6/10" in eta and "2.0 s/step" in eta and "ETA 8s" in eta
        from types import SimpleNamespace

        logger = MetricsLogger(run, SimpleNamespace(mode="disabled"), "x", {}, resume=True)
        logger.log(7, {**train_metrics(7), "eval/reward_mean": 0.9})
        await wait_for(pilot, lambda: reward.lines[0][1][-1] == 7)  # picked up by the next poll
        assert [label for label, *_ in reward.lines] == ["mean", "std", "eval"]
        await pilot.press("2")
        latest = screen.query_one("#latest-groups", GroupsTable)
        await wait_for(pilot, lambda: latest.row_count == 4)
        assert screen.latest_step == 6 and screen.query(MessageBlock)
        await pilot.press("3")
        log = screen.query_one("#log LogTail")
        await wait_for(pilot, lambda: log.line_count >= 7)
        assert "step 6/10" in "\n".join(log.lines)
        await pilot.press("2", "enter")
        assert isinstance(app.screen, RolloutsScreen) and app.screen.label == "step 6"


async def test_train_rollouts_step_through_steps(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        await open_row(pilot, app, lambda r: r.kind == "train")
        await pilot.press("r")
        screen = app.screen
        assert isinstance(screen, RolloutsScreen) and screen.label == "step 6"
        await wait_for(pilot, lambda: screen.loaded)
        await pilot.press("comma")
        await wait_for(
            pilot, lambda: screen.label == "step 5" and screen.loaded and screen.rollout is not None
        )
        await pilot.press("full_stop", "full_stop")
        assert screen.label == "step 6"


# ----- checkpoints and compare ----------------------------------------------------------------------
async def open_checkpoints(pilot, app) -> CheckpointsScreen:
    """From the runs home: the training run's checkpoints screen (k)."""
    await open_row(pilot, app, lambda r: r.kind == "train")
    await pilot.press("K")
    assert isinstance(app.screen, CheckpointsScreen)
    return app.screen


async def test_checkpoints_evaluate_and_compare(workspace: Path):
    run = make_train_run(workspace, status="finished")
    for step in (3, 6):  # evals of both checkpoints, as `workbench eval run ENV -m <checkpoint>` saves them
        checkpoint = run / "checkpoints" / f"step_{step:06d}"
        client = EchoClient(mode="reverse" if step == 6 else "echo")
        await asyncio.to_thread(
            make_eval,
            "reverse-words",
            client,
            6,
            2,
            f"ck{step}",
            model=str(checkpoint),
            created_at=f"2026-01-0{step // 3 + 2}T00:00:00+00:00",
        )
    launcher = RecordingLauncher(workspace)
    app = app_for(workspace, launcher=launcher)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_checkpoints(pilot, app)
        table = screen.query_one("#ckpt-table")
        await wait_for(pilot, lambda: table.row_count == 2 and len(screen.evals) == 2)
        assert [c.step for c in screen.checkpoints] == [3, 6]
        assert str(table.rows[1][4]) == "4.1 KB" and "0.500" in str(table.rows[1][2])
        assert sorted(label for label, _ in screen.evals) == ["step 3", "step 6"]
        await pilot.press("down", "e")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "EvalCheckpointScreen")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: launcher.started)
        spec = launcher.started[0]
        assert spec.args == [
            "eval",
            "run",
            "reverse-words",
            "-m",
            str((run / "checkpoints" / "step_000006").resolve()),
            "-n",
            "20",
            "-r",
            "4",
        ]
        await pilot.press("space")  # focuses the evals table and marks its first row
        await pilot.press("down", "space", "c")
        compare = app.screen
        assert isinstance(compare, CompareScreen)
        await wait_for(pilot, lambda: compare.comparison is not None)
        assert compare.labels == ("step 3", "step 6")
        assert compare.comparison.shared == 6 and compare.comparison.mean_a == 0.0


async def test_checkpoints_screen_draws_the_sweep_and_launches_one(workspace: Path):
    from workbench.store.sweeps import BASE, SweepKey, SweepPoint, append_point

    run = make_train_run(workspace, status="finished")
    key = SweepKey(env_id="reverse-words", num_examples=8, rollouts_per_example=2, seed=0)
    for step, reward in (
        (BASE, 0.1),
        (3, 0.2),
        (6, 0.35),
    ):  # as `eval run -m RUN --checkpoints all` records them
        append_point(
            run, SweepPoint(key=key, step=step, model=f"m{step}", eval_run=str(workspace), reward_mean=reward)
        )
    launcher = RecordingLauncher(workspace)
    app = app_for(workspace, launcher=launcher)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_checkpoints(pilot, app)
        plot = screen.query_one("#sweep-plot")
        await wait_for(pilot, lambda: plot.lines == [("reward", [0.0, 3.0, 6.0], [0.1, 0.2, 0.35])])
        await pilot.press("s")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "EvalCheckpointScreen")
        await pilot.press("ctrl+s")  # the form, then the question: 3 evals of 20 x 4
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ConfirmScreen")
        assert "3 evals of 20 examples x 4 rollouts (240 rollouts)" in app.screen.question
        assert not launcher.started
        await pilot.press("y")
        await wait_for(pilot, lambda: launcher.started)
        assert launcher.started[0].args == [
            "eval",
            "run",
            "reverse-words",
            "-m",
            str(run.resolve()),
            "-n",
            "20",
            "-r",
            "4",
            "--checkpoints",
            "all",
        ]


async def test_compare_two_evals_from_runs(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        await open_row(pilot, app, lambda r: r.path == ws["varied"])
        await pilot.press("space")
        await open_row(pilot, app, lambda r: r.path == ws["base"])
        await pilot.press("space", "c")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await wait_for(pilot, lambda: screen.comparison is not None)
        assert screen.a.path == ws["base"] and screen.b.path == ws["varied"]  # older is A
        table = screen.query_one("#compare-table")
        fixed = screen.comparison.count("fixed")
        assert table.row_count == 12 and fixed > 0 and "fixed" in text_of(screen.query_one("#compare-title"))
        await pilot.press("f")
        assert table.row_count == fixed
        await pilot.press("a")
        assert isinstance(app.screen, RolloutsScreen) and app.screen.run.path == ws["base"]


# ----- GEPA ---------------------------------------------------------------------------------------
async def test_gepa_candidates_pareto_best_and_diff(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        await open_row(pilot, app, lambda r: r.kind == "gepa")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GepaScreen))
        screen = app.screen
        assert isinstance(screen, GepaScreen)
        await wait_for(pilot, lambda: screen.gepa is not None)
        assert screen.query_one("#gepa-candidates").row_count == 3
        assert "seed 0.420 → best 0.710" in text_of(screen.query_one("#gepa-title"))
        await pilot.press("2")
        pareto = screen.query_one("#gepa-pareto")
        assert pareto.row_count == 4 and str(pareto.rows[0][2]) == "#0, #2"
        await pilot.press("3")
        assert "Keep spaces where they fall" in text_of(screen.query_one("#gepa-best"))
        await pilot.press("4")
        diff = text_of(screen.query_one("#gepa-diff"))
        assert "+Keep spaces" in diff and "-Reverse the text character by character. Put" in diff


async def test_gepa_with_missing_keys_shows_dashes(workspace: Path):
    run = make_gepa_run(workspace)
    (run / "metadata.json").write_text(
        json.dumps({"kind": "gepa", "status": "running", "env_id": "reverse-text", "created_at": CREATED})
    )
    (run / "best_prompt.txt").unlink()
    (run / "pareto_frontier.jsonl").unlink()
    app = app_for(workspace)
    async with app.run_test(size=SIZE) as pilot:
        await open_row(pilot, app, lambda r: r.kind == "gepa")
        assert rows(app)[0].progress == "-" and rows(app)[0].model == "-"
        await pilot.press("enter")
        screen = app.screen
        await wait_for(pilot, lambda: screen.gepa is not None)
        assert "seed - → best -" in text_of(screen.query_one("#gepa-title"))
        assert screen.query_one("#gepa-candidates").row_count == 0


# ----- launch, logs, keys, palette ------------------------------------------------------------------
async def test_launch_screen_builds_the_commands(ws):
    root = ws["root"]
    config = root / "configs" / "eval" / "reverse-text.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        '# workbench eval run configs/eval/reverse-text.toml\nenv_id = "reverse-text"\nmodel = "tiny"\n'
    )
    launcher = RecordingLauncher(root)
    app = app_for(root, launcher=launcher)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("l")
            screen = app.screen
            assert isinstance(screen, LaunchScreen)
            assert "workbench eval run configs/eval/reverse-text.toml" in text_of(
                screen.query_one("#launch-preview")
            )
            await pilot.press("enter")  # shows the command; a second Enter starts it
            await pilot.pause()
            assert not launcher.started and "$ workbench eval run configs/eval/reverse-text.toml" in text_of(
                screen.query_one("#confirm-command")
            )
            await pilot.press("enter")
            await wait_for(pilot, lambda: launcher.started)
            assert launcher.started[0].args == ["eval", "run", "configs/eval/reverse-text.toml"]
            assert isinstance(app.screen, RunsScreen)
            await pilot.press("l", "ctrl+e")
            screen = app.screen
            model = screen.query_one("#eval-model")
            model.value = "echo"
            screen.query_one("#eval-n").value = "7"
            screen.query_one("#eval-extra").value = "-b http://127.0.0.1:9/v1 -c 1"
            await pilot.pause()
            assert "workbench eval run reverse-text -m echo -n 7 -r 4 -b" in text_of(
                screen.query_one("#launch-preview")
            )
            screen.query_one("#eval-r").value = "0"
            await pilot.press("ctrl+s")
            assert len(launcher.started) == 1 and isinstance(
                app.screen, LaunchScreen
            )  # refused: r must be >= 1
            screen.query_one("#eval-r").value = "2"
            await pilot.press("ctrl+s", "ctrl+s")  # the command, then start it
            await wait_for(pilot, lambda: len(launcher.started) == 2)
            assert launcher.started[1].args == [
                "eval",
                "run",
                "reverse-text",
                "-m",
                "echo",
                "-n",
                "7",
                "-r",
                "2",
                "-b",
                "http://127.0.0.1:9/v1",
                "-c",
                "1",
            ]
    finally:
        config.unlink()


async def test_log_screen_follows_run_log(workspace: Path):
    run = make_train_run(workspace, steps=2, status="finished")
    app = app_for(workspace)
    async with app.run_test(size=SIZE) as pilot:
        await open_row(pilot, app, lambda r: r.kind == "train")
        await pilot.press("t")
        screen = app.screen
        assert isinstance(screen, LogScreen) and [label for label, _ in screen.logs] == ["run.log"]
        log = screen.query_one("LogTail")
        await wait_for(pilot, lambda: log.line_count == 3)
        with (run / "run.log").open("a") as f:
            f.write("2026-01-02T03:04:09+00:00 finished at step 2\n")
        await wait_for(pilot, lambda: "finished at step 2" in log.lines[-1])
        await pilot.press("x")  # not running: refused with a message, nothing signalled
        assert isinstance(app.screen, LogScreen)


async def test_keys_and_command_palette_list_the_screen_actions(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, KeysScreen)
        actions = {row[1] for row in app.screen.rows}
        assert {"Open", "Launch", "Search", "Stop", "Log", "Compare marked evals", "Quit"} <= actions
        await pilot.press("escape")
        await open_eval(pilot, app, ws["varied"])
        commands = {c.title for c in app.get_system_commands(app.screen)}
        assert {
            "Copy JSON",
            "Next rollout",
            "Errors",
            "Truncated",
            "Zero variance",
            "Reward range",
            "Search",
            "Variance",
            "Back",
        } <= commands
        assert "Next step" not in commands  # only for training runs
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        await pilot.press(*"copy json")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.clipboard.startswith("{"))


async def test_every_screen_fits_80x24(ws):
    app = app_for(ws["root"])
    async with app.run_test(size=SIZE) as pilot:
        await open_eval(pilot, app, ws["varied"])
        screen = app.screen
        assert (
            screen.query_one(GroupsTable).size.width >= 30
            and screen.query_one(ConversationView).size.width >= 40
        )
        assert screen.query_one(ConversationView).size.height >= 8
        await pilot.press("escape")
        await open_row(pilot, app, lambda r: r.kind == "train")
        await pilot.press("enter")
        await pilot.pause(0.3)
        for plot in app.screen.query(MetricPlot):
            assert plot.size.width >= 20 and plot.size.height >= 7
        table = app.screen.query_one("Footer")
        assert table.region.y == 23
