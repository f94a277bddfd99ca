"""Compare two eval runs: reward per example in each, the difference and how it changed (fixed,
broke, better, worse), and the highlighted example's conversations from A and B side by side.

Runs whose example ids do not name the same examples (another environment, other env args,
another example set) are refused with one line unless opened with `force` (`C` on Runs)."""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Static

from workbench.tui.data.compare import CHANGES, Comparison, ExampleDiff, compare_groups, mismatch
from workbench.tui.data.rollout_index import GroupRow, RolloutIndex
from workbench.tui.data.runs import RunInfo
from workbench.tui.screens.base import WorkbenchScreen
from workbench.tui.widgets.conversation import ConversationView
from workbench.tui.widgets.format import clip, num, reward_color, reward_text
from workbench.tui.widgets.prompt_bar import PromptBar
from workbench.tui.widgets.virtual_table import VirtualTable
from workbench.types import Rollout

CHANGE_STYLE = {"fixed": "bold green", "broke": "bold red", "better": "green", "worse": "red", "same": "dim"}


class CompareScreen(WorkbenchScreen):
    BINDINGS = [
        Binding("f", "filter", "Filter: fixed/broke/better/worse"),
        Binding("right_square_bracket", "rollout(1)", "Next rollout"),
        Binding("left_square_bracket", "rollout(-1)", "Prev rollout", show=False),
        Binding("number_sign", "jump", "Jump to example"),
        Binding("a", "open('a')", "Open in A", show=False),
        Binding("b", "open('b')", "Open in B", show=False),
    ]

    def __init__(
        self, a: RunInfo, b: RunInfo, labels: tuple[str, str] | None = None, force: bool = False
    ) -> None:
        super().__init__()
        self.a, self.b = a, b
        self.labels = labels or (f"{a.model_label} {a.run_id[-4:]}", f"{b.model_label} {b.run_id[-4:]}")
        self.force = force
        self.index_a = RolloutIndex(a.path / "results.jsonl")
        self.index_b = RolloutIndex(b.path / "results.jsonl")
        self.comparison: Comparison | None = None
        self.change: str | None = None  # the filter: None (all) or one of CHANGES
        self.shown: list[ExampleDiff] = []
        self.position = 0  # which rollout of the example both panes show
        self.loaded = False

    def compose(self) -> ComposeResult:
        yield Static(id="compare-title", classes="screen-title")
        yield VirtualTable(
            (
                ("example", 7),
                (f"A {clip(self.labels[0], 12)}", 14),
                (f"B {clip(self.labels[1], 12)}", 14),
                ("B - A", 7),
                ("change", 7),
            ),
            id="compare-table",
            open_label="Open in B",
        )
        with Horizontal(id="compare-sides"):
            for side in ("a", "b"):
                with Vertical(classes="compare-side"):
                    yield Static(id=f"compare-head-{side}", classes="compare-head")
                    yield ConversationView(id=f"compare-conv-{side}")
        yield PromptBar(id="compare-prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(VirtualTable).focus()
        self.load()

    @work(group="compare")
    async def load(self) -> None:
        def read() -> tuple[Comparison, str | None]:
            self.index_a.refresh()
            self.index_b.refresh()
            problem = None if self.force else mismatch(self.a, self.b, self.index_a, self.index_b)
            return compare_groups(self.index_a.groups(), self.index_b.groups()), problem

        comparison, problem = await asyncio.to_thread(read)
        if self.closing:
            return
        if problem is not None:
            self.notify(f"not compared: {problem} (C on Runs compares anyway)", severity="error", timeout=8)
            self.dismiss(None)
            return
        self.comparison = comparison
        self._render_rows()
        self.loaded = True

    def _render_rows(self) -> None:
        comparison = self.comparison
        if comparison is None:
            return
        counts = " · ".join(f"[{CHANGE_STYLE[c]}]{comparison.count(c)} {c}[/]" for c in CHANGES)
        self.query_one("#compare-title", Static).update(
            f"[b]Compare[/b] · {self.a.env} · A: {self.labels[0]} ({num(comparison.mean_a)}) → "
            f"B: {self.labels[1]} ({num(comparison.mean_b)})\n"
            f"{comparison.shared} shared examples · {counts} · showing {self.change or 'all'}"
        )
        self.shown = comparison.only(self.change)
        cells = []
        for row in self.shown:
            delta = row.delta
            delta_text = Text(
                "-" if delta is None else f"{delta:+.3f}",
                style="" if delta is None or abs(delta) < 1e-9 else "green" if delta > 0 else "red",
            )
            cells.append(
                (
                    str(row.example_id),
                    reward_text(row.a),
                    reward_text(row.b),
                    delta_text,
                    Text(row.change, style=CHANGE_STYLE.get(row.change, "dim")),
                )
            )
        self.query_one(VirtualTable).set_rows(
            cells,
            keys=[str(row.example_id) for row in self.shown],
            sort_values=[(float(r.example_id), r.a, r.b, r.delta, r.change) for r in self.shown],
        )
        if not self.shown:
            for side in ("a", "b"):
                self.query_one(f"#compare-head-{side}", Static).update("")
                self.query_one(f"#compare-conv-{side}", ConversationView).rollout = None

    # ----- the two conversations -------------------------------------------------------------
    @on(VirtualTable.Highlighted, "#compare-table")
    def _highlighted(self) -> None:
        self.position = 0
        self._show_sides()

    def _show_sides(self) -> None:
        example = self._current_example()
        if example is None:
            return
        shown: dict[str, Rollout | None] = {}
        for side, index in (("a", self.index_a), ("b", self.index_b)):
            group = index.group(example)
            rollout = None
            if group is not None and group.size:
                rollout = index.load(
                    example, index.rollout_index_at(group, min(self.position, group.size - 1))
                )
            shown[side] = rollout
            head = _side_head(side.upper(), self.labels[side == "b"], rollout, group)
            if side == "b" and rollout is not None and shown["a"] is not None:
                diff = rollout.reward - shown["a"].reward
                head.append(
                    f" · B - A {diff:+.3f}",
                    style="bold green" if diff > 1e-9 else "bold red" if diff < -1e-9 else "dim",
                )
            self.query_one(f"#compare-head-{side}", Static).update(head)
            self.query_one(f"#compare-conv-{side}", ConversationView).rollout = rollout

    def action_rollout(self, step: int) -> None:
        example = self._current_example()
        if example is None:
            return
        sizes = [g.size for g in (self.index_a.group(example), self.index_b.group(example)) if g is not None]
        if not sizes:
            return
        self.position = (self.position + step) % max(sizes)
        self._show_sides()

    # ----- table actions ----------------------------------------------------------------------
    def action_filter(self) -> None:
        options = (None, *CHANGES)
        self.change = options[(options.index(self.change) + 1) % len(options)]
        self._render_rows()

    def action_jump(self) -> None:
        self.query_one(PromptBar).ask("jump", "example id (Enter to jump)")

    @on(PromptBar.Answered)
    def _answered(self, event: PromptBar.Answered) -> None:
        value = event.value.strip()
        if not self.query_one(VirtualTable).select_key(value):
            self.notify(f"example {value or '?'} is not listed (f changes the filter)", severity="warning")

    def _current_example(self) -> int | None:
        index = self.query_one(VirtualTable).cursor_index
        return self.shown[index].example_id if index is not None and index < len(self.shown) else None

    @on(VirtualTable.Selected)
    def _selected(self) -> None:
        self.action_open("b")

    def action_open(self, side: str) -> None:
        example = self._current_example()
        run = self.a if side == "a" else self.b
        if example is not None:
            self.open("rollouts", run.path / "results.jsonl", run=run, focus_example=example)


def _side_head(side: str, label: str, rollout: Rollout | None, group: GroupRow | None) -> Text:
    """'A model · rollout 1/4 · reward 0.500 (mean 0.375)' above a side's conversation."""
    text = Text.assemble((f"{side} ", "bold"), clip(label, 18))
    if rollout is None or group is None:
        text.append(" · not in this run", style="dim")
        return text
    text.append(f" · rollout {rollout.rollout_index + 1}/{group.size} · reward ")
    text.append(f"{rollout.reward:.3f}", style=f"bold {reward_color(rollout.reward)}")
    text.append(f" (mean {group.mean:.3f})", style="dim")
    return text
