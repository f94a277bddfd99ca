"""Training: `workbench train CONFIG.toml` (RL on environments, or SFT on demonstrations).

Import-light on purpose (no torch here): the config schema, its loader, the plan and the front
door are pydantic and stdlib only; the loop, which needs torch, is imported when a run starts.
The front door is `run_train` (workbench.train.service).
"""

from __future__ import annotations

from workbench.train.config import (
    TrainConfig,
    config_for_saving,
    config_source,
    load_env_files,
    load_train_config,
    model_notes,
    rank_blockers,
    run_blockers,
    save_resolved_config,
)
from workbench.train.plan import build_plan
from workbench.train.service import Outcome, TrainingFailed, TrainResult, is_rank_zero, outcome, run_train

__all__ = [
    "Outcome",
    "TrainConfig",
    "TrainResult",
    "TrainingFailed",
    "build_plan",
    "config_for_saving",
    "config_source",
    "is_rank_zero",
    "load_env_files",
    "load_train_config",
    "model_notes",
    "outcome",
    "rank_blockers",
    "run_blockers",
    "run_train",
    "save_resolved_config",
]
