"""`?`: every key of the current screen and where it works, in a modal table.

Where a key works (the third column):
- the screen's name ("Rollouts"): anywhere on that screen, whatever has the focus;
- a part of the screen ("groups table", "conversation", "table"): while that part has the focus
  (tab or a click moves it); every part is listed, not only the focused one;
- "every screen": the app's keys and those every screen shares (escape: back, tab: next part).

One row per thing a key does in one place, with the key people know best when a binding has
several (`j` for "down, j", `pgdn` for "pagedown, ctrl+f"); a key that a more specific
binding takes over on this screen (Group's tab) is listed once, for what it does here.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.actions import parse as parse_action
from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import Static

from workbench.tui.screens.base import WorkbenchScreen
from workbench.tui.widgets.conversation import ConversationView
from workbench.tui.widgets.labelled_table import LabelledTable
from workbench.tui.widgets.virtual_table import VirtualTable

KEY_COLUMNS = (("key", 8), ("action", 34), ("where", 16))
# Textual's own screen bindings that say nothing about this app.
HIDDEN_ACTIONS = {"screen.copy_text", "screen.maximize", "screen.minimize", "command_palette"}
EVERYWHERE = "every screen"
# Classes whose keys every screen has (Textual's Screen: tab; WorkbenchScreen: escape).
SHARED_SCREEN_CLASSES: tuple[type, ...] = (Screen, WorkbenchScreen)


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
    for binding in _class_bindings(type(screen)):
        if binding.description and binding.action not in actions and binding.action not in HIDDEN_ACTIONS:
            _, name, params = parse_action(binding.action)
            if screen.check_action(name, params):
                found.append((binding.key, ActiveBinding(screen, binding, True, binding.tooltip)))
                actions.add(binding.action)
    return found


# A table's keys the command palette names (cursor moves by arrow keys need no command).
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


def _class_bindings(cls: type, *, ours: bool = False) -> list[Binding]:
    """The bindings `cls` declares and inherits, one per key as Textual merges them (the most
    derived class's binding of a key wins), most derived class first; `ours`: only those this
    app declares (a table's scroll-sideways keys from Textual's ScrollView need no list here)."""
    seen: set[str] = set()
    found: list[Binding] = []
    for klass in cls.__mro__:
        for binding in Binding.make_bindings(klass.__dict__.get("BINDINGS", [])):
            if binding.key not in seen:
                seen.add(binding.key)
                if not ours or klass.__module__.startswith("workbench."):
                    found.append(binding)
    return found


def _declared_by(cls: type, binding: Binding) -> type | None:
    """The most derived class of `cls`'s MRO that declares `binding` (by key and action)."""
    for klass in cls.__mro__:
        for declared in Binding.make_bindings(klass.__dict__.get("BINDINGS", [])):
            if declared.key == binding.key and declared.action == binding.action:
                return klass
    return None


def where_of(widget: Widget) -> str:
    """What `?` calls the part of the screen `widget` is."""
    if isinstance(widget, LabelledTable):
        return widget.where
    if isinstance(widget, VirtualTable):
        return "table"
    if isinstance(widget, ConversationView):
        return "conversation"
    return (widget.id or type(widget).__name__).replace("-", " ").lower()


def key_preference(key: str) -> tuple[int, int]:
    """Which of a binding's keys to show: a plain character first (`j`, `g`), then a named key
    without modifiers (`pagedown`), then one with (`ctrl+f`)."""
    if len(key) == 1:
        return (0, 0)
    return (2, 0) if "+" in key else (1, 0)


def _is_workbench_widget(widget: Widget) -> bool:
    """A widget whose keys this app defines (Textual's own inputs and folds need no list here)."""
    return any(
        "BINDINGS" in klass.__dict__ and klass.__module__.startswith("workbench.")
        for klass in type(widget).__mro__
    )


def _shown(widget: Widget) -> bool:
    return all(node.display for node in widget.ancestors_with_self if isinstance(node, Widget))


def _widget_rows(screen: Screen) -> list[tuple[str, str, str, str]]:
    """(key, description, where, action) of every shown part of the screen that has keys."""
    rows: list[tuple[str, str, str, str]] = []
    focused_keys = {
        key: active for key, active in screen.active_bindings.items() if active.node is screen.focused
    }
    for widget in screen.query("*"):
        if not (widget.focusable or widget is screen.focused) or not _shown(widget):
            continue
        if not _is_workbench_widget(widget):
            continue
        for binding in _class_bindings(type(widget), ours=True):
            if not binding.description or binding.system:
                continue
            _, name, params = parse_action(binding.action)
            if widget.check_action(name, params) is False:
                continue
            description = binding.description
            if widget is screen.focused and binding.key in focused_keys:  # instance labels (Enter)
                description = focused_keys[binding.key].binding.description
            elif binding.key == "enter" and isinstance(widget, LabelledTable):
                description = widget.open_label
            rows.append((binding.key, description, where_of(widget), f"{id(widget)}:{binding.action}"))
    return rows


def key_rows(screen: Screen, key_display: Callable[[Binding], str]) -> list[tuple[str, str, str]]:
    """(key, what it does, where) for each described key of `screen`: the screen's own keys,
    then each part's (in screen order), then the keys of every screen."""
    name = type(screen).__name__.removesuffix("Screen") or "screen"
    candidates: list[tuple[str, str, str, str]] = []  # (key, description, where, action)
    for _, active in screen_bindings(screen):
        binding = active.binding
        if active.node is screen.app:
            where = EVERYWHERE
        else:
            declared = _declared_by(type(screen), binding)
            where = EVERYWHERE if declared in SHARED_SCREEN_CLASSES else name
        candidates.append((binding.key, binding.description, where, f"{where}:{binding.action}"))
    candidates += _widget_rows(screen)
    return [
        (key_display(Binding(key, "", "")), description, where)
        for key, description, where in _one_row_each(candidates, name)
    ]


def _one_row_each(candidates: list[tuple[str, str, str, str]], name: str) -> list[tuple[str, str, str]]:
    """One row per (place, action): the best known of its keys; and never one key for one thing
    twice in one place. Ordered: the screen's keys, the parts', then every screen's."""
    best: dict[str, tuple[str, str, str]] = {}
    order: list[str] = []
    for key, description, where, action in candidates:
        if action not in best:
            order.append(action)
            best[action] = (key, description, where)
        elif key_preference(key) < key_preference(best[action][0]):
            best[action] = (key, description, best[action][2])
    rows: list[tuple[str, str, str]] = []
    seen: set[tuple[str, str, str]] = set()
    for action in order:
        row = best[action]
        if row not in seen:
            seen.add(row)
            rows.append(row)
    rank = {name: 0, EVERYWHERE: 2}
    return sorted(rows, key=lambda row: rank.get(row[2], 1))  # stable: parts keep screen order


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
            yield Static(
                f"where: {self.title_text} = anywhere here · a part = while focused (tab)", classes="hint"
            )
            yield Static("ctrl+p or : command palette (every action by name) · escape: close", classes="hint")

    def on_mount(self) -> None:
        table = self.query_one(VirtualTable)
        table.set_rows(self.rows)
        table.focus()

    def on_virtual_table_selected(self) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
