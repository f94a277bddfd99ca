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

from workbench.tui.data.runs import RunCatalog
from workbench.tui.launcher import Launcher
from workbench.tui.screens.keys import KeysScreen, key_rows, screen_bindings
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
    """Runs home first; `?` lists keys, ctrl+p lists every action of the current screen."""

    CSS_PATH = "app.tcss"
    TITLE = "workbench"
    BINDINGS = [
        Binding("question_mark", "keys", "Keys"),
        Binding("q", "quit", "Quit"),
    ]

    # Every screen by name, and what it is built from (its constructor's arguments). Screens
    # open each other through these names (`open_screen`), never by importing one another.
    SCREEN_FACTORIES: ClassVar[dict[str, ScreenFactory]] = {
        "runs": RunsScreen,                                               # ()
        "keys": KeysScreen,                                               # (rows, title)
        "launch": LazyScreen("launch", "LaunchScreen"),                   # () -> Launch | None
        "monitor": LazyScreen("monitor", "TrainMonitorScreen"),           # (run)
        "gepa": LazyScreen("gepa", "GepaScreen"),                         # (run)
        "rollouts": LazyScreen("rollouts", "RolloutsScreen"),             # (path, run=, label=, focus_example=)
        "variance": LazyScreen("variance", "VarianceScreen"),             # (path, run=, label=, index=) -> example id
        "checkpoints": LazyScreen("checkpoints", "CheckpointsScreen"),    # (run)
        "compare": LazyScreen("compare", "CompareScreen"),                # (a, b, labels=)
        "log": LazyScreen("log", "LogScreen"),                            # (logs, title=, pid=)
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
            raise KeyError(f"no screen named {name!r}; known: {', '.join(sorted(self.SCREEN_FACTORIES))}") from None
        return factory(*args, **kwargs)

    def open_screen(self, name: str, /, *args: Any, callback: ScreenResultCallbackType[Any] | None = None,
                    **kwargs: Any) -> Screen[Any]:
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
        self.open_screen("keys", key_rows(screen, self.get_key_display), type(screen).__name__.removesuffix("Screen"))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The built-in commands plus every described key of the current screen."""
        yield from super().get_system_commands(screen)
        seen: set[str] = set()
        for _, active in screen_bindings(screen):
            binding = active.binding
            if not active.enabled or binding.action in seen or binding.action == "quit":
                continue
            seen.add(binding.action)
            yield SystemCommand(binding.description, f"key: {self.get_key_display(binding)}",
                                partial(self._run_binding, active))

    async def _run_binding(self, active: ActiveBinding) -> None:
        await self.run_action(active.binding.action, active.node)
