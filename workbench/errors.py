"""Error types. A `UserError` is a mistake in the user's input: the CLI prints its message on
one line and exits with code 1, never a traceback."""

from __future__ import annotations

import re
from typing import Any

# `scheme://user:password@host` or `scheme://token@host`: the secret part of a URL's userinfo.
_URL_SECRET = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s/@:]*)(?::[^\s/@]*)?@")
REDACTED = "***"


def redact_credentials(text: str) -> str:
    """`text` with every URL's password (or lone token) replaced by ***: a key pasted into
    `-b http://user:sk-...@host/v1` is never printed or saved. The user name stays (it says which
    account); a token given as the user name alone is a secret too."""

    def hide(match: re.Match[str]) -> str:
        scheme, user = match["scheme"], match["user"]
        return f"{scheme}{user}:{REDACTED}@" if ":" in match[0][len(scheme) :] else f"{scheme}{REDACTED}@"

    return _URL_SECRET.sub(hide, text)


def redact_values(data: Any) -> Any:
    """`data` (JSON-like) with `redact_credentials` applied to every string in it."""
    if isinstance(data, str):
        return redact_credentials(data)
    if isinstance(data, dict):
        return {key: redact_values(value) for key, value in data.items()}
    if isinstance(data, list):
        return [redact_values(value) for value in data]
    return data


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

    def __init__(
        self, message: str, *, transient: bool, status: int | None = None, refused: bool = False
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status
        # Nothing listens at the address (connection refused): a dead server, not a busy one.
        self.refused = refused


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
