"""The Environments screen (issue 35): `E` on Runs lists the workspace's, bundled and installed
environments (a real `workbench env list --json` child), shows the highlighted one's arguments,
README and newest eval, evaluates it (Enter: the launcher's Eval form on it), opens its last eval's
rollouts, and runs `env init` / `env install` as children with their output on screen."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.widgets import Log, Markdown

from tests.tui_data import shared_workspace, text_of, wait_for
from workbench.tui.app import WorkbenchApp
from workbench.tui.data.environments import EnvEntry, latest_evals, parse_env_list, readme_of
from workbench.tui.data.runs import RunInfo
from workbench.tui.launcher import Launcher
from workbench.tui.screens.environments import EnvironmentsScreen
from workbench.tui.screens.launch import LaunchScreen
from workbench.tui.screens.rollouts import RolloutsScreen
from workbench.tui.widgets.virtual_table import VirtualTable

SIZE = (120, 40)
README = "# reverse-words\n\nReverse a phrase, **character by character**.\n"


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    with shared_workspace(tmp_path_factory.mktemp("envs") / "ws") as runs:
        (runs["root"] / "environments" / "reverse_words" / "README.md").write_text(README)
        yield runs


async def open_environments(pilot, app: WorkbenchApp) -> EnvironmentsScreen:
    await pilot.press("E")
    screen = app.screen
    assert isinstance(screen, EnvironmentsScreen)
    await wait_for(pilot, lambda: screen.loaded)
    return screen


def select(screen: EnvironmentsScreen, env_id: str) -> None:
    table = screen.query_one(VirtualTable)
    assert table.select_key(env_id), [e.env_id for e in screen.entries]


async def test_lists_environments_with_arguments_readme_and_last_eval(ws):
    app = WorkbenchApp(ws["root"], poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_environments(pilot, app)
        assert screen.error is None
        by_id = {e.env_id: e for e in screen.entries}
        assert by_id["reverse-words"].origin == by_id["lookup-facts"].origin == "workspace"
        assert (
            by_id["reverse-text"].origin == "bundled"
            and "num_eval_examples" in by_id["reverse-text"].arguments
        )
        # workspace environments first (what the user writes), then bundled ones
        origins = [e.origin for e in screen.entries]
        assert origins == sorted(origins, key=["workspace", "bundled", "installed"].index)
        # the newest eval of reverse-words is the varied run (the echo one is a day older)
        assert screen.last_evals["reverse-words"].path == ws["varied"]
        select(screen, "reverse-words")
        await pilot.pause()
        summary = text_of(screen.query_one("#env-summary"))
        assert "reverse a phrase character by character" in summary
        assert "environments/reverse_words" in summary and "20260102-030405-aaaa" in summary
        assert f"reward {ws_reward(screen, 'reverse-words')}" in summary
        assert "**character by character**" in screen.query_one("#env-readme", Markdown).source
        row = screen.query_one(VirtualTable).rows[screen.query_one(VirtualTable).cursor_row]
        assert row[0] == "reverse-words" and row[3] == ws_reward(screen, "reverse-words")
        select(screen, "reverse-text")
        await pilot.pause()
        summary = text_of(screen.query_one("#env-summary"))
        assert "bundled with workbench" in summary and "num_eval_examples = 200" in summary
        await wait_for(pilot, lambda: "none yet" in text_of(screen.query_one("#env-summary")))  # no eval here


def ws_reward(screen: EnvironmentsScreen, env_id: str) -> str:
    reward = screen.last_evals[env_id].reward
    assert reward is not None
    return f"{reward:.3f}"


async def test_enter_opens_the_eval_form_on_the_environment_and_r_its_last_rollouts(ws):
    app = WorkbenchApp(ws["root"], poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_environments(pilot, app)
        select(screen, "lookup-facts")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchScreen))
        launch = app.screen
        assert isinstance(launch, LaunchScreen)
        assert launch.query_one("#eval-env").value == "lookup-facts"
        assert launch.focused is not None and launch.focused.id == "eval-model"  # the env is chosen
        assert "$ workbench eval run lookup-facts -m tiny" in text_of(launch.query_one("#launch-preview"))
        await pilot.press("escape")  # nothing edited: straight back
        assert app.screen is screen
        await pilot.press("r")
        rollouts = app.screen
        assert isinstance(rollouts, RolloutsScreen) and rollouts.path == ws["tools"] / "results.jsonl"
        await wait_for(pilot, lambda: rollouts.loaded)
        await pilot.press("escape")
        select(screen, "wordle")
        await pilot.press("r")  # never evaluated here: a warning, no screen
        assert app.screen is screen


async def test_env_init_and_install_run_as_children_with_their_output(workspace: Path):
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_environments(pilot, app)
        assert "my-env" not in {e.env_id for e in screen.entries}
        await pilot.press("n", *"my-env", "enter")
        log = screen.query_one("#env-task-log", Log)
        # done when the list is read again with the new env in it, the cursor on it
        await wait_for(pilot, lambda: screen.current is not None and screen.current.env_id == "my-env")
        assert (workspace / "environments" / "my_env" / "my_env.py").is_file()
        assert screen.current.origin == "workspace"
        assert any("created" in line and "environments/my_env/my_env.py" in line for line in log.lines)
        # install: the prompt starts with the workspace env's id; --dry-run prints pip's command only
        await pilot.press("i")
        prompt = screen.query_one("#envs-prompt")
        assert prompt.value == "my-env"
        await pilot.press("end", *" --dry-run", "enter")  # (typing at once would replace the id)
        await wait_for(pilot, lambda: screen.command is None and any("pip install" in x for x in log.lines))
        assert log.lines[0] == "$ workbench env install my-env --dry-run"
        assert any(
            line.endswith("pip install -e " + str(workspace / "environments" / "my_env"))
            for line in log.lines
        )


async def test_a_failing_listing_says_why(workspace: Path):
    launcher = Launcher(workspace, python="/bin/false")  # every child exits 1 without a word
    app = WorkbenchApp(workspace, launcher=launcher, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_environments(pilot, app)
        assert screen.entries == [] and screen.error == "workbench env list exited with code 1"
        assert "could not list them" in text_of(screen.query_one("#envs-title"))


def test_env_list_output_and_newest_evals(tmp_path: Path):
    entries = parse_env_list(
        '[{"id": "a-b", "kind": "ToolEnv", "origin": "workspace", "description": "d", '
        '"arguments": {"n": 3, "x": null}, "location": "' + str(tmp_path) + '", "error": null}]'
    )
    assert entries == [EnvEntry("a-b", "ToolEnv", "workspace", "d", {"n": 3, "x": None}, str(tmp_path), None)]
    with pytest.raises(ValueError):
        parse_env_list('{"id": "a"}')
    assert readme_of(entries[0]) is None
    (tmp_path / "README.md").write_text("# a-b")
    assert readme_of(entries[0]) == "# a-b"

    def run(env: str, run_id: str, kind: str = "eval") -> RunInfo:
        return RunInfo(
            kind=kind, path=tmp_path / run_id, run_id=run_id, env=env, model="m", status="finished"
        )

    runs = [run("a", "3", "train"), run("a", "2"), run("b", "1"), run("a", "0")]  # newest first
    assert {env: r.run_id for env, r in latest_evals(runs).items()} == {"a": "2", "b": "1"}


def test_the_screens_never_import_torch_or_http():
    import subprocess
    import sys

    code = (
        "import sys, workbench.tui.app, workbench.tui.screens.environments, "
        "workbench.tui.screens.config_editor, workbench.tui.screens.model_picker, workbench.tui.screens.launch;"
        "heavy = [m for m in ('torch', 'transformers', 'aiohttp') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
