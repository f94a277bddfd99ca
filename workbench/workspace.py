"""The on-disk layout of a workspace (DESIGN §9). Every path the code writes comes from here.

The workspace is the current directory, or `$WORKBENCH_WORKSPACE` when set.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path

TINY_MODEL_NAME = "tiny"
TINY_QWEN_MODEL_NAME = "tiny-qwen"  # Qwen3 architecture + Qwen's real vocabulary (models/tiny_qwen.py)
SMOLLM2_MODEL_NAME = "smollm2-135m"  # a real pretrained model, fetched by `setup --model` (models/smollm2.py)
# Models named by a short name and kept under outputs/models/<name>/: built or fetched by `setup`.
NAMED_MODELS = (TINY_MODEL_NAME, TINY_QWEN_MODEL_NAME, SMOLLM2_MODEL_NAME)
# Where each kind of run keeps its run folders, as glob patterns under the workspace root.
RUN_FOLDERS = {
    "eval": "environments/*/outputs/evals/*/*",
    "train": "outputs/runs/*",
    "gepa": "environments/*/outputs/gepa/*/*",
}


def workspace_root() -> Path:
    return Path(os.environ.get("WORKBENCH_WORKSPACE") or Path.cwd()).resolve()


def environments_dir(root: Path | None = None) -> Path:
    return (root or workspace_root()) / "environments"


def configs_dir(root: Path | None = None) -> Path:
    return (root or workspace_root()) / "configs"


def endpoints_path(root: Path | None = None) -> Path:
    return configs_dir(root) / "endpoints.toml"


def tiny_model_dir(root: Path | None = None) -> Path:
    return named_model_dir(TINY_MODEL_NAME, root)


def tiny_qwen_model_dir(root: Path | None = None) -> Path:
    return named_model_dir(TINY_QWEN_MODEL_NAME, root)


def named_model_dir(name: str, root: Path | None = None) -> Path:
    """Where a named model (`NAMED_MODELS`) lives: outputs/models/<name>/."""
    return (root or workspace_root()) / "outputs" / "models" / name


def runs_dir(root: Path | None = None) -> Path:
    return (root or workspace_root()) / "outputs" / "runs"


def slug(text: str) -> str:
    """A file-name-safe form of a model or env name: 'Qwen/Qwen3-4B' -> 'Qwen--Qwen3-4B'."""
    text = text.rstrip("/").replace("/", "--")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text) or "model"


def model_label(model: str) -> str:
    """How a model is named in output folders: local paths by their last part(s), ids as given."""
    from workbench.errors import UserError
    from workbench.store.checkpoints import training_run_checkpoint

    try:
        path = training_run_checkpoint(Path(model))  # a run folder or runs/latest: its checkpoint
    except UserError:
        path = Path(model)
    if path.exists():
        parts = path.resolve().parts
        # checkpoints are named step_000040: keep the run name in front so folders stay unique
        return slug("-".join(parts[-3:]) if parts[-1].startswith("step_") else parts[-1])
    return slug(model)


def new_run_id() -> str:
    """Sortable, unique enough for one workspace: 20261122-014709-3f2a."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{os.urandom(2).hex()}"


def eval_runs_dir(env_name: str, model: str, root: Path | None = None) -> Path:
    name = env_name.split("/")[-1].replace("-", "_")
    return (
        environments_dir(root)
        / name
        / "outputs"
        / "evals"
        / f"{slug(env_name.split('/')[-1])}--{model_label(model)}"
    )


def gepa_runs_dir(env_name: str, model: str, root: Path | None = None) -> Path:
    """environments/<env>/outputs/gepa/<env>--<model>/ (a run is a <run_id>/ folder inside)."""
    name = env_name.split("/")[-1].replace("-", "_")
    return (
        environments_dir(root)
        / name
        / "outputs"
        / "gepa"
        / f"{slug(env_name.split('/')[-1])}--{model_label(model)}"
    )
