"""Error types. A `UserError` is a mistake in the user's input: the CLI prints its message on
one line and exits with code 1, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (flags, configs, names). Shown as one line, exit code 1."""


class InferenceError(Exception):
    """A model call failed. `transient` ones (connection, timeout, 429, 5xx) are retried."""

    def __init__(self, message: str, *, transient: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status
