"""The prompt optimizers `gepa run --optimizer` takes: in the config layer so that the GEPA
service's config and the TUI's launcher (which may not import services) read one list."""

from __future__ import annotations

from typing import Literal, get_args

OptimizerName = Literal["gepa", "miprov2", "bootstrap"]
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)
DSPY_OPTIMIZERS = ("miprov2", "bootstrap")  # the ones that need the dspy extra
