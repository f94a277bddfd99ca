"""`WorkbenchApp`: the thin Textual app. It owns the workspace root, the launcher of child runs,
the global keys and the registry of screens by name; everything else lives in screens
(`workbench.tui.screens`).

Screens never import each other: each is registered here under a name, and a screen opens
another by name (`WorkbenchScreen.open("rollouts", path, run=run)` -> `WorkbenchApp.open_screen`).
A screen module is imported the first time its screen opens, so startup loads only the runs
screen (the run monitor's plotting library, for one, loads only with the monitor)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from importlib import import_module
from pathlib import Path
from typing import Any, ClassVar

from textual.app import App, SystemCommand
from textual.binding import ActiveBinding, Binding
from textual.screen import Screen, ScreenResultCallbackType

from workbench.tui.data.runs import RunCatalog, RunInfo
from workbench.tui.launcher import Launcher
from workbench.tui.screens.confirm import ConfirmScreen
from workbench.tui.screens.keys import KeysScreen, key_rows, screen_bindings, table_bindings
from workbench.tui.screens.runs import RunsScreen

ScreenFactory = Callable[..., Screen[Any]]


@dataclass(frozen=True)
class LazyScreen:
    """Screen class `name` of `workbench.tui.screens.<module>`, imported the first time one is built."""

    module: str
    name: str

    def load(self) -> type[Screen[Any]]:
        return getattr(import_module(f"workbench.tui.screens.{self.module}"), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Screen[Any]:
        return self.load()(*args, **kwargs)


class WorkbenchApp(App[None]):
    """Runs home first; `?` lists keys, ctrl+p (or `:`) lists every action of the current screen by name."""

    CSS_PATH = "app.tcss"
    TITLE = "workbench"
    BINDINGS = [
        Binding("question_mark", "keys", "Keys"),
        Binding("q", "quit", "Quit"),
        # vim's / k9s's way to an action by name. Its own action: a second binding of "command_palette"
        # would take the footer's "^p palette" hint away.
        Binding("colon", "palette", "Command palette", show=False),
        # Issue 35: the Environments screen and the config editor, from Runs (check_action keeps
        # these keys to the Runs screen: elsewhere `E` and ctrl+o are free for the screen's own use).
        Binding("E", "open_home('environments')", "Environments"),
        Binding("ctrl+o", "open_home('config_editor')", "Configs"),
    ]
    HOME_SCREENS = ("environments", "config_editor")  # what open_home opens

    # Every screen by name, and what it is built from (its constructor's arguments). Screens
    # open each other through these names (`open_screen`), never by importing one another.
    SCREEN_FACTORIES: ClassVar[dict[str, ScreenFactory]] = {
        "runs": RunsScreen,  # ()
        "keys": KeysScreen,  # (rows, title)
        "confirm": ConfirmScreen,  # (question, title=, yes=, no=) -> bool
        "launch": LazyScreen("launch", "LaunchScreen"),  # (tab=) -> Launch | None
        "monitor": LazyScreen("monitor", "TrainMonitorScreen"),  # (run)
        "gepa": LazyScreen("gepa", "GepaScreen"),  # (run)
        "rollouts": LazyScreen("rollouts", "RolloutsScreen"),  # (path, run=, label=, focus_example=)
        "group": LazyScreen(
            "group", "GroupScreen"
        ),  # (index, example_id, title=, position=) -> rollout index
        "variance": LazyScreen("variance", "VarianceScreen"),  # (path, run=, label=, index=) -> example id
        "checkpoints": LazyScreen("checkpoints", "CheckpointsScreen"),  # (run)
        "compare": LazyScreen("compare", "CompareScreen"),  # (a, b, labels=, force=)
        "log": LazyScreen("log", "LogScreen"),  # (logs, title=, pid=, label=, note=)
        "environments": LazyScreen("environments", "EnvironmentsScreen"),  # (select=)
        "config_editor": LazyScreen("config_editor", "ConfigEditorScreen"),  # (path=) -> Launch | None
        "model_picker": LazyScreen("model_picker", "ModelPickerScreen"),  # (current=) -> str | None
    }

    def __init__(self, root: Path, *, launcher: Launcher | None = None, poll_s: float = 1.0) -> None:
        super().__init__()
        self.root = root.resolve()
        self.launcher = launcher or Launcher(self.root)
        self.catalog = RunCatalog(self.root)
        self.poll_s = poll_s  # how often screens re-read the files they show

    def make_screen(self, name: str, /, *args: Any, **kwargs: Any) -> Screen[Any]:
        """A new screen of the kind registered as `name`."""
        try:
            factory = self.SCREEN_FACTORIES[name]
        except KeyError:
            raise KeyError(
                f"no screen named {name!r}; known: {', '.join(sorted(self.SCREEN_FACTORIES))}"
            ) from None
        return factory(*args, **kwargs)

    def open_screen(
        self, name: str, /, *args: Any, callback: ScreenResultCallbackType[Any] | None = None, **kwargs: Any
    ) -> Screen[Any]:
        """Build the screen registered as `name` and push it; `callback` gets what it dismisses with."""
        screen = self.make_screen(name, *args, **kwargs)
        self.push_screen(screen, callback)
        return screen

    def get_default_screen(self) -> Screen:
        return self.make_screen("runs")

    def action_keys(self) -> None:
        screen = self.screen
        if isinstance(screen, KeysScreen):
            return
        self.open_screen(
            "keys", key_rows(screen, self.get_key_display), type(screen).__name__.removesuffix("Screen")
        )

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`E` / ctrl+o (open_home) only on the Runs screen: hidden and inert on every other one."""
        if action == "open_home":
            return isinstance(self.screen, RunsScreen)
        return True

    def action_open_home(self, name: str) -> None:
        """`E`: Environments; ctrl+o: the config editor (Runs screen keys, kept in the app: issue 35)."""
        if name in self.HOME_SCREENS:
            self.open_screen(name)

    def action_palette(self) -> None:
        """`:`: the command palette, as ctrl+p."""
        self.action_command_palette()

    async def action_quit(self) -> None:
        """`q`: quit at once — unless runs are going, then say they go on (and how to get back to
        them) and ask. Quitting never stops a run: each is a process of its own."""
        if isinstance(self.screen, ConfirmScreen):
            return  # already asking (this one, or whether to stop a run)
        going = self.launcher.live_count(self._scan_runs())
        if not going:
            self.exit()
            return
        reopen = "workbench tui" if Path.cwd().resolve() == self.root else f"workbench tui -w {self.root}"
        runs = "1 run is still going; it keeps" if going == 1 else f"{going} runs are still going; they keep"
        question = (
            f"{runs} running after you quit (x on a run stops it first). "
            f"Reopen this workspace with `{reopen}` to follow it. Quit?"
        )
        self.open_screen(
            "confirm",
            question,
            title="Quit",
            yes="Quit",
            no="Stay",
            callback=lambda yes: self.exit() if yes else None,
        )

    def _scan_runs(self) -> list[RunInfo]:
        """The workspace's runs, read afresh (the Runs screen's catalog may be scanning in its thread)."""
        self.launcher.poll()
        return RunCatalog(self.root).scan()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's commands (theme, quit, screenshot), every described key of the current screen,
        then the screen's keyless commands (`PALETTE_COMMANDS`: (title, action, help)), each title once.
        Textual's own "Keys" (its help panel) is left out: `?` is this app's Keys."""
        seen: set[str] = set()
        for command in super().get_system_commands(screen):
            if command.title != "Keys" and command.title not in seen:
                seen.add(command.title)
                yield command
        actions: set[str] = set()
        for _, active in [*screen_bindings(screen), *table_bindings(screen)]:
            binding = active.binding
            if (
                not active.enabled
                or binding.action in actions
                or binding.action in ("quit", "palette")
                or binding.description in seen
            ):
                continue
            actions.add(binding.action)
            seen.add(binding.description)
            yield SystemCommand(
                binding.description,
                f"key: {self.get_key_display(binding)}",
                partial(self._run_binding, active),
            )
        for title, action, help_text in getattr(screen, "PALETTE_COMMANDS", ()):
            if title not in seen:
                seen.add(title)
                yield SystemCommand(title, help_text, partial(self.run_action, action, screen))

    async def _run_binding(self, active: ActiveBinding) -> None:
        await self.run_action(active.binding.action, active.node)
