"""`?`: every key of the current screen (and the global ones), in a modal table."""

from __future__ import annotations

from collections.abc import Callable

from textual.actions import parse as parse_action
from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from workbench.tui.widgets.virtual_table import VirtualTable

KEY_COLUMNS = (("key", 9), ("action", 44), ("where", 6))
# Textual's own screen bindings that say nothing about this app.
HIDDEN_ACTIONS = {"screen.copy_text", "screen.maximize", "screen.minimize", "command_palette"}


def screen_bindings(screen: Screen) -> list[tuple[str, ActiveBinding]]:
    """(key, binding) of the screen's and the app's described keys. Widget keys (a table's
    cursor keys) are left out, but a screen key that a focused widget shadows (Enter on a
    table) is still listed: it names what the key does on this screen."""
    found: list[tuple[str, ActiveBinding]] = []
    actions: set[str] = set()
    for key, active in screen.active_bindings.items():
        binding = active.binding
        if not binding.description or binding.system or binding.action in HIDDEN_ACTIONS:
            continue
        if active.node is screen or active.node is screen.app:
            found.append((key, active))
            actions.add(binding.action)
    for cls in type(screen).__mro__:
        for binding in Binding.make_bindings(cls.__dict__.get("BINDINGS", [])):
            if binding.description and binding.action not in actions and binding.action not in HIDDEN_ACTIONS:
                _, name, params = parse_action(binding.action)
                if screen.check_action(name, params):
                    found.append((binding.key, ActiveBinding(screen, binding, True, binding.tooltip)))
                    actions.add(binding.action)
    return found


# A table's keys worth naming (cursor moves by arrow keys need no introduction).
TABLE_ACTIONS = {"sort", "reverse_sort", "first", "last"}


def table_bindings(screen: Screen) -> list[tuple[str, ActiveBinding]]:
    """(key, binding) of the focused table's own keys: sort, reverse sort, first and last row."""
    focused = screen.focused
    if focused is None:
        return []
    found: dict[str, tuple[str, ActiveBinding]] = {}  # by action: its shortest key (g, not home)
    for key, active in screen.active_bindings.items():
        binding = active.binding
        if (
            active.node is focused
            and binding.description
            and binding.action in TABLE_ACTIONS
            and (binding.action not in found or len(key) < len(found[binding.action][0]))
        ):
            found[binding.action] = (key, active)
    return list(found.values())


def key_rows(screen: Screen, key_display: Callable[[Binding], str]) -> list[tuple[str, str, str]]:
    """(key, what it does, where) for each described key of `screen`, screen keys first, then
    the focused table's, then the global ones."""
    order = {"screen": 0, "table": 1, "global": 2}
    rows = [
        (
            key_display(active.binding),
            active.binding.description,
            "global" if active.node is screen.app else "screen",
        )
        for _, active in screen_bindings(screen)
    ]
    rows += [
        (key_display(active.binding), active.binding.description, "table")
        for _, active in table_bindings(screen)
    ]
    return sorted(rows, key=lambda row: order[row[2]])


class KeysScreen(ModalScreen[None]):
    """Lists keys; any of escape, ? or q closes it."""

    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def __init__(self, rows: list[tuple[str, str, str]], title: str) -> None:
        super().__init__()
        self.rows = rows
        self.title_text = title

    def compose(self) -> ComposeResult:
        with Vertical(id="keys-box") as box:
            box.border_title = f"Keys · {self.title_text}"
            yield VirtualTable(KEY_COLUMNS, id="keys-table", open_label="Close")
            yield Static("ctrl+p or : command palette (every action by name) · escape: close", classes="hint")

    def on_mount(self) -> None:
        table = self.query_one(VirtualTable)
        table.set_rows(self.rows)
        table.focus()

    def on_virtual_table_selected(self) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
