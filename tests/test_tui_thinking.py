"""The TUI shows a thinking model's thinking folded under each assistant turn (Pilot, 80x24),
over an eval run written by `run_eval` with a client that returns `reasoning_content`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.tui_data import make_eval, text_of, wait_for
from workbench.inference.echo import EchoClient
from workbench.tui.app import WorkbenchApp
from workbench.tui.screens.rollouts import RolloutsScreen
from workbench.tui.widgets.conversation import ConversationView, MessageBlock, ThinkingFold, ThinkingTurn
from workbench.tui.widgets.runs_table import RunsTable
from workbench.types import Completion, Messages, SamplingParams

THINKING = "the phrase reversed, letter by letter, is what they want"


class ThinkingClient(EchoClient):
    """Answers like a reasoning-parsed thinking model: the thinking apart, then the answer."""

    async def chat(
        self, messages: Messages, *, sampling: SamplingParams, tools: list[dict[str, Any]] | None = None
    ) -> list[Completion]:
        user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        message = {
            "role": "assistant",
            "content": f"<reversed_text>{user[::-1]}</reversed_text>",
            "reasoning_content": THINKING,
        }
        return [Completion(message=message, finish_reason="stop", prompt_tokens=10, completion_tokens=20)]


@pytest.fixture
def run(workspace: Path) -> Path:
    return make_eval("reverse-words", ThinkingClient(), 2, 1, "20260102-030405-7777")


async def test_thinking_is_folded_under_the_turn_and_opens(workspace: Path, run: Path) -> None:
    app = WorkbenchApp(workspace, poll_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: [r.path for r in table.runs] == [run])
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RolloutsScreen))
        screen = app.screen
        assert isinstance(screen, RolloutsScreen)
        await wait_for(pilot, lambda: screen.loaded and screen.rollout is not None)
        view = screen.query_one(ConversationView)
        await wait_for(pilot, lambda: view.query(ThinkingTurn))
        [turn] = view.query(ThinkingTurn)
        fold = turn.query_one(ThinkingFold)
        assert turn.border_title == "assistant" and [b.border_title for b in view.query(MessageBlock)] == [
            "system",
            "user",
        ]
        title, thinking, answer = (
            fold.query_one("CollapsibleTitle"),
            fold.query_one(".thinking-text"),
            turn.query_one(".answer"),
        )
        # folded: one dim line with its size, the answer below it, the thinking itself hidden
        assert fold.collapsed and fold.size.height == 1 and thinking.size.height == 0
        assert text_of(title).strip() == "▸ thinking (10 words)"
        assert "<reversed_text>" in text_of(answer) and answer.region.y == fold.region.y + 1
        # h (with the conversation focused) opens every fold; h again folds them
        view.focus()
        await pilot.press("h")
        await wait_for(pilot, lambda: not fold.collapsed and thinking.size.height > 0)
        assert "letter by letter" in text_of(thinking) and text_of(title).strip().startswith("▾ thinking")
        assert answer.region.y > thinking.region.y
        await pilot.press("h")
        await wait_for(pilot, lambda: fold.collapsed and fold.size.height == 1)
        # a click on the line opens it too
        await pilot.click(fold.query_one("CollapsibleTitle"))
        await wait_for(pilot, lambda: not fold.collapsed)
        # the next rollout starts folded again
        await pilot.press("n")
        await wait_for(pilot, lambda: screen.rollout.example_id == 1 and view.query(ThinkingFold))
        assert all(f.collapsed for f in view.query(ThinkingFold))
