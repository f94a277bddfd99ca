"""Moving the Rollouts cursor one row stays a cheap frame (issue 16) without drawing anything
differently: a conversation of the same shape is shown in the blocks already there, and the
screen is laid out again only when a block's height changes; the objects alive while a run is
open are kept out of the collector's full passes, and given back when the screen closes.
How fast a frame is belongs to benchmarks/tui_open_run.py; these tests check behaviour only."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import Static

from tests.tui_data import shared_workspace, text_of, wait_for
from workbench.tui.app import WorkbenchApp
from workbench.tui.screens.rollouts import RolloutsScreen
from workbench.tui.widgets.conversation import (
    ConversationView,
    MessageBlock,
    RewardBreakdown,
    content_text,
    update_static,
)
from workbench.tui.widgets.groups_table import GroupsTable
from workbench.tui.widgets.runs_table import RunsTable

SIZE = (80, 24)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    with shared_workspace(tmp_path_factory.mktemp("frames") / "ws") as runs:
        yield runs


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


class OneStatic(App):
    def compose(self) -> ComposeResult:
        yield Static(Text("one\ntwo"))


def shown(widget: Static) -> str:
    return "\n".join(line.rstrip() for line in text_of(widget).splitlines())


def fits(widget: Static) -> bool:
    """The widget is as tall as its content at its width: no line cut off, none left over."""
    region = widget.content_region
    return region.height == widget.get_content_height(widget.container_size, widget.app.size, region.width)


def spy_layouts(widget: Static) -> list[bool]:
    """The `layout` argument of every `refresh` of `widget` from now on."""
    calls: list[bool] = []
    refresh = widget.refresh

    def spy(*regions, **kwargs):
        calls.append(bool(kwargs.get("layout", False)))
        return refresh(*regions, **kwargs)

    widget.refresh = spy
    return calls


async def test_update_static_lays_out_only_when_the_height_changes():
    app = OneStatic()
    async with app.run_test(size=(40, 10)) as pilot:
        static = app.query_one(Static)
        calls = spy_layouts(static)

        update_static(static, Text("uno\ndos"))  # same height: repainted, not laid out
        await pilot.pause()
        assert calls and not any(calls) and shown(static) == "uno\ndos"

        calls.clear()
        update_static(static, Text("uno\ndos"))  # the same text: nothing to do
        assert calls == []

        update_static(static, Text("x" * 60))  # one line wrapped to two at width 40: same height
        await pilot.pause()
        assert not any(calls) and static.size.height == 2 and shown(static) == "x" * 40 + "\n" + "x" * 20

        update_static(static, Text("a\nb\nc"))  # taller: laid out, all of it shown
        await pilot.pause()
        assert any(calls) and static.size.height == 3 and shown(static) == "a\nb\nc"

        calls.clear()
        update_static(static, Text("a\nb\nc", style="bold"))  # the same characters drawn otherwise
        await pilot.pause()
        assert calls and not any(calls) and list(static.render_line(0))[0].style.bold


async def test_stepping_through_rollouts_draws_what_composing_them_anew_draws(ws):
    """Every group of a run with errors (a taller breakdown) and answers of different lengths:
    each block holds its message whole, and the view matches a freshly composed one."""
    app = WorkbenchApp(ws["root"], poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_rollouts(pilot, app, ws["varied"])
        table = screen.query_one(GroupsTable)
        view = screen.query_one(ConversationView)
        breakdown = screen.query_one(RewardBreakdown)
        previous, reused = list(view.query(MessageBlock)), 0
        for row in range(table.row_count):
            if row:
                await pilot.press("j")
            await wait_for(
                pilot,
                lambda: (
                    view.rollout is screen.rollout and screen.rollout.example_id == table.current.example_id
                ),
            )
            await pilot.pause()
            rollout = screen.rollout
            blocks = list(view.query(MessageBlock))
            messages = [*rollout.prompt, *rollout.completion]
            if len(blocks) == len(previous) and rollout.completion:  # the same shape: the same blocks
                assert all(b is p for b, p in zip(blocks, previous, strict=True))
                reused += 1
            assert [content_text(m.get("content")) for m in messages] == [b.content.plain for b in blocks]
            assert all(fits(widget) for widget in (*blocks, breakdown))
            drawn = text_of(view), text_of(breakdown)
            await view.recompose()
            await pilot.pause()
            assert (text_of(view), text_of(breakdown)) == drawn
            previous = list(view.query(MessageBlock))
        assert reused


@pytest.mark.parametrize("start_up_froze", [False, True])
async def test_an_open_run_is_kept_out_of_full_collections_until_its_screen_closes(ws, start_up_froze: bool):
    """While a Rollouts screen is open its objects are frozen; closing it releases them, and a
    freeze made before it opened (start-up's) is still in force afterwards."""
    gc.unfreeze()  # this worker's own freezes (conftest) aside: the test decides what was frozen
    if start_up_froze:
        gc.freeze()
    frozen_before = gc.get_freeze_count()
    app = WorkbenchApp(ws["root"], poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_rollouts(pilot, app, ws["varied"])
        assert gc.get_freeze_count() > frozen_before
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is not screen)
        await wait_for(pilot, lambda: not screen.is_attached)
        assert (gc.get_freeze_count() > 0) == start_up_froze
        frozen_between = gc.get_freeze_count()
        await open_rollouts(pilot, app, ws["varied"])  # open when the app exits: released too
        assert gc.get_freeze_count() > frozen_between
    assert (gc.get_freeze_count() > 0) == start_up_froze
