"""`Bounded`: the base of every config model (eval, GEPA, each training section). Numbers are
checked at the door, so a dry run that says "valid" means the run will validate too: floats must
be finite (`1e400` in TOML is infinity; `-T inf`), and integers fit in 32 bits (`--set
max_steps=1e23` or `--seed 1e23` used to pass and crash later; seeds and counts go to torch,
numpy and servers that take at most that)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

MAX_INT = 2**31 - 1


class Bounded(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _int_in_range(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT <= value <= MAX_INT:
            raise ValueError(f"{value:.3g} is out of range (at most {MAX_INT:,})")
        return value


MAX_NESTING = 64  # lists/tables inside each other: far beyond any real config, far below Python's stack


def nesting_depth(value: Any) -> int:
    """How deeply lists and dicts nest in `value` (iteratively: no recursion to run out of)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        else:
            continue
        deepest = max(deepest, depth + 1)
    return deepest


def too_deep(value: Any) -> bool:
    return nesting_depth(value) > MAX_NESTING
