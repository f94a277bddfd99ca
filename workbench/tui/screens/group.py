"""Group: every rollout of one example in one table — reward, each reward function, length,
turns, stop condition, error — with the highlighted rollout's conversation below it
(`RolloutDetail`: `f` find, `m` markdown, `F` full screen). Enter opens that rollout in the
Rollouts view (the screen closes with its rollout index)."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Static

from workbench.tui.data.rollout_index import RolloutIndex
from workbench.tui.screens.base import WorkbenchScreen
from workbench.tui.widgets.format import clip, num, reward_text
from workbench.tui.widgets.labelled_table import LabelledTable
from workbench.tui.widgets.rollout_detail import DetailActions, RolloutDetail
from workbench.tui.widgets.virtual_table import Cell, Column, SortValue, VirtualTable
from workbench.types import Group, Rollout

FUNCTION_WIDTH = 8  # a reward function's column; its name is cut to fit (the breakdown spells it out)


def group_columns(group: Group) -> tuple[list[Column], list[str]]:
    """The table's columns and the reward-function names (in first-seen order) they show."""
    functions: list[str] = []
    for rollout in group.rollouts:
        functions += [name for name in rollout.rewards if name not in functions]
    columns = [
        ("#", 3),
        ("reward", 6),
        *((clip(name, FUNCTION_WIDTH), FUNCTION_WIDTH) for name in functions),
        ("length", 6),
        ("turns", 5),
        ("stop", 10),
        ("error", 14),
    ]
    return columns, functions


def rollout_cells(rollout: Rollout, functions: list[str]) -> tuple[tuple[Cell, ...], tuple[SortValue, ...]]:
    """A rollout's row (counted from 1, as the breakdown says 'rollout 1/4') and its sort values."""
    length = (rollout.usage or {}).get("completion_tokens")
    error = rollout.error.type if rollout.error is not None else ""
    stop = rollout.stop_condition or "-"
    if rollout.is_truncated and "trunc" not in stop:
        stop += " (truncated)"
    values = [rollout.rewards.get(name) for name in functions]
    cells: tuple[Cell, ...] = (
        str(rollout.rollout_index + 1),
        reward_text(rollout.reward),
        *(Text(num(v), style="cyan" if v is not None else "dim") for v in values),
        "-" if length is None else str(length),
        str(rollout.num_turns),
        stop,
        Text(error, style="bold red") if error else "",
    )
    sort: tuple[SortValue, ...] = (
        float(rollout.rollout_index),
        rollout.reward,
        *values,
        None if length is None else float(length),
        float(rollout.num_turns),
        stop,
        error or None,
    )
    return cells, sort


class GroupScreen(DetailActions, WorkbenchScreen):
    # One key between the two places to read (Textual's tab would also stop at folds and bars).
    BINDINGS = [Binding("tab", "switch_focus", "Table / conversation", show=False)]

    def __init__(self, index: RolloutIndex, example_id: int, *, title: str = "", position: int = 0) -> None:
        super().__init__()
        self.index = index
        self.example_id = example_id
        self.title_text = title
        self.position = position
        self.group = index.load_group(example_id)  # a handful of lines, read from disk
        self.columns, self.functions = group_columns(self.group)
        self.rollout: Rollout | None = None

    def compose(self) -> ComposeResult:
        group = self.group
        yield Static(
            f"[b]Group[/b] · example {self.example_id} · {len(group.rollouts)} rollouts · "
            f"mean {num(group.mean if group.rollouts else None)} · std "
            f"{num(group.std if group.rollouts else None)}"
            + (f"\n{self.title_text}" if self.title_text else ""),
            classes="screen-title",
        )
        yield LabelledTable(
            self.columns,
            id="group-table",
            open_label="Open rollout",
            where="rollouts table",
            empty="no rollouts for this example",
        )
        yield RolloutDetail(
            id="group-detail", breakdown_id="group-breakdown", conversation_id="group-conversation"
        )
        yield Footer()

    def on_mount(self) -> None:
        rows = [rollout_cells(r, self.functions) for r in self.group.rollouts]
        table = self.query_one(VirtualTable)
        table.set_rows(
            [cells for cells, _ in rows],
            cursor=min(self.position, max(len(rows) - 1, 0)),
            keys=[str(r.rollout_index + 1) for r in self.group.rollouts],
            sort_values=[sort for _, sort in rows],
        )
        table.focus()

    @on(VirtualTable.Highlighted, "#group-table")
    def _highlighted(self, event: VirtualTable.Highlighted) -> None:
        self.rollout = self.group.rollouts[event.index]
        self.detail.breakdown.show(self.rollout, len(self.group.rollouts))
        self.detail.conversation.rollout = self.rollout

    @on(VirtualTable.Selected, "#group-table")
    def _selected(self, event: VirtualTable.Selected) -> None:
        event.stop()
        self.dismiss(self.group.rollouts[event.index].rollout_index)

    def action_switch_focus(self) -> None:
        view = self.detail.conversation
        if view.has_focus:
            self.query_one(LabelledTable).focus()
        else:
            view.focus()

    def action_back(self) -> None:
        if not self.leave_full_screen():
            super().action_back()
