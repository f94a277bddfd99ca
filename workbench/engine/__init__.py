"""THE rollout engine: every eval, training step and GEPA evaluation runs rollouts through here.

Its names are imported on first use (PEP 562), so the torch-free helpers the TUI reads
(`engine.difficulty`, `engine.summary`) load without the rollout machinery and the
environment package behind it (which pulls transformers: 2.3 s on this machine)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.engine.retry import RetryingClient, RetryPolicy
    from workbench.engine.rollouts import EngineStats, run_rollouts

_HOME = {
    "RetryingClient": "retry",
    "RetryPolicy": "retry",
    "EngineStats": "rollouts",
    "run_rollouts": "rollouts",
}

__all__ = ["EngineStats", "RetryPolicy", "RetryingClient", "run_rollouts"]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'workbench.engine' has no attribute {name!r}")
    return getattr(import_module(f"workbench.engine.{home}"), name)
