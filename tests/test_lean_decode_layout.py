"""The lean forward's cache layout and its fast paths: keys in "pairs" head-dim order whichever
way q/k are projected (fused copies with reordered rows, separate modules permuted after the
fact) and rotated (complex multiply, or real ops for dtypes without a complex counterpart); the
one-write-per-layer cache index; per-move slot copies; decode steps that skip the weight check;
decode attention on the CPU flash kernel."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.test_lean_decode import STOPS, assert_same, generate, mixed_rows, prompt_ids
from tests.test_lean_decode_fused import hf_logits, last_logits
from workbench.inference.generation import GenerationRow
from workbench.types import SamplingParams


@pytest.fixture(scope="module")
def tiny(tiny_model: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_model))


def test_real_rotation_matches_the_complex_one(tiny: tuple[Any, Any]) -> None:
    """The rotation used for bfloat16 (real ops on the pairs order) gives the logits of the complex
    multiply used for float32, and both those of the HF forward."""
    import torch

    from workbench.inference.lean_model import LeanModel

    model, tokenizer = tiny
    ids = prompt_ids(tokenizer, "the lazy dog jumps")
    lean = LeanModel.build(model)
    assert lean is not None and lean._complex_rope
    complex_logits = last_logits(lean, ids)
    lean._complex_rope, lean._rope = False, None  # as for a dtype without complex numbers
    real_logits = last_logits(lean, ids)
    assert lean._rope is not None and not lean._rope.is_complex()
    assert torch.allclose(real_logits, complex_logits, atol=1e-6)
    assert torch.allclose(real_logits, hf_logits(model, ids), atol=1e-4)


def test_unfused_projections_keep_the_fused_layout(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """q/k projected by separate modules (a model too big to fuse) are put in pairs order after the
    fact: the same tokens and logprobs as with the fused, reordered copies."""
    from workbench.inference.generation import generate_batch
    from workbench.inference.lean_model import LeanModel

    model, tokenizer = tiny
    rows = mixed_rows(tokenizer)
    fused = generate(model, tokenizer, rows, lean=True)
    monkeypatch.setattr(LeanModel, "FUSE_MAX_BYTES", 0)
    lean = LeanModel.build(model)
    assert lean is not None and all(layer.qkv is None and layer.o_copy is None for layer in lean.layers)
    assert_same(
        fused, generate_batch(model, tokenizer, rows, stop_token_ids=STOPS, pad_token_id=256, lean=True)
    )


def test_cache_write_index_and_slot_copies() -> None:
    import torch

    from workbench.inference.lean_cache import KVCache

    layers, kv_heads, dim = 2, 3, 4
    cache = KVCache(layers, kv_heads, dim, dtype=torch.float32, device=torch.device("cpu"))
    cache.reserve(5, 10, keep_slots=0, keep_length=0)
    slots, index = torch.tensor([1, 4, 4]), torch.tensor([0, 2, 9])
    values = torch.randn(3, 2 * kv_heads, dim)  # per token: its key heads, then its value heads
    rows = cache.data.view(layers, -1, dim)
    rows[1].index_put_((cache.write_index(slots, index),), values)
    for token, (slot, at) in enumerate(zip(slots.tolist(), index.tolist())):
        assert torch.equal(cache.data[1, 0, slot, :, at], values[token, :kv_heads])
        assert torch.equal(cache.data[1, 1, slot, :, at], values[token, kv_heads:])
    assert cache.data[0].abs().sum() == 0  # another layer's rows are untouched
    before = cache.data.clone()
    cache.copy_slots([(0, 4, 3), (2, 1, 1)])
    assert torch.equal(cache.data[:, :, 0, :, :3], before[:, :, 4, :, :3])
    assert torch.equal(cache.data[:, :, 2, :, :1], before[:, :, 1, :, :1])
    assert torch.equal(cache.data[:, :, 0, :, 3:], before[:, :, 0, :, 3:])  # past the length: as it was


def test_decode_steps_read_weights_fixed_for_the_session(tiny: tuple[Any, Any]) -> None:
    """A forward with `check_weights=False` (the engine's decode steps, whose weights the caller
    holds still) uses the fused copies as they are; the default call re-copies changed sources."""
    import torch

    from workbench.inference.lean_model import LeanModel

    model, tokenizer = tiny
    model = copy.deepcopy(model)
    lean = LeanModel.build(model)
    ids = prompt_ids(tokenizer, "fox")
    before = last_logits(lean, ids)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(2.0)  # a fused (transposed) copy's source
    from workbench.inference.lean_model import ForwardBatch

    cache = lean.new_cache()
    cache.reserve(1, len(ids), keep_slots=0, keep_length=0)
    stale = lean.forward(cache, ForwardBatch.prefill([(0, 0, ids)], 0, lean.device), check_weights=False)[0]
    assert torch.equal(stale, before)
    assert torch.allclose(last_logits(lean, ids), hf_logits(model, ids), atol=1e-4)


def test_rows_finishing_at_different_steps_match_running_alone(tiny: tuple[Any, Any]) -> None:
    """Rows leave from the middle (the last rows move into their slots) and from the end (nothing
    moves), over many steps: each row's tokens are those it gets alone."""
    from workbench.inference.generation import GenerationRow, generate_batch_hf
    from workbench.types import SamplingParams

    model, tokenizer = tiny
    texts = ["green apple", "fox", "the lazy dog jumps over", "winter river", "stone", "a", "silver"]
    rows = [
        GenerationRow(
            prompt_ids(tokenizer, t), SamplingParams(temperature=1.0, max_tokens=m), m, seed=400 + i
        )
        for i, (t, m) in enumerate(zip(texts, [9, 30, 2, 17, 30, 5, 12]))
    ]
    together = generate(model, tokenizer, rows, lean=True)
    alone = [
        generate_batch_hf(model, tokenizer, [row], stop_token_ids=STOPS, pad_token_id=256)[0] for row in rows
    ]
    assert_same(alone, together)
    assert len({len(r.completion_ids) for r in together}) > 3


def test_flash_decode_attention_gives_the_matmul_paths_tokens(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode attention on the CPU flash kernel (what 16-bit weights use) against the batched
    matmuls (float32's): the same tokens and logprobs, for rows sharing a system prompt (the
    prefix merged by log-sum-exp), a row without it, and rows joining mid-decode."""
    from workbench.inference.decode_engine import DecodeEngine
    from workbench.inference.lean_model import LeanModel

    model, tokenizer = tiny
    system = "You reverse text. Answer with the reversed text only, inside <reversed_text> tags."
    prompts = [prompt_ids(tokenizer, t, system=system) for t in ("green apple", "fox", "the lazy dog")]
    prompts.append(prompt_ids(tokenizer, "stone", system="Hi."))
    sampling = SamplingParams(temperature=1.0, max_tokens=20)
    rows = [GenerationRow(p, sampling, 20, seed=700 + i) for i, p in enumerate(prompts)]

    def run(flash: bool) -> dict[int, Any]:
        lean = LeanModel.build(model)
        assert lean is not None
        lean.attention.flash_decode = flash
        engine = DecodeEngine(lean, tokenizer, stop_token_ids=STOPS, max_rows=len(rows))
        engine.add(rows[:3], [0, 1, 2])
        assert engine.prefix is not None
        results = dict(engine.step())
        engine.add(rows[3:], [3])  # no shared prefix: its prefix keys are masked out
        while engine.live_rows:
            results.update(engine.step())
        return results

    matmuls, flash = run(False), run(True)
    assert_same([matmuls[i] for i in range(len(rows))], [flash[i] for i in range(len(rows))])
