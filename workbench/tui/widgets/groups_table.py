"""The per-example groups list of a rollouts file: example id, rollouts, mean and std of
reward, and flags (E errors, T truncated, 0 zero variance). Virtual: thousands of groups cost
nothing until they scroll into view. Sortable by any column (`o`/`O`); rows are keyed by
example id, so `select_example` jumps to one. With no rows it says why (`empty`)."""

from __future__ import annotations

from textual import on
from textual.message import Message

from workbench.tui.data.rollout_index import GroupRow, group_flags
from workbench.tui.widgets.format import reward_text
from workbench.tui.widgets.labelled_table import LabelledTable
from workbench.tui.widgets.virtual_table import VirtualTable

COLUMNS = (("example", 7), ("n", 3), ("mean", 5), ("std", 5), ("flags", 5))


class GroupsTable(LabelledTable):
    """Shows `GroupRow`s; posts `Highlighted(group)` as the cursor moves and `Chosen` on Enter."""

    class _GroupMessage(Message):
        def __init__(self, table: GroupsTable, group: GroupRow) -> None:
            super().__init__()
            self.table = table
            self.group = group

        @property
        def control(self) -> GroupsTable:
            return self.table

    class Highlighted(_GroupMessage):
        """The cursor is on a group."""

    class Chosen(_GroupMessage):
        """Enter on a group."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(COLUMNS, id=id, open_label="Open group", where="groups table", empty="no groups yet")
        self.groups: list[GroupRow] = []

    @property
    def current(self) -> GroupRow | None:
        index = self.cursor_index
        return None if index is None or index >= len(self.groups) else self.groups[index]

    def show(self, groups: list[GroupRow], select: int | None = None) -> None:
        """Replace the rows, keeping the cursor on the same example when it is still listed."""
        keep = select if select is not None else (self.current.example_id if self.current else None)
        self.groups = groups
        index = next((i for i, g in enumerate(groups) if g.example_id == keep), 0) if keep is not None else 0
        self.set_rows(
            [
                (str(g.example_id), str(g.size), reward_text(g.mean), f"{g.std:.3f}", group_flags(g))
                for g in groups
            ],
            cursor=index,
            keys=[str(g.example_id) for g in groups],
            sort_values=[
                (float(g.example_id), float(g.size), g.mean, g.std, group_flags(g) or None) for g in groups
            ],
        )

    def select_example(self, example_id: int) -> bool:
        return self.select_key(str(example_id))

    @on(VirtualTable.Selected)
    def _selected(self, event: VirtualTable.Selected) -> None:
        event.stop()
        if self.current is not None:
            self.post_message(self.Chosen(self, self.current))

    @on(VirtualTable.Highlighted)
    def _highlighted(self, event: VirtualTable.Highlighted) -> None:
        event.stop()
        if self.current is not None:
            self.post_message(self.Highlighted(self, self.current))
