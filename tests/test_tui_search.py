"""Reading one rollout (issue 35): find inside it (`f`, the match highlighted and scrolled to,
`n`/`N` for the next and previous), markdown rendering (`m`), the rollout full screen (`F`), and
scrolling a long conversation from the groups table (`ctrl+d`/`ctrl+u`) without moving the
focus. Pilot tests over a results file of long, markdown-formatted answers."""

from __future__ import annotations

from pathlib import Path

from rich.markdown import Markdown

from tests.tui_data import text_of, wait_for
from workbench.store.results import ResultsWriter
from workbench.tui.app import WorkbenchApp
from workbench.tui.screens.group import GroupScreen
from workbench.tui.screens.rollouts import RolloutsScreen
from workbench.tui.screens.runs import RunsScreen
from workbench.tui.widgets.conversation import ConversationView, MessageBlock, ThinkingFold
from workbench.tui.widgets.find import Highlighted, find_spans
from workbench.tui.widgets.groups_table import GroupsTable
from workbench.tui.widgets.message_blocks import FindableText
from workbench.tui.widgets.rollout_detail import RolloutDetail
from workbench.types import Group, Rollout

SIZE = (100, 30)
FILLER = "Plain words that fill the answer so that it needs scrolling. " * 3


def answer(example_id: int, index: int) -> str:
    """A long markdown answer with "needle" three times: near the top, middle and end."""
    parts = [f"# Answer {example_id}.{index}", "", "First a **bold** claim and `code`, then $x^2 + 1$.", ""]
    for paragraph in range(24):
        parts += [f"Paragraph {paragraph}. {FILLER}", ""]
        if paragraph in (1, 12, 23):
            parts += [f"Here is the NEEDLE number {paragraph}.", ""]
    return "\n".join(parts)


def write_long_results(folder: Path, examples: int = 2, rollouts: int = 2) -> Path:
    writer = ResultsWriter(folder)
    for example_id in range(examples):
        writer.write_group(
            Group(
                example_id,
                [
                    Rollout(
                        example_id,
                        i,
                        prompt=[{"role": "user", "content": f"question {example_id}"}],
                        completion=[{"role": "assistant", "content": answer(example_id, i)}],
                        reward=float(i % 2),
                        rewards={"score": float(i % 2)},
                    )
                    for i in range(rollouts)
                ],
            )
        )
    writer.close()
    return folder / "results.jsonl"


async def open_file(pilot, app: WorkbenchApp, path: Path) -> RolloutsScreen:
    await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
    screen = RolloutsScreen(path)
    app.push_screen(screen)
    await wait_for(pilot, lambda: screen.loaded and screen.rollout is not None)
    return screen


def assistant(view: ConversationView) -> MessageBlock:
    return [block for block in view.query(MessageBlock) if block.border_title == "assistant"][0]


def visible_text(view: ConversationView) -> str:
    """The lines of the conversation's blocks that are inside the view now."""
    top, bottom = view.scrollable_content_region.y, view.scrollable_content_region.bottom
    lines = []
    for block in view.query(MessageBlock):
        for y, line in enumerate(text_of(block).splitlines()):
            if top <= block.region.y + y < bottom:
                lines.append(line)
    return "\n".join(lines)


def test_find_spans_ignore_case_and_do_not_overlap():
    assert find_spans("a Needle, needle; NEEDLE", "needle") == [(2, 8), (10, 16), (18, 24)]
    assert find_spans("aaaa", "aa") == [(0, 2), (2, 4)]
    assert find_spans("anything", "") == []


async def test_find_jumps_to_each_match_and_highlights_it(workspace: Path):
    path = write_long_results(workspace / "run")
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_file(pilot, app, path)
        view = screen.query_one(ConversationView)
        status = screen.query_one(".find-status")
        await wait_for(pilot, lambda: view.max_scroll_y > 20)  # long: it scrolls
        assert not status.display  # no find yet
        await pilot.press("f", *"needle", "enter")
        await wait_for(pilot, lambda: len(view.matches) == 3)
        assert app.focused is view  # n/N are the conversation's keys
        await wait_for(pilot, lambda: "NEEDLE number 1" in visible_text(view))
        assert status.display and "match 1/3" in text_of(status)
        block = assistant(view)
        assert isinstance(block.content, Highlighted) and block.content.current == 0
        await pilot.press("n")
        await wait_for(pilot, lambda: "NEEDLE number 12" in visible_text(view))
        assert "NEEDLE number 1." not in visible_text(view) and "match 2/3" in text_of(status)
        assert block.content.current == 1
        await pilot.press("n")
        await wait_for(pilot, lambda: "NEEDLE number 23" in visible_text(view))
        await pilot.press("n")  # wraps to the first
        await wait_for(pilot, lambda: "NEEDLE number 1." in visible_text(view))
        await pilot.press("N")  # and back to the last
        await wait_for(pilot, lambda: "match 3/3" in text_of(status))
        # another rollout: the find stays on, counted again
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: screen.rollout.rollout_index == 1 and "match 1/3" in text_of(status))
        assert "# Answer 0.1" in text_of(assistant(view))
        # an empty find ends it: no highlight, n is the screen's "next example" again
        await pilot.press("f", "enter")
        await wait_for(pilot, lambda: not status.display)
        assert not isinstance(assistant(view).content, Highlighted)
        await pilot.press("n")
        await wait_for(pilot, lambda: screen.rollout.example_id == 1)


