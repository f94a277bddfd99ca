"""The endpoint registry, `configs/endpoints.toml`: named OpenAI-compatible endpoints.

```
[[endpoint]]
endpoint_id = "gpt-4.1-mini"
model = "gpt-4.1-mini"
url = "https://api.openai.com/v1"
key = "OPENAI_API_KEY"   # NAME of an environment variable, never the key itself
timeout = 60             # optional: seconds of silence before a request is retried
tries = 5                # optional: tries per request before a rollout counts as a server failure
```

Several entries with one `endpoint_id` are replicas, called round-robin. Keys are read
from the environment when a client is built and never stored or written anywhere.
Every mistake in the file is a one-line `UserError` naming file, line and key.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from workbench.config.toml_loader import key_line, read_toml
from workbench.errors import UserError
from workbench.inference.client import Client
from workbench.inference.openai_client import DEFAULT_TIMEOUT_S, DEFAULT_TRIES, OpenAIClient, RoundRobinClient

DEFAULT_PATH = Path("configs/endpoints.toml")
_TABLE = "endpoint"
_ENV_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TABLE_HEADER = re.compile(r"^\s*\[")
_ENDPOINT_HEADER = re.compile(r"^\s*\[\[\s*endpoint\s*\]\]")


class Endpoint(BaseModel):
    """One OpenAI-compatible endpoint (one replica of `endpoint_id`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    endpoint_id: str = Field(min_length=1)
    """The name used on the command line (`-m gpt-4.1-mini`); repeated ids are replicas."""
    model: str = Field(min_length=1)
    """The model name sent in each request (what the server calls the model)."""
    url: str
    """Base URL of the OpenAI-compatible API, e.g. `http://localhost:8000/v1`."""
    key: str | None = None
    """NAME of the environment variable holding the API key (never the key); omit for none."""
    timeout: float | None = Field(None, gt=0)
    """Seconds the server may stay silent before a request is retried (default 60; --timeout wins)."""
    tries: int | None = Field(None, ge=1)
    """Tries per request before a rollout counts as a server failure (default 5; --tries wins)."""

    # Where the entry came from, for error messages; not a TOML key.
    _source: str = PrivateAttr(default=str(DEFAULT_PATH))

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"'{url}' is not an http(s) URL like 'http://localhost:8000/v1'")
        return url

    @field_validator("key")
    @classmethod
    def _check_key(cls, key: str | None) -> str | None:
        # Never echo the value: if it is not a variable name it may be a real secret.
        if key is not None and not _ENV_VAR_NAME.match(key):
            raise ValueError(
                "must be the NAME of an environment variable (like OPENAI_API_KEY), not the key itself"
            )
        return key

    @property
    def source(self) -> str:
        return self._source


_FIELDS = tuple(Endpoint.model_fields)


def _entry_spans(lines: list[str]) -> list[tuple[int, int]]:
    """(start, end) line indexes of each `[[endpoint]]` block, header included."""
    spans: list[tuple[int, int]] = []
    for index, line in enumerate(lines):
        if _TABLE_HEADER.match(line):
            if spans and spans[-1][1] == len(lines):
                spans[-1] = (spans[-1][0], index)
            if _ENDPOINT_HEADER.match(line):
                spans.append((index, len(lines)))
    return spans


def _suggestion(word: str, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(choices)}"


