"""Reload a served model's base weights from a model folder, in place (full fine-tuning's
weight sync: what `POST /update_weights {"weight_dir": ...}` does, as in prime-rl).

The tensors are copied into the existing parameters rather than loading a second model,
so a reload needs no extra memory beyond one tensor at a time, and LoRA adapters loaded on
the model stay attached (peft keeps the base weight under `.base_layer.`).

Everything is checked against the safetensors headers *before* the first copy (every
tensor the folder has must exist in the model with the same shape, and every parameter
must be in the folder): a wrong folder fails with nothing changed, never half-loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workbench.errors import InferenceError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class WeightReloadError(InferenceError):
    """The folder cannot replace the served weights; `status` 404 (no such folder) or 400."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message, transient=False, status=status)


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a `save_pretrained` folder (one file, or the shards of an index)."""
    if not folder.is_dir():
        raise WeightReloadError(f"weight_dir {folder} does not exist", status=404)
    if (folder / "adapter_config.json").is_file():
        raise WeightReloadError(
            f"{folder} is a LoRA adapter, not full weights: load it with /v1/load_lora_adapter"
        )
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise WeightReloadError(f"{index} is not a valid safetensors index: {exc}") from exc
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise WeightReloadError(f"{folder} is missing weight shards: {', '.join(missing)}")
        return [folder / s for s in shards]
    raise WeightReloadError(
        f"no {SINGLE_FILE} or {INDEX_FILE} in {folder} (save the model with save_pretrained)"
    )


def _canonical(name: str) -> str:
    """A parameter name as a plain checkpoint spells it (peft wraps adapted layers)."""
    return name.replace(".base_layer.", ".")


def _model_tensors(model: Any) -> tuple[dict[str, Any], set[str]]:
    """(checkpoint name -> tensor) for parameters and persistent buffers; and the names of
    the parameters (which the folder must all provide). LoRA weights are not base weights."""
    tensors: dict[str, Any] = {}
    params: set[str] = set()
    for name, _param in model.named_parameters():  # tied weights once: the folder may store one copy
        if ".lora_" not in name:
            params.add(_canonical(name))
    for name, param in model.named_parameters(remove_duplicate=False):  # ... or both names
        if ".lora_" not in name:
            tensors[_canonical(name)] = param
    for name, buffer in model.named_buffers():
        tensors.setdefault(_canonical(name), buffer)
    return tensors, params


def load_weights_in_place(model: Any, folder: str | Path) -> int:
    """Copy the weights in `folder` into `model`; returns how many tensors were copied.
    The caller holds whatever lock keeps generation off the model meanwhile."""
    import torch
    from safetensors import safe_open

    folder = Path(folder).expanduser()
    files = safetensors_files(folder)
    targets, required = _model_tensors(model)

    plan: list[tuple[Path, str, Any]] = []
    for file in files:
        with safe_open(str(file), framework="pt") as reader:
            for key in reader.keys():
                target = targets.get(key)
                if target is None:
                    raise WeightReloadError(
                        f"{file.name} has tensor '{key}', which the served model does not have "
                        "(weights of a different architecture?)"
                    )
                shape = tuple(reader.get_slice(key).get_shape())
                if shape != tuple(target.shape):
                    raise WeightReloadError(
                        f"tensor '{key}' in {file.name} has shape {list(shape)}, the served model's "
                        f"is {list(target.shape)} (weights of a different model size?)"
                    )
                plan.append((file, key, target))
    provided = {key for _, key, _ in plan}
    missing = sorted(required - provided)
    if missing:
        raise WeightReloadError(f"{folder} lacks {len(missing)} of the model's weights, e.g. '{missing[0]}'")

    with torch.no_grad():
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as reader:
                for _, key, target in (p for p in plan if p[0] == file):
                    target.copy_(reader.get_tensor(key))
    return len(plan)
