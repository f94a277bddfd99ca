"""Error types. A `UserError` is a mistake in the user's input: the CLI prints its message on
one line and exits with code 1, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (flags, configs, names). Shown as one line, exit code 1."""


class QuietExit(Exception):
    """End the process with exit code `code` and print nothing: someone else has told the user
    (a trainer rank whose peer died leaves it to the launcher, which names the rank that died)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"exit code {code}")
        self.code = code


class InferenceError(Exception):
    """A model call failed. `transient` ones (connection, timeout, 429, 5xx) are retried."""

    def __init__(self, message: str, *, transient: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status


class ServerGone(InferenceError):
    """A request failed every try and no other request was answered meanwhile: the server is gone
    or stalled. The run stops (keeping every finished result) instead of failing all that is left."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=True)


class ContextLengthError(InferenceError):
    """The conversation no longer fits the model's context window. Not an error of the run:
    a multi-turn rollout that grows past it ends as truncated (as vLLM and verifiers treat it)."""

    def __init__(self, message: str, status: int | None = 400) -> None:
        super().__init__(message, transient=False, status=status)


# How servers (vLLM, OpenAI, workbench serve) phrase a context overflow in a 400 reply.
CONTEXT_LENGTH_MARKERS = (
    "maximum context length",
    "context length",
    "too long for the model",
    "prompt is too long",
)
