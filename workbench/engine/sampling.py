"""The one sampling policy shared by eval, training and GEPA.

Settings are layered, the most specific last: built-in defaults < the environment's own
`sampling_args` (e.g. gsm8k's longer `max_tokens`) < the run's config < command-line flags.
A layer only holds what its author actually set, so an unset config field never hides the
environment's preference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from workbench.errors import UserError
from workbench.types import SamplingParams


class SamplingFlags(Protocol):
    """The sampling fields eval and GEPA configs share (-t, -T, -S, --seed)."""

    max_tokens: int | None
    temperature: float | None
    sampling_args: dict[str, Any]
    seed: int | None


def resolve_sampling(*layers: Mapping[str, Any], seed: int | None) -> SamplingParams:
    """SamplingParams from `layers` applied in order (later wins), with `seed`. Bad values
    (a string where a number goes) are one UserError line."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer)
    merged["seed"] = seed
    try:
        return SamplingParams().merged(merged)
    except TypeError as exc:
        raise UserError(f"bad sampling arguments: {exc}") from exc


def flag_layer(config: SamplingFlags) -> dict[str, Any]:
    """What -t/-T and then -S set (-S is the more specific: it names the server's keys)."""
    layer: dict[str, Any] = {}
    if config.max_tokens is not None:
        layer["max_tokens"] = config.max_tokens
    if config.temperature is not None:
        layer["temperature"] = config.temperature
    layer.update(config.sampling_args)
    return layer


def sampling_for(config: SamplingFlags, env_defaults: Mapping[str, Any]) -> SamplingParams:
    """Eval and GEPA: defaults < the environment's preferences < -t/-T < -S."""
    return resolve_sampling(env_defaults, flag_layer(config), seed=config.seed)