def load_endpoints(path: str | Path = DEFAULT_PATH) -> dict[str, list[Endpoint]]:
    """endpoint_id → its replicas, in file order. A missing file is an empty registry."""
    path = Path(path)
    if not path.exists():
        return {}
    data, text = read_toml(path)
    lines = text.splitlines()
    for name in data:
        if name != _TABLE:
            line = key_line(text, name) or 1
            hint = (
                "did you mean 'endpoint'?"
                if difflib.get_close_matches(name, [_TABLE], cutoff=0.5)
                else ("the file holds only [[endpoint]] tables")
            )
            raise UserError(f"{path}:{line}: unknown table '{name}' ({hint})")
    entries = data.get(_TABLE, [])
    if not isinstance(entries, list):
        line = next(
            (i + 1 for i, text_line in enumerate(lines) if re.match(r"^\s*\[\s*endpoint\s*\]", text_line)), 1
        )
        raise UserError(f"{path}:{line}: write [[endpoint]] (double brackets: one table per endpoint)")

    spans = _entry_spans(lines)
    registry: dict[str, list[Endpoint]] = {}
    for index, entry in enumerate(entries):
        start, end = spans[index] if index < len(spans) else (0, len(lines))
        header_line = start + 1
        if not isinstance(entry, dict):
            raise UserError(f"{path}:{header_line}: each endpoint must be a table")
        for key in entry:
            if key not in _FIELDS:
                line = key_line(text, key, start, end) or header_line
                raise UserError(
                    f"{path}:{line}: unknown key '{key}' in [[endpoint]] ({_suggestion(key, _FIELDS)})"
                )
        try:
            endpoint = Endpoint.model_validate(entry)
        except ValidationError as exc:
            raise UserError(_validation_message(exc, path, text, start, end)) from None
        endpoint._source = str(path)
        registry.setdefault(endpoint.endpoint_id, []).append(endpoint)
    return registry


def _validation_message(exc: ValidationError, path: Path, text: str, start: int, end: int) -> str:
    error = exc.errors()[0]
    key = str(error["loc"][0]) if error["loc"] else "?"
    if error["type"] == "missing":
        return f"{path}:{start + 1}: missing required key '{key}' in [[endpoint]]"
    line = key_line(text, key, start, end) or start + 1
    message = error["msg"].removeprefix("Value error, ")
    return f"{path}:{line}: bad value for '{key}' in [[endpoint]]: {message}"


def resolve_endpoint(
    name: str,
    *,
    endpoints: dict[str, list[Endpoint]] | None = None,
    path: str | Path = DEFAULT_PATH,
    base_url: str | None = None,
    api_key_var: str | None = None,
) -> list[Endpoint] | None:
    """The endpoints a `-m NAME` refers to.

    An explicit `base_url` (`-b`) wins: one endpoint serving model `name`, its key named by
    `api_key_var` (`-k`). Otherwise the registry's replicas of endpoint_id `name`. None when
    `name` is not registered: the caller treats it as a local model.
    """
    if base_url is not None:
        try:
            endpoint = Endpoint(endpoint_id=name, model=name, url=base_url, key=api_key_var)
        except ValidationError as exc:
            error = exc.errors()[0]
            option = "--base-url" if error["loc"] and error["loc"][0] == "url" else "--api-key-var"
            raise UserError(f"bad {option}: {error['msg'].removeprefix('Value error, ')}") from None
        endpoint._source = "command-line options"
        return [endpoint]
    registry = load_endpoints(path) if endpoints is None else endpoints
    return registry.get(name)


def api_key_from_env(var_name: str) -> str | None:
    """The key held by environment variable `var_name`; None when unset or empty."""
    return os.environ.get(var_name) or None


def client_for_endpoint(
    endpoints: list[Endpoint],
    *,
    return_tokens: bool = False,
    timeout_s: float | None = None,
    tries: int | None = None,
    default_timeout_s: float = DEFAULT_TIMEOUT_S,
    max_connections: int = 256,
    reasoning_parser: str | None = None,
) -> Client:
    """A client for one endpoint id: an `OpenAIClient`, or a `RoundRobinClient` over replicas.

    `timeout_s` and `tries` (the command line's) win over each endpoint's own `timeout` and
    `tries`, which win over the defaults. `reasoning_parser`: see `OpenAIClient`."""
    if not endpoints:
        raise UserError("no endpoint given")
    clients: list[Client] = []
    for endpoint in endpoints:
        api_key = None
        if endpoint.key is not None:
            api_key = api_key_from_env(endpoint.key)
            if api_key is None:
                raise UserError(
                    f"environment variable {endpoint.key} (named by endpoint '{endpoint.endpoint_id}' "
                    f"in {endpoint.source}) is not set"
                )
        clients.append(
            OpenAIClient(
                endpoint.url,
                endpoint.model,
                api_key=api_key,
                timeout_s=timeout_s or endpoint.timeout or default_timeout_s,
                tries=tries or endpoint.tries or DEFAULT_TRIES,
                max_connections=max_connections,
                return_tokens=return_tokens,
                reasoning_parser=reasoning_parser,
            )
        )
    return clients[0] if len(clients) == 1 else RoundRobinClient(clients)