async def test_a_query_not_in_the_rollout_says_so(workspace: Path):
    path = write_long_results(workspace / "run", examples=1)
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_file(pilot, app, path)
        await pilot.press("f", *"haystack", "enter")
        status = screen.query_one(".find-status")
        await wait_for(pilot, lambda: status.display and "not in this rollout" in text_of(status))
        assert screen.query_one(ConversationView).matches == []


async def test_markdown_renders_and_goes_back_to_the_text_as_written(workspace: Path):
    path = write_long_results(workspace / "run", examples=1)
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_file(pilot, app, path)
        view = screen.query_one(ConversationView)
        block = assistant(view)
        await wait_for(pilot, lambda: "# Answer 0.0" in text_of(block))
        assert "**bold**" in text_of(block)
        await pilot.press("m")
        await wait_for(pilot, lambda: isinstance(block.base, Markdown))
        await pilot.pause()
        shown = text_of(block)
        assert "Answer 0.0" in shown and "# Answer" not in shown  # a heading, not a hash
        assert "bold" in shown and "**" not in shown
        assert "$x^2 + 1$" in shown  # math stays as its source text
        # a find in markdown highlights what is drawn
        await pilot.press("f", *"bold", "enter")
        await wait_for(pilot, lambda: len(view.matches) == 1)
        await pilot.press("m")
        await wait_for(pilot, lambda: "**bold**" in text_of(block))
        # the next rollout keeps the choice
        await pilot.press("m", "right_square_bracket")
        await wait_for(pilot, lambda: screen.rollout.rollout_index == 1)
        await wait_for(pilot, lambda: isinstance(assistant(view).base, Markdown))


async def test_full_screen_rollout_and_back(workspace: Path):
    path = write_long_results(workspace / "run")
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_file(pilot, app, path)
        detail = screen.query_one(RolloutDetail)
        view = detail.conversation
        narrow = view.size.width
        await pilot.press("F")
        assert screen.maximized is detail and app.focused is view
        await wait_for(pilot, lambda: view.size.width > narrow + 30)
        assert view.size.height >= SIZE[1] - 8
        await pilot.press("right_square_bracket")  # the screen's keys still work: next rollout
        await wait_for(pilot, lambda: screen.rollout.rollout_index == 1)
        await pilot.press("f", *"needle", "enter")  # and the find bar shows
        await wait_for(pilot, lambda: len(view.matches) == 3)
        await pilot.press("escape")  # gives the screen back, stays on it
        assert screen.maximized is None and app.screen is screen
        await pilot.press("F", "F")  # F toggles too
        assert screen.maximized is None
        await pilot.press("escape")
        assert isinstance(app.screen, RunsScreen)


async def test_the_table_scrolls_the_conversation_without_losing_the_focus(workspace: Path):
    path = write_long_results(workspace / "run")
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_file(pilot, app, path)
        table, view = screen.query_one(GroupsTable), screen.query_one(ConversationView)
        await wait_for(pilot, lambda: view.max_scroll_y > 20)  # laid out
        assert app.focused is table and view.scroll_y == 0
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: view.scroll_y > 5)
        assert app.focused is table
        await pilot.press("ctrl+u")
        await wait_for(pilot, lambda: view.scroll_y == 0)
        await pilot.press("tab")  # one tab: the conversation, where j and space scroll
        assert app.focused is view
        await pilot.press("j", "space")
        await wait_for(pilot, lambda: view.scroll_y > 5)
        await pilot.press("g")
        await wait_for(pilot, lambda: view.scroll_y == 0)


async def test_group_view_reads_a_rollout_the_same_way(workspace: Path):
    path = write_long_results(workspace / "run")
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await open_file(pilot, app, path)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GroupScreen))
        group = app.screen
        assert isinstance(group, GroupScreen)
        await wait_for(pilot, lambda: group.rollout is not None)
        view = group.query_one(ConversationView)
        await pilot.press("tab")
        assert app.focused is view
        await pilot.press("tab")  # and back to the table
        assert app.focused is group.query_one("#group-table")
        await pilot.press("f", *"needle", "enter")
        await wait_for(pilot, lambda: len(view.matches) == 3)
        await pilot.press("F")
        assert group.maximized is group.query_one(RolloutDetail)
        await pilot.press("escape", "escape")
        assert app.screen is not group


async def test_a_match_in_folded_thinking_opens_the_fold(workspace: Path):
    writer = ResultsWriter(workspace / "run")
    thinking = " ".join(["first I think about words"] * 30 + ["then the needle appears"])
    writer.write_group(
        Group(
            0,
            [
                Rollout(
                    0,
                    0,
                    prompt=[{"role": "user", "content": "question"}],
                    completion=[
                        {"role": "assistant", "content": "the answer", "reasoning_content": thinking}
                    ],
                    reward=1.0,
                )
            ],
        )
    )
    writer.close()
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_file(pilot, app, workspace / "run" / "results.jsonl")
        view = screen.query_one(ConversationView)
        fold = screen.query_one(ThinkingFold)
        await wait_for(pilot, lambda: fold.collapsed)
        await pilot.press("f", *"needle", "enter")
        await wait_for(pilot, lambda: len(view.matches) == 1 and not fold.collapsed)
        text = fold.query_one(FindableText)
        await wait_for(pilot, lambda: "needle" in text_of(text))
        assert isinstance(text.content, Highlighted) and text.content.current == 0
