"""The lean forward's fast paths: fused q/k/v and gate/up weights (copies that must follow weight
changes made after they were taken), the shared-prefix attention of a whole batch admitted at once
(prefill and decode), and `sample_next`'s skip hints."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.test_lean_decode import STOPS, assert_same, generate, prompt_ids
from workbench.inference.generation import GenerationRow
from workbench.types import SamplingParams


@pytest.fixture(scope="module")
def tiny(tiny_model: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_model))


def last_logits(lean: Any, ids: list[int]) -> Any:
    """The lean forward's logits at the last token of `ids`, on a fresh cache."""
    from workbench.inference.lean_model import ForwardBatch

    cache = lean.new_cache()
    cache.reserve(1, len(ids), keep_slots=0, keep_length=0)
    return lean.forward(cache, ForwardBatch.prefill([(0, 0, ids)], 0, lean.device))[0]


def hf_logits(model: Any, ids: list[int]) -> Any:
    import torch

    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def test_fused_weights_follow_updates_made_after_the_lean_model_was_built(tiny: tuple[Any, Any]) -> None:
    import torch

    from workbench.inference.lean_model import LeanModel

    model, tokenizer = tiny
    model = copy.deepcopy(model)
    lean = LeanModel.build(model)
    assert lean is not None and all(
        layer.qkv is not None and layer.gate_up is not None for layer in lean.layers
    )
    ids = prompt_ids(tokenizer, "green apple")
    before = last_logits(lean, ids)
    assert torch.allclose(before, hf_logits(model, ids), atol=1e-4)
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[1].mlp
    with torch.no_grad():
        attention.k_proj.weight.mul_(1.5)  # in place: the version counter moves
        mlp.up_proj.weight = torch.nn.Parameter(mlp.up_proj.weight * 0.5)  # a new tensor
    after = last_logits(lean, ids)
    assert not torch.allclose(after, before, atol=1e-3)
    assert torch.allclose(after, hf_logits(model, ids), atol=1e-4)


def test_a_lean_model_reads_a_model_until_peft_replaces_its_modules(tiny: tuple[Any, Any]) -> None:
    """`reads`: what `LocalClient` asks before reusing a `LeanModel` for another session."""
    from peft import LoraConfig, inject_adapter_in_model

    from workbench.inference.lean_model import LeanModel

    model = copy.deepcopy(tiny[0])
    lean = LeanModel.build(model)
    assert lean is not None and lean.reads(model) and not lean.reads(copy.deepcopy(model))
    inject_adapter_in_model(LoraConfig(r=2, target_modules=["down_proj"]), model)  # swaps modules in place
    assert not lean.reads(model)
    rebuilt = LeanModel.build(model)
    assert rebuilt is not None and rebuilt.reads(model)


