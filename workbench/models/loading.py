"""Load any model folder as plain weights: a Hugging Face model, or a LoRA adapter folder (a
training checkpoint) resolved onto its base model and merged — recursively, since a run that
starts from a checkpoint writes adapters whose base is that checkpoint (RL on SFT on a base
model). Eval, serve, export, the distillation teacher and the trainer's starting weights all
load through `load_plain_model`, so every one of them sees the same weights for one name.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import UserError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
# Deeper than any real lineage (base -> SFT -> RL -> ...); a longer chain is a mistake, not work.
MAX_CHAIN = 32


def adapter_base(path: Path) -> str | None:
    """The base model an adapter folder was trained on (`base_model_name_or_path`, as peft wrote
    it), or None for a plain model folder."""
    config = path / ADAPTER_CONFIG
    if not config.is_file():
        return None
    try:
        settings = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{config} is not a readable adapter config: {str(exc).splitlines()[0]}") from None
    base = settings.get("base_model_name_or_path") if isinstance(settings, dict) else None
    if not base or not isinstance(base, str):
        raise UserError(f"{config} names no base_model_name_or_path")
    return base


@dataclass(frozen=True)
class AdapterChain:
    """What a model folder is made of: the plain model at the bottom (a local folder, or a hub
    id) and the LoRA adapters applied to it, innermost first (empty for a plain model)."""

    base: Path | str
    adapters: tuple[Path, ...]


def adapter_chain(source: Path | str) -> AdapterChain:
    """Follow `base_model_name_or_path` from `source` down to a plain model. Reads JSON only (no
    torch). UserError for a base that is not here, a loop, or an adapter without weights."""
    adapters: list[Path] = []
    seen: set[Path] = set()
    current: Path | str = source
    while isinstance(current, Path) and (base := adapter_base(current)) is not None:
        where = current.resolve()
        if where in seen:
            raise UserError(
                f"checkpoint {source} cannot be loaded: its chain of base models loops back to {current} "
                f"(adapter_config.json base_model_name_or_path)"
            )
        if len(adapters) == MAX_CHAIN:
            raise UserError(
                f"checkpoint {source} cannot be loaded: more than {MAX_CHAIN} adapters deep "
                f"(adapter_config.json base_model_name_or_path)"
            )
        if not any((current / name).is_file() for name in ADAPTER_WEIGHTS):
            raise UserError(f"checkpoint {current} has no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})")
        seen.add(where)
        adapters.append(current)
        current = _base_location(base, current)
    return AdapterChain(current, tuple(reversed(adapters)))


def _base_location(base: str, adapter: Path) -> Path | str:
    """A local folder (as peft wrote it: absolute, or relative to the working directory) or a
    hub id; UserError when it is neither."""
    path = Path(base).expanduser()
    if path.is_dir():
        return path
    from workbench.models.hub import HUB_ID

    if HUB_ID.match(base) and not base.startswith((".", "/", "~")):
        return base
    raise UserError(
        f"checkpoint {adapter} needs its base model '{base}', which is not here "
        f"(adapter_config.json base_model_name_or_path)"
    )


def load_plain_model(source: Path | str, *, dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) for `source` (what `inference.resolve.resolve_model_path` returns: a
    local folder or a hub id), with every adapter of its chain merged into plain weights, in eval
    mode. `model.name_or_path` is set to `source`, so a LoRA trained on top records `source` (the
    checkpoint, not the original base) as its base model. `dtype`: a torch dtype, None for the
    checkpoint's own. UserError, one line, for anything in the chain that cannot be loaded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models.hub import require_hub_model

    chain = adapter_chain(source)
    if isinstance(chain.base, str):
        require_hub_model(chain.base)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(chain.base), **({"dtype": dtype} if dtype is not None else {})
        )
    except (OSError, ValueError) as exc:
        needed = f" (the base model of {source})" if chain.adapters else ""
        raise UserError(f"could not load model '{chain.base}'{needed}: {str(exc).splitlines()[0]}") from exc
    if chain.adapters:
        for adapter in chain.adapters:
            model = _merge_adapter(model, adapter)
        model.requires_grad_(True)  # as from_pretrained gives it (peft froze the base to train its adapter)
    model.name_or_path = str(source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_source(chain)))
    except (OSError, ValueError) as exc:
        raise UserError(f"could not load the tokenizer of '{source}': {str(exc).splitlines()[0]}") from exc
    model.eval()
    return model, tokenizer


def _merge_adapter(model: Any, adapter: Path) -> Any:
    """`model` with the LoRA adapter in `adapter` folded into its weights."""
    from peft import PeftModel
    from safetensors import SafetensorError

    try:
        with quiet_peft():
            return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    except (OSError, ValueError, RuntimeError, KeyError, TypeError, SafetensorError) as exc:
        # garbage weights, a config peft cannot read, or an adapter made for another model's shapes
        raise UserError(
            f"could not load the LoRA adapter in {adapter}: {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else 'no detail'}"
        ) from exc


def tokenizer_source(chain: AdapterChain) -> Path | str:
    """The outermost folder of the chain that holds a tokenizer (checkpoints save theirs), else the base."""
    for adapter in reversed(chain.adapters):
        if (adapter / "tokenizer_config.json").is_file():
            return adapter
    return chain.base


def load_merged_adapter(path: Path) -> tuple[Any, Any]:
    """A checkpoint for inference (eval, serve): its whole chain merged, in float32 as the
    in-process client loads a plain folder on the CPU (`LocalClient`'s "auto"), so a checkpoint
    and its merged export generate alike."""
    import torch

    return load_plain_model(path, dtype=torch.float32)


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """peft 0.21 reads `model.is_gradient_checkpointing`, which transformers 5 deprecates with a
    FutureWarning printed by every LoRA load (the CLI hides warnings; the Python API did not): a
    note between the two libraries, nothing the user can act on. Silenced here only, for that
    message."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        yield
