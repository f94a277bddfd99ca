"""The policy being trained: a Hugging Face causal LM, with a peft LoRA adapter by default.

The reference policy for the KL penalty costs nothing with LoRA (the same model with the
adapter disabled); with full fine-tuning it is a frozen copy of the starting weights.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.models.loading import quiet_peft
from workbench.train.schema import TrainConfig


@dataclass
class Policy:
    model: Any  # the trainable module (a PeftModel when LoRA is on)
    tokenizer: Any
    base_path: str  # what `model` was loaded from (recorded in checkpoints)
    lora: bool
    reference: Any = None  # frozen copy for full fine-tuning with a KL penalty
    wrapped: Any = None  # DDP/FSDP wrapper that training passes go through (multi-process runs)

    def save_pretrained(self, folder: Path, state_dict: dict[str, Any] | None = None) -> None:
        """The model's weights (a LoRA adapter's alone) in save_pretrained form; `state_dict`:
        gathered beforehand when the live weights are sharded (FSDP).

        A LoRA adapter whose targets leave the embeddings alone is saved with peft's
        `save_embedding_layers=False` (training never resizes the vocabulary). Left to peft
        ("auto"), it looks for the base model's config.json, and when the base is itself a
        checkpoint (RL from an SFT run) asks the Hugging Face hub about that local path and,
        offline, prints "Could not find a config file in ..." at every save and weight push."""
        settings: dict[str, Any] = {} if state_dict is None else {"state_dict": state_dict}
        if self.lora:
            from peft.utils.constants import EMBEDDING_LAYER_NAMES

            targets = {t for c in self.model.peft_config.values() for t in (c.target_modules or ())}
            if not targets & set(EMBEDDING_LAYER_NAMES):
                settings["save_embedding_layers"] = False
        self.model.save_pretrained(folder, **settings)

    @property
    def training_module(self) -> Any:
        """What forward/backward for training runs through: the DDP/FSDP wrapper when there is one."""
        return self.wrapped if self.wrapped is not None else self.model

    def trainable_parameters(self) -> list[Any]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def reference_model(self) -> Iterator[Any]:
        """The model to compute reference logprobs with."""
        if self.lora:
            with self.model.disable_adapter():
                yield self.model
        else:
            yield self.reference


def bf16_base_on_cpu(config: TrainConfig) -> bool:
    """A CPU trainer keeps LoRA's frozen base weights in bfloat16 (see `load_policy`)."""
    from workbench.inference.cpu_features import cpu_has_bf16

    return config.optimization_dtype == "bfloat16" and config.lora.enabled and cpu_has_bf16()


def load_policy(
    model_source: str | Path,
    config: TrainConfig,
    *,
    need_reference: bool,
    adapter_dir: Path | None = None,
    on_gpu: bool = False,
) -> Policy:
    """Load `model_source`; wrap it with LoRA (`config.lora`) unless disabled.

    `model_source` may be a checkpoint (a LoRA adapter folder, or a chain of them: RL on SFT on a
    base model): its adapters are merged into plain weights first, so the run starts from exactly
    the checkpoint's weights, the new LoRA goes on top of them, and the KL reference (the adapter
    disabled) is the checkpoint. The new adapter records `model_source` as its base model, so
    eval and export of this run's checkpoints rebuild the same chain.
    `adapter_dir` resumes a LoRA adapter (or, for full fine-tuning, is the model folder itself).
    `on_gpu`: the policy will train on a CUDA device, where `optimization_dtype` applies. On a CPU
    it applies to LoRA's frozen base weights when the CPU multiplies bfloat16 natively
    (`cpu_has_bf16`): SmolLM2-135M's forward/backward ran ~5x faster there, generation ~1.5x, and
    the adapters (what is trained) stay float32. Full fine-tuning on a CPU keeps float32 weights:
    AdamW on bfloat16 weights drops updates smaller than their precision.
    """
    import torch
    from transformers import AutoTokenizer

    from workbench.models.loading import load_plain_model

    source = adapter_dir if (adapter_dir is not None and not config.lora.enabled) else model_source
    dtype = torch.bfloat16 if on_gpu and config.optimization_dtype == "bfloat16" else torch.float32
    model, tokenizer = load_plain_model(source, dtype=dtype)
    if not on_gpu and bf16_base_on_cpu(config):
        model.to(torch.bfloat16)  # after any checkpoint chain was merged, in float32
        # torch's CPU SDPA kernel is slow backward in bfloat16 (SmolLM2-135M, 16 x 62 tokens: 65 ms
        # per layer, a fifth of the step); plain matmul attention halved the forward/backward
        model.set_attn_implementation("eager")
    model.name_or_path = str(
        model_source
    )  # a resumed full fine-tuning run loads adapter_dir, but started here
    if config.tokenizer:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(config.tokenizer))
        except OSError as exc:
            raise UserError(
                f"could not load tokenizer '{config.tokenizer}': {str(exc).splitlines()[0]}"
            ) from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if config.activation_checkpointing:
        model.gradient_checkpointing_enable()
    if not config.lora.enabled:
        model.train()
        reference = None
        if need_reference and adapter_dir is None:
            reference = copy.deepcopy(model).eval().requires_grad_(False)
        elif (
            need_reference
        ):  # resumed: the reference is still the run's starting weights, not the resumed ones
            reference = load_plain_model(model_source, dtype=dtype)[0].requires_grad_(False)
        return Policy(model, tokenizer, str(model_source), lora=False, reference=reference)

    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter_dir is not None:
        with quiet_peft():
            model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
    else:
        available = {name.split(".")[-1] for name, _ in model.named_modules()}
        missing = [m for m in config.lora.target_modules if m not in available]
        if missing:
            raise UserError(
                f"lora.target_modules {missing} are not in this model "
                f"(it has e.g. {sorted(available & {'q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj', 'c_attn'})})"
            )
        lora = LoraConfig(
            r=config.lora.r,
            # peft annotates lora_alpha as int but only divides by it (alpha / r): a float alpha works.
            lora_alpha=config.lora.alpha,  # type: ignore[arg-type]
            lora_dropout=config.lora.dropout,
            target_modules=list(config.lora.target_modules),
            task_type="CAUSAL_LM",
        )
        with quiet_peft():
            model = get_peft_model(model, lora)
    model.train()
    return Policy(model, tokenizer, str(model_source), lora=True)
