"""Checkpoint folders of a training run, read without torch: `checkpoints/step_000050/`.

A checkpoint is complete once `trainer_state.json` is in it (it is written last, and the
folder is renamed into place), so a half-written one is never listed. Writing checkpoints
(torch, optimizer state) belongs to `workbench.train.checkpoint`; finding and describing
them belongs here, so the CLI, the TUI and model resolution share one reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.types import is_number

CHECKPOINTS = "checkpoints"
STEP_PREFIX = "step_"
STATE_PT = "trainer_state.pt"
STATE_JSON = "trainer_state.json"


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:06d}"


def checkpoint_step(checkpoint: Path) -> int:
    """The step of a checkpoint folder, from its name (step_000050 -> 50)."""
    return int(checkpoint.name[len(STEP_PREFIX) :])


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a complete one has trainer_state.json, written last)."""
    root = run_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith(STEP_PREFIX) and (p / STATE_JSON).is_file()
    ]
    return sorted(found, key=checkpoint_step)


def read_step_info(checkpoint: Path) -> dict[str, Any]:
    """trainer_state.json: step, base model, LoRA flag, the step's rewards and KL coefficient."""
    return json.loads((checkpoint / STATE_JSON).read_text())


def resolve_latest_run(path: Path) -> Path:
    """`<runs>/latest` (when no such folder exists): the run whose newest checkpoint is the
    newest. Any other path is returned as given."""
    if path.name == "latest" and not path.exists() and path.parent.is_dir():
        runs = [p for p in path.parent.iterdir() if p.is_dir() and list_checkpoints(p)]
        if not runs:
            raise UserError(f"no training run with a checkpoint in {path.parent}")
        return max(runs, key=lambda p: list_checkpoints(p)[-1].stat().st_mtime)
    return path


def training_run_checkpoint(path: Path) -> Path:
    """A training run folder means its newest complete checkpoint, and `<runs>/latest` the
    newest run that has one (`-m outputs/runs/latest` after `workbench train`). Any other path
    is returned as given."""
    path = resolve_latest_run(path)
    if (path / CHECKPOINTS).is_dir() and not (path / "config.json").is_file():
        checkpoints = list_checkpoints(path)
        if not checkpoints:
            raise UserError(f"training run {path} has no complete checkpoint yet")
        return checkpoints[-1]
    return path


def checkpoint_at(run_dir: Path, step: int) -> Path:
    """The complete checkpoint of `step`; UserError listing the steps there are otherwise."""
    for checkpoint in list_checkpoints(run_dir):
        if checkpoint_step(checkpoint) == step:
            return checkpoint
    steps = ", ".join(str(checkpoint_step(c)) for c in list_checkpoints(run_dir)) or "none"
    raise UserError(f"{run_dir} has no complete checkpoint of step {step} (checkpoints: {steps})")


def set_aside_after(run_dir: Path, step: int, stamp: str) -> Path | None:
    """Move the checkpoints after `step` into `checkpoints/set-aside-<stamp>/` (a run resumed from
    an earlier step writes those steps again); None when there were none. Nothing is deleted."""
    later = [c for c in list_checkpoints(run_dir) if checkpoint_step(c) > step]
    if not later:
        return None
    target = run_dir / CHECKPOINTS / f"set-aside-{stamp}"
    target.mkdir(parents=True, exist_ok=True)
    for checkpoint in later:
        checkpoint.rename(target / checkpoint.name)
    return target


@dataclass
class CheckpointInfo:
    """One complete checkpoint folder."""

    step: int
    path: Path
    saved_at: datetime | None
    reward: float | None
    eval_reward: float | None
    size_bytes: int


def folder_size(path: Path) -> int:
    total = 0
    for item in path.rglob("*"):
        try:
            if item.is_file():
                total += item.stat().st_size
        except OSError:
            continue
    return total


def list_checkpoint_infos(run_dir: Path) -> list[CheckpointInfo]:
    """Complete checkpoints (the trainer's own rule: trainer_state.json written last), oldest first."""
    infos = []
    for path in list_checkpoints(run_dir):
        try:
            state = read_step_info(path)
            saved = datetime.fromtimestamp((path / STATE_JSON).stat().st_mtime).astimezone()
        except (OSError, ValueError):
            continue
        infos.append(
            CheckpointInfo(
                step=int(state.get("step", 0)),
                path=path,
                saved_at=saved,
                reward=_num(state.get("reward_mean")),
                eval_reward=_num(state.get("eval_reward_mean")),
                size_bytes=folder_size(path),
            )
        )
    return infos


def _num(value: Any) -> float | None:
    return float(value) if is_number(value) else None
