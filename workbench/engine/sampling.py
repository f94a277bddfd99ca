"""The one sampling policy shared by eval, training and GEPA.

Settings are layered, the most specific last: built-in defaults < the environment's own
`sampling_args` (e.g. gsm8k's longer `max_tokens`) < the run's config < command-line flags.
A layer only holds what its author actually set, so an unset config field never hides the
environment's preference.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
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
# Settings OpenAI-compatible servers (OpenAI, vLLM) know. Others still reach the server (a server
# may have its own), but one within a typo of these ('top_pp') is refused, naming the right one.
SERVER_KEYS = frozenset(
    {
        *EXTRA_RANGES,
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "max_completion_tokens",
        "min_tokens",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "response_format",
        "reasoning_effort",
        "chat_template_kwargs",
        "best_of",
        "length_penalty",
        "truncate_prompt_tokens",
        "structured_outputs",
        "bad_words",
        "allowed_token_ids",
        "prompt_logprobs",
        "return_tokens_as_token_ids",
        "parallel_tool_calls",
        "tool_choice",
        "extra_body",
    }
)


def validated(params: SamplingParams) -> SamplingParams:
    """`params` with each known setting of the right type (a number given as a string is read as
    one) and range; UserError naming the setting otherwise."""
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
    known = {f for f in SamplingParams.__dataclass_fields__ if f != "extra"} | SERVER_KEYS
    for name in checked.extra:
        if name not in known and (close := difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)):
            raise UserError(f"unknown sampling argument '{name}' (did you mean '{close[0]}'?)")
    for name, value in dataclasses.asdict(checked).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"bad sampling argument '{name}': {value} is not a finite number")
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
