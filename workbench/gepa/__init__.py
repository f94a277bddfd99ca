"""Prompt optimization: `run_gepa` evolves an environment's system prompt with the `gepa`
library, or (`optimizer = "miprov2" | "bootstrap"`) searches prompt and few-shot demonstrations
with DSPy's optimizers; every candidate is scored through the shared rollout engine
(`scoring.py`, DESIGN §8).

Import-light on purpose: `gepa` and `dspy` are imported only when a run starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.gepa.config import GepaConfig

if TYPE_CHECKING:
    from workbench.events import Reporter
    from workbench.gepa.service import GepaResult

__all__ = ["GepaConfig", "GepaResult", "run_gepa"]


def run_gepa(
    config: GepaConfig, reporter: Reporter | None = None, *, resume: str | None = None
) -> GepaResult:
    """Run (or with `resume`, continue) a GEPA optimization; blocking. See workbench.gepa.service."""
    from workbench.gepa.service import run_gepa as _run_gepa

    return _run_gepa(config, reporter, resume=resume)


def __getattr__(name: str) -> Any:
    if name == "GepaResult":
        from workbench.gepa.service import GepaResult

        return GepaResult
    raise AttributeError(name)
