"""Rollouts: the groups of a rollouts file (eval results, or one training step's samples) with
mean and std of reward, the run's reward distribution and pass@k (`RewardPanel`, `d`), and the
selected rollout's full conversation and reward breakdown (`RolloutDetail`: find in it with `f`,
markdown with `m`, full screen with `F`). Enter on a group opens the Group view (all its rollouts
in one table); `#` jumps to an example. Filters combine (a group must pass all of them); when
they leave no group, the table says which are on and how to turn them off.

Opening is lazy (`RolloutIndex`): only byte offsets and light rollouts are read up front, the
conversation of one rollout is read when it is shown. Filters and search run in a thread.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.timer import Timer
from textual.widgets import Footer, Static

from workbench.store.files import read_json
from workbench.tui.data.gc_hold import hold_gc_freeze, release_gc_freeze
from workbench.tui.data.reward_stats import PASS_THRESHOLD, reward_stats, run_pass_threshold
from workbench.tui.data.rollout_index import GroupRow, RolloutFilter, RolloutIndex, parse_reward_range
from workbench.tui.data.runs import RunInfo, run_from_metadata
from workbench.tui.data.training import step_rollout_files
from workbench.tui.screens.base import WorkbenchScreen
from workbench.tui.widgets.format import num
from workbench.tui.widgets.groups_table import GroupsTable
from workbench.tui.widgets.prompt_bar import PromptBar
from workbench.tui.widgets.reward_panel import RewardPanel
from workbench.tui.widgets.rollout_detail import DetailActions, RolloutDetail
from workbench.types import Rollout

# While the cursor runs down the groups (a held key repeats every ~30 ms), the conversation is
# drawn once the keys pause this long: laying out a conversation is what makes a frame slow,
# the table line alone is cheap. A single move draws at once.
SETTLE_S = 0.06


class RolloutsScreen(DetailActions, WorkbenchScreen):
    BINDINGS = [
        Binding("right_square_bracket", "rollout(1)", "Next rollout"),
        Binding("left_square_bracket", "rollout(-1)", "Prev rollout"),
        Binding("n", "example(1)", "Next example", show=False),
        Binding("p", "example(-1)", "Prev example", show=False),
        Binding("e", "toggle_filter('errors')", "Errors", show=False),
        Binding("t", "toggle_filter('truncated')", "Truncated", show=False),
        Binding("z", "toggle_filter('zero_variance')", "Zero variance", show=False),
        Binding("r", "reward_range", "Reward range", show=False),
        Binding("slash", "search", "Search"),
        Binding("number_sign", "jump", "Jump to example"),
        Binding("a", "clear_filters", "Clear filters", show=False),
        Binding("y", "copy", "Copy JSON"),
        Binding("v", "variance", "Variance"),
        Binding("d", "reward_panel", "Reward panel", show=False),
        Binding("full_stop", "step(1)", "Next step", show=False),
        Binding("comma", "step(-1)", "Prev step", show=False),
    ]

    def __init__(
        self,
        path: Path,
        *,
        run: RunInfo | None = None,
        label: str = "results",
        focus_example: int | None = None,
    ) -> None:
        super().__init__()
        self.path = path
        self.run = run
        self.label = label
        self.focus_example = focus_example
        self.index = RolloutIndex(path)
        self.filter = RolloutFilter()
        self.group: GroupRow | None = None
        self.position = 0  # rollout shown within the group
        self.rollout: Rollout | None = None
        self.loaded = False  # set once the first view is on screen (tests, benchmark)
        self._lock = asyncio.Lock()
        self._shown = 0
        self._live: Timer | None = None
        self._moved_at = 0.0  # when the cursor last moved to another group (time.monotonic)
        self._settle: Timer | None = None
        self._gc_frozen = False  # holds a `hold_gc_freeze` (released on unmount)
        self._pass_threshold = PASS_THRESHOLD  # a correct rollout's least reward (pass@k)

    def compose(self) -> ComposeResult:
        yield Static(id="rollouts-title", classes="screen-title")
        with Horizontal(id="rollouts-body"):
            with Vertical(id="rollouts-left"):
                yield GroupsTable(id="groups")
                yield RewardPanel(id="reward-panel")
            yield RolloutDetail(id="rollout-detail", breakdown_id="breakdown", conversation_id="conversation")
        yield PromptBar(id="rollouts-prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(GroupsTable).focus()
        self.query_one(RewardPanel).fit(self.app.size.height)
        self._update_title()
        self.reload(first=True)
        if self.run is not None and self.run.is_live:
            self._live = self.set_interval(max(self.wb.poll_s, 1.0), self.follow)

    def on_unmount(self) -> None:
        if self._gc_frozen:
            self._gc_frozen = False
            release_gc_freeze()

    # ----- loading -----------------------------------------------------------------------
    def follow(self) -> None:
        """A live run: pick up new groups and the run's status (until it ends)."""
        if not self.is_current or self.run is None:
            return
        try:
            self.run = run_from_metadata(
                self.run.path, read_json(self.run.path / "metadata.json"), self.run.kind
            )
        except (OSError, ValueError):
            pass
        if not self.run.is_live and self._live is not None:
            self._live.stop()
        self._update_title()
        self.reload()

    @work(group="rollouts")
    async def reload(self, first: bool = False) -> None:
        """Read appended lines (all of them the first time) and re-apply the filter."""
        async with self._lock:
            changed = await asyncio.to_thread(self.index.refresh)
            if not (changed or first):
                return
            groups = await asyncio.to_thread(self.index.filtered, self.filter)
        self._show_groups(groups, self.focus_example if first else None)
        if first:
            self.loaded = True
            if not self._gc_frozen and not self.closing:
                self._gc_frozen = True
                hold_gc_freeze()
        # the reward panel after the groups: opening a big run shows its groups first
        async with self._lock:
            if first:  # the environment's pass threshold, as the eval's summary recorded it
                self._pass_threshold = await asyncio.to_thread(run_pass_threshold, self.path)
            stats = await asyncio.to_thread(reward_stats, self.index, self._pass_threshold)
        if not self.closing:
            self.query_one(RewardPanel).show(stats)

    @work(group="rollouts")
    async def apply_filter(self) -> None:
        async with self._lock:
            groups = await asyncio.to_thread(self.index.filtered, self.filter)
        self._show_groups(groups, None)
        if not groups and self.filter.active:
            self.notify(
                f"no group passes {self.filter.describe()} (a clears the filters)", severity="warning"
            )

    def _show_groups(self, groups: list[GroupRow], select: int | None) -> None:
        if self.closing:
            return
        table = self.query_one(GroupsTable)
        self._shown = len(groups)
        if self.filter.active and self.index.groups():
            table.empty = self.filter.explain_empty()
        else:
            table.empty = (
                "no groups yet: the run has not finished one"
                if self.run and self.run.is_live
                else "no groups in this file"
            )
        table.show(groups, select)
        if not groups:
            self.group, self.rollout = None, None
            self.detail.breakdown.show(None)
            self.detail.conversation.rollout = None
        self._update_title()

    def _update_title(self) -> None:
        groups = self.index.groups()
        run = self.run
        head = (
            f"[b]Rollouts[/b] · {run.kind} · {run.env} · {run.model_label} · {run.status}"
            if run
            else "[b]Rollouts[/b]"
        )
        body = f"{self.label}: {len(groups)} groups · {len(self.index)} rollouts · mean {num(self.index.reward_mean)}"
        shown = f" · showing {self._shown}" if self.filter.active else ""
        filters = "filters (all must hold)" if len(self.filter.parts()) > 1 else "filter"
        self.query_one("#rollouts-title", Static).update(
            f"{head}\n{body} · {filters}: {self.filter.describe()}{shown}"
        )

    # ----- showing one rollout --------------------------------------------------------------
    @on(GroupsTable.Highlighted)
    def _group_highlighted(self, event: GroupsTable.Highlighted) -> None:
        same = self.group is not None and self.group.example_id == event.group.example_id
        self.group = event.group
        if not same:
            self.position = 0
        self.position = min(self.position, event.group.size - 1)
        if not same or self.rollout is None:
            self._show_rollout(moving=True)

    @on(GroupsTable.Chosen)
    def _group_chosen(self, event: GroupsTable.Chosen) -> None:
        """Open the Group view; the rollout chosen there is shown here, its conversation focused."""
        group = event.group

        def chosen(rollout_index: object) -> None:
            if (
                not isinstance(rollout_index, int)
                or self.group is None
                or self.group.example_id != group.example_id
            ):
                return
            indices = [self.index.rollout_index_at(self.group, i) for i in range(self.group.size)]
            self.position = indices.index(rollout_index) if rollout_index in indices else 0
            self._show_rollout()
            self.detail.conversation.focus()

        title = (
            f"{self.run.kind} · {self.run.env} · {self.run.model_label} · {self.label}"
            if self.run
            else self.label
        )
        self.open("group", self.index, group.example_id, title=title, position=self.position, callback=chosen)

    def _show_rollout(self, moving: bool = False) -> None:
        """Show the group's rollout at `position`; `moving` (the cursor just moved to this group):
        when it had moved a moment before too, draw once the keys pause (SETTLE_S)."""
        group = self.group
        if group is None or not group.size:
            return
        self.rollout = self.index.load(group.example_id, self.index.rollout_index_at(group, self.position))
        if self._settle is not None:
            self._settle.stop()
            self._settle = None
        now = time.monotonic()
        rapid = moving and now - self._moved_at < SETTLE_S
        if moving:
            self._moved_at = now
        if rapid:
            self._settle = self.set_timer(SETTLE_S, self._draw_rollout)
        else:
            self._draw_rollout()

    def _draw_rollout(self) -> None:
        self._settle = None
        if self.rollout is not None and self.group is not None and not self.closing:
            self.detail.breakdown.show(self.rollout, self.group.size)
            self.detail.conversation.rollout = self.rollout

    def action_rollout(self, step: int) -> None:
        if self.group is None:
            return
        self.position = (self.position + step) % self.group.size
        self._show_rollout()

    def action_example(self, step: int) -> None:
        table = self.query_one(GroupsTable)
        if table.row_count:
            table.move_cursor(row=max(0, min(table.row_count - 1, table.cursor_row + step)), animate=False)

    def select_example(self, example_id: int) -> None:
        """Show `example_id` (clearing filters that hide it)."""
        if self.index.group(example_id) is None:
            self.notify(f"example {example_id} is not in {self.label}", severity="warning")
            return
        if not self.query_one(GroupsTable).select_example(example_id):
            self.filter = RolloutFilter()
            self.focus_example = example_id
            self.reload(first=True)

    # ----- filters ---------------------------------------------------------------------------
    def action_toggle_filter(self, name: str) -> None:  # not `toggle`: DOMNode has its own action_toggle
        flipped: dict[str, Any] = {name: not getattr(self.filter, name)}
        self.filter = replace(self.filter, **flipped)
        self.apply_filter()

    def action_clear_filters(self) -> None:
        self.filter = RolloutFilter()
        self.apply_filter()

    def action_jump(self) -> None:
        self.query_one(PromptBar).ask("jump", "example id (Enter to jump)")

    def action_search(self) -> None:
        self.query_one(PromptBar).ask(
            "search", "text in prompts, completions, answers, errors (Enter to apply)", self.filter.search
        )

    def action_reward_range(self) -> None:
        low, high = self.filter.reward_min, self.filter.reward_max
        current = "" if low is None and high is None else f"{_bound(low)}..{_bound(high)}"
        self.query_one(PromptBar).ask(
            "range", "group mean reward range, e.g. 0.2..0.8 or 0.5.. (empty clears)", current
        )

    @on(PromptBar.Answered)
    def _answered(self, event: PromptBar.Answered) -> None:
        if event.purpose == "jump":
            try:
                self.select_example(int(event.value.strip()))
            except ValueError:
                self.notify(f"example id: not a number: {event.value.strip()!r}", severity="error")
            return
        if event.purpose == "search":
            self.filter = replace(self.filter, search=event.value.strip())
        else:
            try:
                low, high = parse_reward_range(event.value)
            except ValueError as exc:
                self.notify(f"reward range: {exc}", severity="error")
                return
            self.filter = replace(self.filter, reward_min=low, reward_max=high)
        self.apply_filter()

    # ----- other actions ---------------------------------------------------------------------
    def action_copy(self) -> None:
        if self.rollout is None:
            return
        record = self.index.record(self.rollout.example_id, self.rollout.rollout_index)
        text = json.dumps(record, indent=2, ensure_ascii=False)
        self.app.copy_to_clipboard(text)
        self.notify(
            f"example {self.rollout.example_id} rollout {self.rollout.rollout_index + 1} "
            f"copied as JSON ({len(text):,} characters)",
            title="copied",
        )

    def action_variance(self) -> None:
        def chosen(example_id: object) -> None:
            if isinstance(example_id, int):
                self.select_example(example_id)

        self.open("variance", self.path, run=self.run, label=self.label, index=self.index, callback=chosen)

    def action_reward_panel(self) -> None:
        self.query_one(RewardPanel).toggle()

    def on_resize(self) -> None:
        self.query_one(RewardPanel).fit(self.size.height)

    def action_back(self) -> None:
        if not self.leave_full_screen():
            super().action_back()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "step":
            return self.run is not None and self.run.kind == "train"
        return True

    def action_step(self, step: int) -> None:
        """Training runs: move to the previous/next step's sampled rollouts."""
        if self.run is None:
            return
        files = step_rollout_files(self.run.path)
        paths = [p for _, p in files]
        if self.path not in paths:
            return
        at = paths.index(self.path) + step
        if not 0 <= at < len(paths):
            self.notify("no more steps", severity="warning")
            return
        self.path, self.label = paths[at], f"step {files[at][0]}"
        self.index = RolloutIndex(self.path)
        self.group, self.rollout = None, None
        self.reload(first=True)


def _bound(value: float | None) -> str:
    return "" if value is None else f"{value:g}"
