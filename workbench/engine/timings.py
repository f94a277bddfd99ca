"""What the services share about timing runs (DESIGN §2: shared things go down a layer): which
model a run's speed belongs to (`identify_model`), and an eval's line in the workspace's
`outputs/timings.jsonl` (`record_eval`; training writes its own: `train/run_timer.py`).

Torch-free: it reads model folders' JSON and safetensors headers, never weights.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.store.runs import now_iso
from workbench.store.timings import EvalTiming, append_timing, machine_load, this_machine


@dataclass(frozen=True)
class ModelIdentity:
    """A model as far as speed goes: an adapter (a training checkpoint) runs at its base model's
    speed once merged, so `key` is the base model's folder (or its hub id)."""

    key: str
    label: str  # 'tiny', a folder's name or a hub id
    params: int | None  # parameters of the base model, None when its files are not here


def identify_model(model: str) -> ModelIdentity:
    """`model` as the user named it (a named model, a folder, a run or checkpoint, a hub id)."""
    from workbench.inference.resolve import resolve_model_path
    from workbench.models.loading import adapter_chain
    from workbench.workspace import NAMED_MODELS, named_model_dir

    try:
        base = adapter_chain(resolve_model_path(model)).base
    except UserError:  # not built or fetched yet, a typo: a name without measurements
        return ModelIdentity(model, model, None)
    if isinstance(base, str):  # a hub id
        return ModelIdentity(base, base, None)
    where = base.resolve()
    named = [name for name in NAMED_MODELS if named_model_dir(name).resolve() == where]
    return ModelIdentity(str(where), named[0] if named else where.name, count_parameters(where))


def count_parameters(folder: Path) -> int | None:
    """Parameters in a model folder's safetensors files, from their headers (each starts with the
    length of a JSON table of tensor shapes); None without safetensors."""
    files = sorted(folder.glob("*.safetensors"))
    total = 0
    for file in files:
        try:
            with file.open("rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header: dict[str, Any] = json.loads(f.read(length))
        except (OSError, ValueError, struct.error):
            return None
        total += sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
    return total or None


def record_eval(
    *,
    run_id: str,
    env_id: str,
    model: str,
    client: object,
    max_concurrent: int,
    summary: dict[str, Any],
    rollouts_s: float,
) -> None:
    """Append a finished eval's throughput to the workspace's timings. Best effort: a timing that
    cannot be written (a full disk) costs the next estimate, never the eval."""
    rollouts = int(summary.get("num_rollouts") or 0)
    if rollouts == 0 or rollouts_s <= 0:
        return
    # A LocalClient generates in this process; any other client's speed is a server's. Nothing is
    # imported to tell: if local_client was never imported, the client cannot be one.
    local_module = sys.modules.get("workbench.inference.local_client")
    local = local_module is not None and isinstance(client, local_module.LocalClient)
    identity = identify_model(model)
    try:
        append_timing(
            EvalTiming(
                run_id=run_id,
                recorded_at=now_iso(),
                machine=this_machine(),
                model=model,
                model_key=identity.key,
                model_label=identity.label,
                params=identity.params,
                load=machine_load(),
                env_id=env_id,
                local=local,
                rollouts=rollouts,
                max_concurrent=max_concurrent,
                prompt_tokens=float(summary.get("prompt_tokens_mean") or 0.0),
                completion_tokens=float(summary.get("completion_tokens_mean") or 0.0),
                rollouts_s=rollouts_s,
            )
        )
    except OSError:
        pass
