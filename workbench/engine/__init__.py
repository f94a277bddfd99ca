"""THE rollout engine: every eval, training step and GEPA evaluation runs rollouts through here."""

from workbench.engine.retry import RetryingClient, RetryPolicy
from workbench.engine.rollouts import EngineStats, run_rollouts

__all__ = ["EngineStats", "RetryPolicy", "RetryingClient", "run_rollouts"]
