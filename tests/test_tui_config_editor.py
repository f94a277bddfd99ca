"""The config editor (issue 35): ctrl+o on Runs opens any TOML under configs/ in a TextArea with TOML
highlighting; the text is checked as it is typed — its TOML syntax at once, then the config's real
dry run in a child (`workbench train CONFIG --dry-run`) — with the verdict, the plan and each
problem at its line; ctrl+s saves, ctrl+l starts the config, escape asks before losing edits."""

from __future__ import annotations

import shutil
from pathlib import Path

from textual.widgets import OptionList

from tests.tui_data import text_of, wait_for
from workbench.tui.app import WorkbenchApp
from workbench.tui.data.configs import config_files, read_dry_run, run_spec, syntax_problem
from workbench.tui.launcher import Launch, Launcher, LaunchSpec
from workbench.tui.screens.config_editor import ConfigEditorScreen, ConfigTextArea
from workbench.tui.screens.runs import RunsScreen

REPO = Path(__file__).resolve().parents[1]
SIZE = (140, 40)


class RecordingLauncher(Launcher):
    """Records what would be launched instead of starting it (a real child would train a model)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.started: list[LaunchSpec] = []

    def start(self, spec: LaunchSpec) -> Launch:
        self.started.append(spec)
        log = str(self.folder / "fake.log")
        return Launch("fake", spec.kind, spec.args, spec.env, spec.model, 0, log, "2026-01-02T03:04:05+00:00")


def configs_workspace(root: Path) -> Path:
    """The repo's reverse-text configs (RL and eval) and an endpoints file, in `root`."""
    for folder in ("rl", "eval"):
        (root / "configs" / folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "configs" / folder / "reverse-text.toml", root / "configs" / folder)
    (root / "configs" / "endpoints.toml").write_text(
        '[[endpoint]]\nendpoint_id = "local"\nmodel = "tiny"\nurl = "http://127.0.0.1:8000/v1"\n'
    )
    return root / "configs" / "rl" / "reverse-text.toml"


def checked(screen: ConfigEditorScreen) -> bool:
    return screen.result is not None and not screen.checking


async def open_rl_config(pilot, app: WorkbenchApp) -> ConfigEditorScreen:
    """ctrl+o on Runs, then the RL config picked in the file list, checked."""
    await pilot.press("ctrl+o")
    screen = app.screen
    assert isinstance(screen, ConfigEditorScreen)
    files = screen.query_one("#editor-files", OptionList)
    assert [str(files.get_option_at_index(i).prompt) for i in range(files.option_count)] == [
        "endpoints.toml",
        "eval/reverse-text.toml",
        "rl/reverse-text.toml",
    ]
    assert screen.path is not None and screen.path.name == "reverse-text.toml"  # the first a command runs
    await pilot.press("ctrl+o")  # the file list
    files.highlighted = 2
    await pilot.press("enter")
    await wait_for(pilot, lambda: screen.path == app.root / "configs" / "rl" / "reverse-text.toml")
    assert screen.focused is screen.query_one(ConfigTextArea)
    await wait_for(pilot, lambda: checked(screen))
    return screen


async def test_a_config_is_checked_by_its_dry_run_and_problems_point_at_their_line(workspace: Path):
    config = configs_workspace(workspace)
    original = config.read_text()
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_rl_config(pilot, app)
        area = screen.query_one(ConfigTextArea)
        assert area.language == "toml" and area.text == original
        assert screen.result is not None and screen.result.verdict == "valid"
        plan = screen.query_one("#check-plan")  # laid out to the plan's height on a later refresh
        await wait_for(pilot, lambda: "max_steps  60" in text_of(plan))
        assert "valid: a real run can start" in text_of(screen.query_one("#check-verdict"))
        # a typo, typed after `max_steps = 60` (line 4): the dry run names it, at line 5
        assert area.document.get_line(3).startswith("max_steps = 60")
        area.move_cursor((4, 0))
        await pilot.press(*"max_stepz = 3", "enter")
        await wait_for(pilot, lambda: "modified" in text_of(screen.query_one("#editor-title")))
        await wait_for(pilot, lambda: checked(screen) and screen.result.verdict == "invalid")
        assert [(p.line, p.message) for p in screen.problems] == [
            (5, "unknown key 'max_stepz' (did you mean 'max_steps'?)")
        ]
        assert area.error_lines == {4}
        await wait_for(pilot, lambda: "line 5:" in text_of(screen.query_one("#check-problems")))
        # every check file is removed once its dry run ends (a superseded one is killed first)
        await wait_for(pilot, lambda: not [p for p in config.parent.iterdir() if p.name.startswith(".")])
        assert config.read_text() == original  # checking never saves
        area.move_cursor((0, 0))
        await pilot.press("ctrl+g")
        assert area.cursor_location == (4, 0)
        # broken TOML: said at once, at its line, without a dry run
        await pilot.press("end", *" = =")
        await wait_for(
            pilot, lambda: screen.problems and screen.problems[0].message.startswith("invalid TOML")
        )
        assert screen.problems[0].line == 5 and screen.result is None and not screen.checking
        await wait_for(pilot, lambda: "invalid TOML" in text_of(screen.query_one("#check-verdict")))
        # undone: valid again, no marks
        area.load_text(original)
        await wait_for(pilot, lambda: checked(screen) and screen.result.verdict == "valid")
        assert not screen.problems and area.error_lines == set() and not screen.edited


