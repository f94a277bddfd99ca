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
from workbench.types import SamplingParams, is_number


class SamplingFlags(Protocol):
    """The sampling fields eval and GEPA configs share (-t, -T, -S, --seed); read only, so a
    config whose field is narrower (GEPA's `seed: int`) fits."""

    @property
    def max_tokens(self) -> int | None: ...
    @property
    def temperature(self) -> float | None: ...
    @property
    def sampling_args(self) -> dict[str, Any]: ...
    @property
    def seed(self) -> int | None: ...


def resolve_sampling(*layers: Mapping[str, Any], seed: int | None) -> SamplingParams:
    """SamplingParams from `layers` applied in order (later wins), with `seed`. Bad values
    (a string where a number goes) are one UserError line."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer)
    merged["seed"] = seed
    try:
        params = SamplingParams().merged(merged)
    except TypeError as exc:
        raise UserError(f"bad sampling arguments: {exc}") from exc
    return validated(params)


# What each setting must be, checked before any rollout (a wrong value would fail every request).
RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0, float("inf")),
    "top_p": (0, 1),
    "max_tokens": (1, float("inf")),
    "n": (1, float("inf")),
    "top_k": (-1, float("inf")),
}
# Server knobs (SamplingParams.extra) that the in-process model honours too, so they are checked alike.
EXTRA_RANGES: dict[str, tuple[float, float]] = {"min_p": (0, 1), "repetition_penalty": (1e-6, float("inf"))}


def validated(params: SamplingParams) -> SamplingParams:
    """`params` with each known setting of the right type (a number given as a string is read as
    one) and range; UserError naming the setting otherwise."""
    import dataclasses

    from pydantic import TypeAdapter, ValidationError

    try:
        checked = TypeAdapter(SamplingParams).validate_python(dataclasses.asdict(params))
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserError(
            f"bad sampling argument '{'.'.join(str(p) for p in err['loc'])}': {err['msg']}"
        ) from None
    for name, (low, high) in RANGES.items():
        value = getattr(checked, name)
        if not low <= value <= high:
            raise UserError(f"bad sampling argument '{name}': {value} is out of range ({low:g} to {high:g})")
    for name, (low, high) in EXTRA_RANGES.items():
        value = checked.extra.get(name)
        if value is None:
            continue
        if not is_number(value) or not low <= value <= high:
            raise UserError(
                f"bad sampling argument '{name}': {value!r} is not a number from {low:g} to {high:g}"
            )
    return checked


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
