"""Secrets stay out of configs: a config names the environment variable that holds a key
(`-k OPENAI_API_KEY`, `api_key_var = "..."`), never the key itself."""

from __future__ import annotations

import re

ENV_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NOT_A_NAME = (
    "takes the NAME of an environment variable that holds the key (e.g. OPENAI_API_KEY), not the key "
    "itself; the value given is not shown"
)


def key_variable_name(value: str | None) -> str | None:
    """`value` when it can be a variable name. ValueError otherwise, whose message never holds the
    value: it is most likely the key, pasted where its variable's name belongs."""
    if value is not None and not ENV_VAR_NAME.match(value):
        raise ValueError(NOT_A_NAME)
    return value
