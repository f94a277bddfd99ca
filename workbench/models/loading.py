"""Load any model folder for inference: a plain Hugging Face model, or a LoRA adapter folder
(a training checkpoint) resolved onto its base model and merged, so eval and serve treat
checkpoints like any other model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workbench.errors import UserError


def adapter_base(path: Path) -> str | None:
    """The base model an adapter folder was trained on, or None for a plain model folder."""
    config = path / "adapter_config.json"
    if not config.is_file():
        return None
    base = json.loads(config.read_text()).get("base_model_name_or_path")
    if not base:
        raise UserError(f"{config} names no base_model_name_or_path")
    return base


def load_merged_adapter(path: Path) -> tuple[Any, Any]:
    """Base model + adapter, merged into plain weights (fast to generate with)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models.hub import require_hub_model

    base = adapter_base(path)
    assert base is not None
    if not Path(base).is_dir():
        require_hub_model(base)
    try:
        model = AutoModelForCausalLM.from_pretrained(base)
    except OSError as exc:
        raise UserError(f"checkpoint {path} needs its base model '{base}', which could not be loaded: "
                        f"{str(exc).splitlines()[0]}") from exc
    model = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    tokenizer_dir = path if (path / "tokenizer_config.json").is_file() else base
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    model.eval()
    return model, tokenizer
