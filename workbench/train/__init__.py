"""Training: `workbench train CONFIG.toml` (RL on environments, or SFT on demonstrations).

Import-light on purpose (no torch here): the config schema, its loader and the plan are
pydantic only; the loop, which needs torch, is imported when a run starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.train.config import (
    TrainConfig, config_for_saving, load_env_files, load_train_config, run_blockers, save_resolved_config,
)

__all__ = ["TrainConfig", "config_for_saving", "load_env_files", "load_train_config", "run_blockers",
           "run_train", "save_resolved_config"]


def run_train(config: TrainConfig, reporter: Any = None, *, resume: str | Path | None = None) -> Any:
    """Run training (blocking); `resume` is a run folder to continue. See workbench.train.loop."""
    from workbench.train.loop import run_train as _run_train

    return _run_train(config, reporter, resume=resume)
