"""`workbench train export RUN --step N [--merge]`: a checkpoint as a standalone model folder.

With `--merge` a LoRA adapter is folded into its base weights (a plain Hugging Face model that
vLLM or transformers load without peft) — every adapter of its chain, when the run started from
another run's checkpoint; without it, the adapter folder is copied as is (still naming its base).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from workbench.errors import UserError
from workbench.train.checkpoint import STATE_JSON, STATE_PT, list_checkpoints, step_dir_name


def find_checkpoint(run_dir: Path, step: int | None) -> Path:
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise UserError(f"no complete checkpoints in {run_dir / 'checkpoints'}")
    if step is None:
        return checkpoints[-1]
    for checkpoint in checkpoints:
        if checkpoint.name == step_dir_name(step):
            return checkpoint
    steps = ", ".join(str(int(c.name.split("_")[1])) for c in checkpoints)
    raise UserError(f"no checkpoint for step {step} in {run_dir} (available steps: {steps})")


def export_checkpoint(run_dir: Path, step: int | None, merge: bool, output: Path | None) -> Path:
    from workbench.models.loading import adapter_base

    checkpoint = find_checkpoint(run_dir, step)
    suffix = "-merged" if merge else ""
    target = output or run_dir / "exports" / f"{checkpoint.name}{suffix}"
    if target.exists():
        raise UserError(f"{target} already exists; choose another --output or remove it")
    if merge and adapter_base(checkpoint) is not None:
        return write_merged_model(checkpoint, target)
    tmp = target.with_name(f".tmp_{target.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(checkpoint, tmp, ignore=shutil.ignore_patterns(STATE_PT, STATE_JSON))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(target)
    return target


def write_merged_model(checkpoint: Path, target: Path) -> Path:
    """`checkpoint` (a LoRA checkpoint: every adapter of its chain) folded into its base weights
    as a plain model folder at `target`, in the base model's own dtype. Written into a temp
    folder and renamed, so `target` is whole or absent."""
    from workbench.models.loading import load_plain_model

    tmp = target.with_name(f".tmp_{target.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    model, tokenizer = load_plain_model(checkpoint)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(target)
    return target
