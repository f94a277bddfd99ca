"""Launcher fixes of issue 35: a model field's picker (models, training runs and their checkpoints,
endpoints), escape on an edited form asks before discarding it, the GEPA form's optimizer choice,
and f4: the highlighted config in the config editor."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import OptionList, Select

from tests.test_tui_config_editor import RecordingLauncher, configs_workspace
from tests.tui_data import make_train_run, text_of, wait_for
from workbench.tui.app import WorkbenchApp
from workbench.tui.data.models import model_choices
from workbench.tui.screens.config_editor import ConfigEditorScreen
from workbench.tui.screens.launch import LaunchScreen, optimizer_choices
from workbench.tui.screens.model_picker import ModelPickerScreen
from workbench.tui.screens.runs import RunsScreen

SIZE = (120, 36)
RUN = "reverse-words--tiny--20260102-030405-abcd"
ENDPOINTS = """[[endpoint]]
endpoint_id = "qwen"
model = "Qwen/Qwen3-4B"
url = "http://user:s3cret@127.0.0.1:8000/v1"
[[endpoint]]
endpoint_id = "qwen"
model = "Qwen/Qwen3-4B"
url = "http://127.0.0.1:8001/v1"
"""


def picker_workspace(root: Path) -> None:
    make_train_run(root, RUN, status="finished", pid=0)  # checkpoints at steps 3 and 6
    (root / "configs").mkdir(exist_ok=True)
    (root / "configs" / "endpoints.toml").write_text(ENDPOINTS)


async def open_launch(pilot, app: WorkbenchApp, tab: str = "ctrl+e") -> LaunchScreen:
    await pilot.press("l", tab)
    screen = app.screen
    assert isinstance(screen, LaunchScreen)
    return screen


def test_model_choices(workspace: Path):
    from workbench.tui.data.runs import RunCatalog

    picker_workspace(workspace)
    choices, notes = model_choices(workspace, RunCatalog(workspace).scan())
    assert notes == []
    assert [(c.value, c.group) for c in choices] == [
        ("tiny", "models"),
        ("outputs/runs/latest", "runs"),
        (f"outputs/runs/{RUN}", "runs"),
        (f"outputs/runs/{RUN}/checkpoints/step_000006", "checkpoints"),
        (f"outputs/runs/{RUN}/checkpoints/step_000003", "checkpoints"),
        ("qwen", "endpoints"),
    ]
    assert "step 6" in choices[2].detail and "reward" in choices[3].detail
    assert choices[-1].detail == "Qwen/Qwen3-4B at http://127.0.0.1:8000/v1 (+1 replicas)"  # no password
    (workspace / "configs" / "endpoints.toml").write_text("[[endpoint]\n")
    choices, notes = model_choices(workspace, [])
    assert [c.value for c in choices] == ["tiny"] and "cannot be read" in notes[0]


async def test_the_model_picker_fills_the_focused_model_field(workspace: Path):
    picker_workspace(workspace)
    app = WorkbenchApp(workspace, launcher=RecordingLauncher(workspace), poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_launch(pilot, app)
        await pilot.press("ctrl+l")
        picker = app.screen
        assert isinstance(picker, ModelPickerScreen)
        await wait_for(pilot, lambda: picker.loaded)
        options = picker.query_one(OptionList)
        assert options.highlighted is not None
        assert options.get_option_at_index(options.highlighted).id == "tiny"  # the field's value
        await pilot.press(*"000003")  # the filter: words anywhere in the value or its details
        assert [c.value for c in picker.shown] == [f"outputs/runs/{RUN}/checkpoints/step_000003"]
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is screen)
        assert screen.query_one("#eval-model").value == f"outputs/runs/{RUN}/checkpoints/step_000003"
        assert f"-m outputs/runs/{RUN}/checkpoints/step_000003" in text_of(
            screen.query_one("#launch-preview")
        )
        # the GEPA form's reflection field, by its ▾ button; escape leaves the field as it was
        await pilot.press("ctrl+g")
        await pilot.click("#gepa-reflection-pick")
        picker = app.screen
        assert isinstance(picker, ModelPickerScreen)
        await wait_for(pilot, lambda: picker.loaded)
        await pilot.press(*"qwen", "down", "up", "enter")
        await wait_for(pilot, lambda: screen.query_one("#gepa-reflection").value == "qwen")
        await pilot.press("ctrl+l")  # the focused field (reflection) again
        assert isinstance(app.screen, ModelPickerScreen)
        await pilot.press("escape")
        assert app.screen is screen and screen.query_one("#gepa-reflection").value == "qwen"


async def test_escape_asks_before_discarding_an_edited_form(workspace: Path):
    app = WorkbenchApp(workspace, launcher=RecordingLauncher(workspace), poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await open_launch(pilot, app)
        await pilot.press("escape")  # nothing edited: back at once
        assert isinstance(app.screen, RunsScreen)
        screen = await open_launch(pilot, app)
        screen.query_one("#eval-n").value = "64"
        await pilot.press("escape")
        assert type(app.screen).__name__ == "ConfirmScreen"
        assert "Discard your edits" in text_of(app.screen.query_one("#confirm-question"))
        await pilot.press("n")
        assert app.screen is screen and screen.query_one("#eval-n").value == "64"
        await pilot.press("escape", "y")
        assert isinstance(app.screen, RunsScreen)


async def test_the_gepa_form_chooses_its_optimizer(workspace: Path):
    launcher = RecordingLauncher(workspace)
    app = WorkbenchApp(workspace, launcher=launcher, poll_s=0.2)
    assert [value for _, value in optimizer_choices()] == ["gepa", "miprov2", "bootstrap"]
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_launch(pilot, app, "ctrl+g")
        preview = screen.query_one("#launch-preview")
        assert "--optimizer" not in text_of(preview)  # gepa: the CLI's default
        screen.query_one("#gepa-optimizer", Select).value = "bootstrap"
        await pilot.pause()
        assert "--optimizer bootstrap" in text_of(preview)
        await pilot.press("ctrl+s", "ctrl+s")
        assert launcher.started[0].args[:3] == ["gepa", "run", "reverse-text"]
        args = launcher.started[0].args
        assert args[args.index("--optimizer") + 1] == "bootstrap"


async def test_f4_opens_the_highlighted_config_in_the_editor(workspace: Path):
    config = configs_workspace(workspace)
    app = WorkbenchApp(workspace, launcher=RecordingLauncher(workspace), poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_launch(pilot, app, "ctrl+t")  # the Train tab: its chosen config
        await pilot.press("f4")
        editor = app.screen
        assert isinstance(editor, ConfigEditorScreen) and editor.path == config
        await pilot.press("escape")
        assert app.screen is screen
        await pilot.press("ctrl+o")  # the Configs tab: the highlighted one (eval first)
        await pilot.press("f4")
        editor = app.screen
        assert isinstance(editor, ConfigEditorScreen)
        assert editor.path == workspace / "configs" / "eval" / "reverse-text.toml"


async def test_the_eval_form_can_open_on_an_environment(workspace: Path):
    app = WorkbenchApp(workspace, launcher=RecordingLauncher(workspace), poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.open_screen("launch", tab="eval", env="wordle")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, LaunchScreen) and screen.query_one("#eval-env", Select).value == "wordle"
        assert screen.query_one("#gepa-env", Select).value == "wordle"
        assert screen.focused is not None and screen.focused.id == "eval-model"
