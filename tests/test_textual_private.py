"""workbench/tui/textual_private.py: the private Textual attribute it uses still does its job.
If this fails after a Textual upgrade, relabel_binding needs Textual's new way (or a public API)."""

from __future__ import annotations

from textual.app import App, ComposeResult

from workbench.tui.widgets.virtual_table import VirtualTable


class TwoTables(App[None]):
    def compose(self) -> ComposeResult:
        yield VirtualTable((("x", 5),), id="groups", open_label="Open group")
        yield VirtualTable((("x", 5),), id="plain")


async def test_each_table_instance_names_what_its_enter_opens():
    app = TwoTables()
    async with app.run_test() as pilot:
        for table_id, label in (("groups", "Open group"), ("plain", "Open")):
            app.query_one(f"#{table_id}", VirtualTable).focus()
            await pilot.pause()
            enter = app.screen.active_bindings["enter"]
            assert enter.node.id == table_id and enter.binding.description == label
        assert VirtualTable.BINDINGS[-1].description == "Open"  # the class's binding is left as it was
