"""Checkpoints: `checkpoints/step_000050/` with the adapter (or full weights) in save_pretrained
format, the tokenizer, and `trainer_state.pt` (optimizer, scheduler, RNG states) +
`trainer_state.json` (step, base model, metrics).

Written into a hidden temporary folder and renamed into place, so a half-written checkpoint
(a SIGKILL, a full disk) is never picked up; resume takes the newest complete one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.store.checkpoints import (
    CHECKPOINTS,
    STATE_JSON,
    STATE_PT,
    checkpoint_step,
    list_checkpoints,
    step_dir_name,
    write_manifest,
)

if TYPE_CHECKING:
    from workbench.train.policy import Policy


def rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    run_dir: Path,
    step: int,
    policy: Policy,
    optimizer: Any,
    scheduler: Any,
    info: dict[str, Any],
    keep: int,
    states: tuple[dict[str, Any] | None, dict[str, Any]] | None = None,
    keep_every: int | None = None,
) -> Path:
    """Write step `step` atomically; then prune (`prune_checkpoints`). OSError leaves the
    previous checkpoints untouched (the temporary folder is removed). `states`: (model state dict,
    optimizer state) gathered beforehand when the live ones are sharded (FSDP); None: use them."""
    import torch

    root = run_dir / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp_{step_dir_name(step)}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        model_state, optimizer_state = states or (None, optimizer.state_dict())
        policy.save_pretrained(tmp, model_state)
        policy.tokenizer.save_pretrained(tmp)
        torch.save(
            {"optimizer": optimizer_state, "scheduler": scheduler.state_dict(), "rng": rng_state()},
            tmp / STATE_PT,
        )
        (tmp / STATE_JSON).write_text(
            json.dumps({"step": step, "base_model": policy.base_path, "lora": policy.lora, **info}, indent=2)
        )
        write_manifest(tmp)  # last: what a complete checkpoint holds (store.checkpoints)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune_checkpoints(run_dir, keep, keep_every)
    return final


def prune_checkpoints(run_dir: Path, keep: int, keep_every: int | None = None) -> list[Path]:
    """Delete all complete checkpoints but the newest `keep` (0 keeps all) and those whose step
    is a multiple of `keep_every` (kept permanently). Returns the deleted folders."""
    if keep <= 0:
        return []
    deleted = [
        old
        for old in list_checkpoints(run_dir)[:-keep]
        if not (keep_every and checkpoint_step(old) % keep_every == 0)
    ]
    for old in deleted:
        shutil.rmtree(old, ignore_errors=True)
    return deleted


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    import torch

    # map_location: every rank of a multi-GPU run reads rank 0's file onto the CPU, not cuda:0
    return torch.load(checkpoint / STATE_PT, weights_only=False, map_location="cpu")
