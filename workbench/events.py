"""How services report progress without printing: the CLI renders these with rich, the TUI
reads the files the services write, tests use `NullReporter` or record calls."""

from __future__ import annotations

from typing import Any, Protocol

from workbench.types import Group


class Reporter(Protocol):
    def start(self, label: str, total: int, done: int) -> None:
        """Work begins: `total` units (rollouts), `done` already finished (resume)."""

    def group_done(self, group: Group, stats: dict[str, Any]) -> None:
        """A group finished; `stats` has running numbers such as the mean reward."""

    def step_done(self, step: int, metrics: dict[str, Any]) -> None:
        """A training step finished with these metrics."""

    def message(self, text: str) -> None:
        """A line worth showing the user (a warning, where results went)."""

    def finish(self) -> None:
        """Work ended (finished, stopped or failed)."""


class NullReporter:
    def start(self, label: str, total: int, done: int) -> None:
        pass

    def group_done(self, group: Group, stats: dict[str, Any]) -> None:
        pass

    def step_done(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def finish(self) -> None:
        pass