async def test_save_launch_and_escape_with_edits(workspace: Path):
    config = configs_workspace(workspace)
    launcher = RecordingLauncher(workspace)
    app = WorkbenchApp(workspace, launcher=launcher, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_rl_config(pilot, app)
        area = screen.query_one(ConfigTextArea)
        area.move_cursor((3, len("max_steps = ")))
        await pilot.press("delete", "delete", *"20")  # max_steps = 20
        # escape with edits asks; n keeps editing
        await pilot.press("escape")
        assert type(app.screen).__name__ == "ConfirmScreen"
        await pilot.press("n")
        assert app.screen is screen and screen.edited
        # ctrl+s saves (atomically: no temporary file left)
        await pilot.press("ctrl+s")
        assert "max_steps = 20" in config.read_text() and not screen.edited
        assert "modified" not in text_of(screen.query_one("#editor-title"))
        assert not list(config.parent.glob("*.saving"))
        # ctrl+l: asks, then starts the config as its first line says
        await pilot.press("ctrl+l")
        assert "Start `workbench train configs/rl/reverse-text.toml`?" in text_of(
            app.screen.query_one("#confirm-question")
        )
        await pilot.press("y")
        assert [spec.args for spec in launcher.started] == [["train", "configs/rl/reverse-text.toml"]]
        assert isinstance(app.screen, RunsScreen)  # the editor closed with the launch
        # edits, then escape: asked, and y discards them (the file keeps what was saved)
        await pilot.press("ctrl+o")
        editor = app.screen
        assert isinstance(editor, ConfigEditorScreen)
        editor.query_one(ConfigTextArea).insert("# a note\n", (0, 0))
        await pilot.press("escape", "y")
        assert isinstance(app.screen, RunsScreen)
        assert "# a note" not in config.read_text()


async def test_toml_no_command_runs_is_checked_for_syntax_only(workspace: Path):
    configs_workspace(workspace)
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.open_screen("config_editor", workspace / "configs" / "endpoints.toml")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ConfigEditorScreen)
        await wait_for(pilot, lambda: checked(screen))
        assert screen.result is not None and screen.result.verdict == "unsupported"
        await pilot.press("ctrl+l")  # nothing to start
        assert app.screen is screen


def test_check_helpers(tmp_path: Path):
    assert syntax_problem('a = 1\nb = "x\n') is not None
    assert syntax_problem('a = 1\nb = "x\n').line == 2  # type: ignore[union-attr]
    assert syntax_problem("a = 1\n") is None
    (tmp_path / "configs" / "rl").mkdir(parents=True)
    (tmp_path / "configs" / "rl" / "a.toml").write_text('model = "tiny"\n')
    (tmp_path / "configs" / "rl" / ".a.1.check.toml").write_text("")
    (tmp_path / "configs" / "other").mkdir()
    (tmp_path / "configs" / "other" / "b.toml").write_text("x = 1\n")
    assert [p.name for p in config_files(tmp_path)] == ["b.toml", "a.toml"]
    assert run_spec(tmp_path / "configs" / "other" / "b.toml", tmp_path) is None
    spec = run_spec(tmp_path / "configs" / "rl" / "a.toml", tmp_path)
    assert spec is not None and spec.args == ["train", "configs/rl/a.toml"]
    said = read_dry_run(
        "Run\n  model    x\nerror: configs/rl/.a.1.check.toml: a real run cannot start: no model x\n",
        1,
        "configs/rl/.a.1.check.toml",
        "configs/rl/a.toml",
    )
    assert said.verdict == "cannot-start" and said.problems[0].message.startswith("a real run cannot start")
    assert said.plan == "Run\n  model    x"
    no_flag = read_dry_run("Usage: ...\nNo such option: --dry-run\n", 2, "x.check.toml", "x.toml")
    assert no_flag.verdict == "unsupported"
