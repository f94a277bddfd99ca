"""Checkpoint folders of a training run, read without torch: `checkpoints/step_000050/`.

A checkpoint is complete when its `manifest.json` (written last, then the folder is renamed into
place) lists every file with its size and sha256, and the files are there at those sizes (JSON
configs only need to be there: a user may re-point an adapter's base model by hand): a
half-written one is never listed, and neither is one damaged later (a deleted or truncated
adapter). `verify_checkpoint(..., hashes=True)` also checks the contents, before a checkpoint is
resumed or loaded. Checkpoints written before manifests count as complete with
`trainer_state.json` (and, checked before loading, their weights' config). Writing checkpoints
(torch, optimizer state) belongs to `workbench.train.checkpoint`; finding and describing
them belongs here, so the CLI, the TUI and model resolution share one reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.store.files import file_sha256
from workbench.types import is_number

CHECKPOINTS = "checkpoints"
STEP_PREFIX = "step_"
STATE_PT = "trainer_state.pt"
STATE_JSON = "trainer_state.json"
MANIFEST = "manifest.json"
WEIGHTS_CONFIGS = ("adapter_config.json", "config.json")  # a LoRA adapter, or full weights


def write_manifest(folder: Path) -> None:
    """List every file of `folder` (sizes, sha256) in its manifest.json, with the time it was
    saved (a file's mtime changes when a run folder is copied or restored): call it last."""
    files = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    saved_at = datetime.now(UTC).isoformat(timespec="seconds")
    (folder / MANIFEST).write_text(json.dumps({"saved_at": saved_at, "files": files}, indent=1))


def saved_time(checkpoint: Path) -> datetime | None:
    """When the checkpoint was written: its manifest's `saved_at`; for one written before
    manifests had it, trainer_state.json's mtime (all there is). None when neither is readable."""
    try:
        stamp = json.loads((checkpoint / MANIFEST).read_text()).get("saved_at")
        return datetime.fromisoformat(stamp).astimezone()
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    try:
        return datetime.fromtimestamp((checkpoint / STATE_JSON).stat().st_mtime).astimezone()
    except OSError:
        return None


def checkpoint_problem(checkpoint: Path, *, hashes: bool = False) -> str | None:
    """What is wrong with a checkpoint folder (one phrase), or None when it is complete. Sizes
    are checked always, contents (sha256) with `hashes`."""
    manifest_path = checkpoint / MANIFEST
    if not manifest_path.is_file():  # written before manifests: the old completeness rule
        if not (checkpoint / STATE_JSON).is_file():
            return f"no {STATE_JSON} (not completely written)"
        if hashes and not any((checkpoint / name).is_file() for name in WEIGHTS_CONFIGS):
            return "its weights are missing (no adapter_config.json or config.json)"
        return None
    try:
        files = json.loads(manifest_path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {MANIFEST} is unreadable"
    for name, expected in files.items():
        path = checkpoint / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if name.endswith(".json"):  # configs users may edit by hand (a base model moved): there, not checked
            continue
        if size != expected["size"]:
            return f"{name} has {size:,} bytes, {expected['size']:,} were written"
        if hashes and file_sha256(path) != expected["sha256"]:
            return f"{name} has changed since it was written (sha256 differs)"
    return None


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:06d}"


def checkpoint_step(checkpoint: Path) -> int:
    """The step of a checkpoint folder, from its name (step_000050 -> 50)."""
    return int(checkpoint.name[len(STEP_PREFIX) :])


def checkpoint_folders(run_dir: Path) -> list[Path]:
    """Every `step_N` folder of the run, complete or not, oldest first."""
    root = run_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX)]
    return sorted(found, key=checkpoint_step)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints (`checkpoint_problem` finds nothing wrong), oldest first."""
    return [p for p in checkpoint_folders(run_dir) if checkpoint_problem(p) is None]


def damaged_checkpoints(run_dir: Path) -> list[tuple[Path, str]]:
    """(folder, what is wrong) for each step folder that is not a complete checkpoint."""
    return [(p, why) for p in checkpoint_folders(run_dir) if (why := checkpoint_problem(p)) is not None]


def require_intact(checkpoint: Path) -> Path:
    """`checkpoint` when its files are all there as written (contents checked); UserError saying
    what is damaged otherwise."""
    if (problem := checkpoint_problem(checkpoint, hashes=True)) is not None:
        raise UserError(f"checkpoint {_relative(checkpoint)} is damaged: {problem}")
    return checkpoint


def _relative(path: Path) -> Path:
    """`path` from the working directory when it is under it (as the user would name it)."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


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


def newest_checkpoint(run_dir: Path) -> Path:
    """The newest complete checkpoint of training run folder `run_dir` (its files checked by size,
    not hashed). UserError when there is none, or when a newer one was written whole (it has a
    manifest or trainer state) but is damaged now: loading an older one instead would mislead,
    so the error says which one and what is wrong."""
    checkpoints = list_checkpoints(run_dir)
    newest = checkpoints[-1] if checkpoints else None
    for folder, why in reversed(damaged_checkpoints(run_dir)):
        written = (folder / MANIFEST).is_file() or (folder / STATE_JSON).is_file()
        if written and (newest is None or checkpoint_step(folder) > checkpoint_step(newest)):
            older = f"; name an older one: -m {_relative(newest)}" if newest else ""
            raise UserError(f"checkpoint {_relative(folder)} is damaged: {why}{older}")
    if newest is None:
        raise UserError(f"training run {run_dir} has no complete checkpoint yet")
    return newest


def training_run_checkpoint(path: Path) -> Path:
    """A training run folder means its newest complete checkpoint, and `<runs>/latest` the
    newest run that has one (`-m outputs/runs/latest` after `workbench train`). Any other path
    is returned as given."""
    path = resolve_latest_run(path)
    if (path / CHECKPOINTS).is_dir() and not (path / "config.json").is_file():
        return require_intact(newest_checkpoint(path))
    if (path / STATE_JSON).is_file() or (path / MANIFEST).is_file():  # one checkpoint folder
        return require_intact(path)
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
    later = [c for c in checkpoint_folders(run_dir) if checkpoint_step(c) > step]
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
        except (OSError, ValueError):
            continue
        infos.append(
            CheckpointInfo(
                step=int(state.get("step", 0)),
                path=path,
                saved_at=saved_time(path),
                reward=_num(state.get("reward_mean")),
                eval_reward=_num(state.get("eval_reward_mean")),
                size_bytes=folder_size(path),
            )
        )
    return infos


def _num(value: Any) -> float | None:
    return float(value) if is_number(value) else None
