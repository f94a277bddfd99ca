"""The launcher's model picker: the workspace's models, training runs and their checkpoints, and
the endpoints of configs/endpoints.toml, in one filterable list (`data.models`). It dismisses
with the chosen `-m` text, or None (escape)."""

from __future__ import annotations

import asyncio
from typing import cast

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from workbench.tui.data.models import GROUPS, ModelChoice, model_choices
from workbench.tui.data.runs import RunCatalog
from workbench.tui.screens.base import WorkbenchHost

GROUP_TITLES = {
    "models": "Models (outputs/models)",
    "runs": "Training runs (their newest checkpoint)",
    "checkpoints": "Checkpoints",
    "endpoints": "Endpoints (configs/endpoints.toml)",
}


class ModelPickerScreen(ModalScreen[str | None]):
    """`ModelPickerScreen(current=)`: type to filter, ↑/↓ and Enter to pick, escape to cancel."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("down", "move(1)", "Next", show=False),
        Binding("up", "move(-1)", "Previous", show=False),
    ]

    def __init__(self, current: str = "") -> None:
        super().__init__()
        self.current = current.strip()
        self.choices: list[ModelChoice] = []
        self.shown: list[ModelChoice] = []
        self.loaded = False

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-box") as box:
            box.border_title = "Pick a model (-m)"
            yield Input(
                placeholder="filter: type part of a name, a step, an env…", id="picker-filter", compact=True
            )
            yield OptionList(id="picker-list")
            yield Static("reading the workspace…", id="picker-note", classes="hint")

    def on_mount(self) -> None:
        self.query_one("#picker-filter").focus()
        self.load()

    @work(group="picker", exclusive=True)
    async def load(self) -> None:
        root = self.app_host.root
        runs = await asyncio.to_thread(RunCatalog(root).scan)
        self.choices, notes = await asyncio.to_thread(model_choices, root, runs)
        self.loaded = True
        if not self.is_attached:
            return
        self.query_one("#picker-note", Static).update(
            " · ".join(notes) or f"{len(self.choices)} choices · ⏎ pick · esc cancel"
        )
        self._fill(select=self.current)

    @property
    def app_host(self) -> WorkbenchHost:
        return cast("WorkbenchHost", self.app)

    def _fill(self, select: str | None = None) -> None:
        query = self.query_one("#picker-filter", Input).value.strip()
        self.shown = [c for c in self.choices if not query or c.matches(query)]
        options: list[Option | None] = []
        for group in GROUPS:
            members = [c for c in self.shown if c.group == group]
            if not members:
                continue
            options.append(Option(Text(GROUP_TITLES[group], style="bold"), disabled=True))
            options += [Option(Text.assemble(c.value, "  ", (c.detail, "dim")), id=c.value) for c in members]
        olist = self.query_one(OptionList)
        olist.clear_options()
        olist.add_options(options)
        ids = [c.value for c in self.shown]
        target = select if select in ids else ids[0] if ids else None
        if target is not None:
            olist.highlighted = olist.get_option_index(target)

    @on(Input.Changed, "#picker-filter")
    def _filter(self) -> None:
        if self.loaded:
            self._fill()

    def action_move(self, step: int) -> None:
        """↑/↓ move through the list while the filter keeps the focus (it types)."""
        olist = self.query_one(OptionList)
        if step > 0:
            olist.action_cursor_down()
        else:
            olist.action_cursor_up()

    @on(Input.Submitted, "#picker-filter")
    def _submitted(self) -> None:
        olist = self.query_one(OptionList)
        if olist.highlighted is not None:
            option = olist.get_option_at_index(olist.highlighted)
            if option.id is not None:
                self.dismiss(option.id)

    @on(OptionList.OptionSelected, "#picker-list")
    def _selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
