"""`WorkbenchApp`: the thin Textual app. It owns the workspace root, the launcher of child runs
and the global keys; everything else lives in screens (`workbench.tui.screens`)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from pathlib import Path

from textual.app import App, SystemCommand
from textual.binding import ActiveBinding, Binding
from textual.screen import Screen

from workbench.tui.data.runs import RunCatalog
from workbench.tui.launcher import Launcher
from workbench.tui.screens.keys import KeysScreen, key_rows, screen_bindings
from workbench.tui.screens.runs import RunsScreen


class WorkbenchApp(App[None]):
    """Runs home first; `?` lists keys, ctrl+p lists every action of the current screen."""

    CSS_PATH = "app.tcss"
    TITLE = "workbench"
    BINDINGS = [
        Binding("question_mark", "keys", "Keys"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, root: Path, *, launcher: Launcher | None = None, poll_s: float = 1.0) -> None:
        super().__init__()
        self.root = root.resolve()
        self.launcher = launcher or Launcher(self.root)
        self.catalog = RunCatalog(self.root)
        self.poll_s = poll_s  # how often screens re-read the files they show

    def get_default_screen(self) -> Screen:
        return RunsScreen()

    def action_keys(self) -> None:
        screen = self.screen
        if isinstance(screen, KeysScreen):
            return
        self.push_screen(KeysScreen(key_rows(screen, self.get_key_display), type(screen).__name__.removesuffix("Screen")))

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