def lora_model(model: Any, targets: list[str], **extra: Any) -> Any:
    """A peft copy of `model` with nonzero adapters (peft starts B at zero, which would hide them)."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False, **extra)
    return get_peft_model(copy.deepcopy(model), config).eval()


def test_lora_projections_are_fused_with_their_adapters_as_in_peft(tiny: tuple[Any, Any]) -> None:
    """LoRA on some of q/k/v and all of the MLP: the base weights fused, the adapters as one
    low-rank pass beside them, logits as peft's own forward gives them."""
    import torch

    from workbench.inference.lean_model import LeanModel

    model, tokenizer = tiny
    wrapped = lora_model(model, ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    lean = LeanModel.build(wrapped)
    assert lean is not None
    for layer in lean.layers:
        assert layer.qkv is not None and layer.qkv.low_rank is not None
        assert layer.gate_up is not None and layer.gate_up.low_rank is not None
        assert layer.down_copy is not None and layer.down_copy.low_rank is not None
    ids = prompt_ids(tokenizer, "green apple")
    logits = last_logits(lean, ids)
    assert torch.allclose(logits, hf_logits(wrapped, ids), atol=1e-4)
    with wrapped.disable_adapter():  # peft's switch: the base model alone, in both paths
        assert torch.allclose(last_logits(lean, ids), hf_logits(wrapped, ids), atol=1e-4)
        assert not torch.allclose(last_logits(lean, ids), logits, atol=1e-3)


def test_fused_adapters_follow_training_steps_and_adapter_switches(tiny: tuple[Any, Any]) -> None:
    """An optimizer step on the adapters (in place), a second adapter made active, and merging
    into the base: the next forward of the same LeanModel sees each."""
    import torch
    from peft import LoraConfig

    from workbench.inference.lean_model import LeanModel

    model, tokenizer = tiny
    wrapped = lora_model(model, ["q_proj", "k_proj", "v_proj", "up_proj"])
    lean = LeanModel.build(wrapped)
    assert lean is not None
    ids = prompt_ids(tokenizer, "green apple")
    start = last_logits(lean, ids)
    base_copy = lean.layers[0].qkv.weight_t  # type: ignore[union-attr]
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:
                parameter.add_(0.05)
    stepped = last_logits(lean, ids)
    assert not torch.allclose(stepped, start, atol=1e-3)
    assert torch.allclose(stepped, hf_logits(wrapped, ids), atol=1e-4)
    assert lean.layers[0].qkv.weight_t is base_copy  # type: ignore[union-attr]  # adapters alone re-copied

    torch.manual_seed(1)
    wrapped.add_adapter(
        "second", LoraConfig(r=2, lora_alpha=16, target_modules=["k_proj"], init_lora_weights=False)
    )
    wrapped.set_adapter("second")
    switched = last_logits(lean, ids)
    assert torch.allclose(switched, hf_logits(wrapped, ids), atol=1e-4)
    assert not torch.allclose(switched, stepped, atol=1e-3)

    wrapped.set_adapter("default")
    wrapped.merge_adapter()  # the base weights now hold the adapters: peft runs the base alone
    assert torch.allclose(last_logits(lean, ids), hf_logits(wrapped, ids), atol=1e-4)
    assert torch.allclose(last_logits(lean, ids), stepped, atol=1e-4)


def test_lora_layers_peft_must_run_itself_are_not_fused(tiny: tuple[Any, Any]) -> None:
    """DoRA (a LoRA variant) and dropout in training mode: called as modules, same logits."""
    import torch

    from workbench.inference.lean_model import LeanModel

    model, tokenizer = tiny
    ids = prompt_ids(tokenizer, "green apple")
    dora = lora_model(model, ["q_proj", "k_proj", "v_proj"], use_dora=True)
    lean = LeanModel.build(dora)
    assert lean is not None and all(layer.qkv is None for layer in lean.layers)
    assert torch.allclose(last_logits(lean, ids), hf_logits(dora, ids), atol=1e-4)

    dropout = lora_model(model, ["gate_proj", "up_proj"], lora_dropout=0.5).train()
    lean = LeanModel.build(dropout)
    assert lean is not None and all(layer.gate_up is None for layer in lean.layers)
    dropout.eval()  # dropout is off out of training mode: fused from the next build on
    lean = LeanModel.build(dropout)
    assert lean is not None and all(layer.gate_up is not None for layer in lean.layers)
    assert torch.allclose(last_logits(lean, ids), hf_logits(dropout, ids), atol=1e-4)


def test_a_batch_sharing_a_system_prompt_matches_the_hf_path(tiny: tuple[Any, Any]) -> None:
    """Rows admitted together with a long common prefix: it is run once and read once per step
    (shared-prefix prefill and decode attention); a row without it joins one step later."""
    from workbench.inference.decode_engine import MIN_SHARED_PREFIX, DecodeEngine
    from workbench.inference.lean_model import LeanModel

    model, tokenizer = tiny
    system = "You reverse text. Answer with the reversed text only, inside <reversed_text> tags."
    texts = ["green apple", "fox", "the lazy dog jumps over", "winter river", "stone"]
    prompts = [prompt_ids(tokenizer, t, system=system) for t in texts] + [
        prompt_ids(tokenizer, "fox", system="Hi.")
    ]
    sampling = SamplingParams(temperature=1.0, max_tokens=24)
    rows = [GenerationRow(p, sampling, 24, seed=300 + i) for i, p in enumerate(prompts)]
    engine = DecodeEngine(LeanModel.build(model), tokenizer, stop_token_ids=STOPS, max_rows=len(rows))
    engine.add(rows[:-1], list(range(len(rows) - 1)))
    assert engine.prefix is not None and engine.prefix.length >= MIN_SHARED_PREFIX
    results = dict(engine.step())
    engine.add(rows[-1:], [len(rows) - 1])
    while engine.live_rows:
        results.update(engine.step())
    assert_same(generate(model, tokenizer, rows, lean=False), [results[i] for i in range(len(rows))])


@pytest.mark.parametrize("rows", [1, 7])
def test_sample_next_hints_give_the_same_tokens(rows: int) -> None:
    import torch

    from workbench.inference.generation import sample_next

    generator = torch.Generator().manual_seed(rows)
    logits = torch.randn((rows, 259), generator=generator) * 3
    uniforms = torch.rand(rows, generator=generator)
    temperature, top_p = torch.full((rows,), 0.8), torch.ones(rows)
    top_k = torch.full((rows,), -1, dtype=torch.long)
    plain = sample_next(logits, temperature, top_p, top_k, uniforms)
    hinted = sample_next(logits, temperature, top_p, top_k, uniforms, greedy=False, truncated=False)
    assert torch.equal(plain[0], hinted[0]) and torch.equal(plain[1], hinted[1])
