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


def test_lora_projections_are_not_fused(tiny: tuple[Any, Any]) -> None:
    from peft import LoraConfig, get_peft_model

    from workbench.inference.lean_model import LeanModel

    model, _ = tiny
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"])
    lean = LeanModel.build(get_peft_model(copy.deepcopy(model), lora))
    assert lean is not None and all(layer.qkv is None and layer.gate_up is None for layer in lean.layers)


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
