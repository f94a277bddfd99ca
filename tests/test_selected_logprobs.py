"""Chunked selected logprobs (workbench/train/selected_logprobs.py): the same logprobs, entropies
and gradients as the full-vocabulary log-softmax they replace, over chunks smaller than a row, on
a real model's head; the plain path kept for heads it does not know; and peft's input casting
skipped under bfloat16 autocast (workbench/train/optimize.training_autocast)."""

from __future__ import annotations

from pathlib import Path

import pytest


def _plain(hidden, weight, targets, temperature):  # type: ignore[no-untyped-def]
    import torch

    logprobs = torch.log_softmax((hidden @ weight.T).float() / temperature, dim=-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunks_give_the_full_log_softmax_values_and_gradients(temperature: float) -> None:
    import torch

    from workbench.train.selected_logprobs import selected_logprobs

    torch.manual_seed(0)
    vocab, width = 300, 16
    hidden = torch.randn(3, 7, width, dtype=torch.float64)
    weight = torch.randn(vocab, width, dtype=torch.float64)
    targets = torch.randint(0, vocab, (3, 7))
    upstream = torch.randn(3, 7, dtype=torch.float64)
    results = []
    for fn in (_plain, selected_logprobs):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        # 5 positions of float32 logits per chunk: 21 positions make 5 chunks, the last one short
        extra = {"chunk_bytes": 5 * 4 * vocab} if fn is selected_logprobs else {}
        picked, entropy = fn(h, w, targets, temperature, **extra)
        (picked * upstream).sum().backward()
        results.append((picked.detach().double(), entropy.double(), h.grad, w.grad))
    (p0, e0, gh0, gw0), (p1, e1, gh1, gw1) = results
    assert p1.shape == (3, 7) and e1.shape == (3, 7) and not e1.requires_grad
    # float32 logits inside (as the plain path's .float()): float32 agreement, not float64
    assert torch.allclose(p1, p0, atol=1e-5) and torch.allclose(e1, e0, atol=1e-5)
    assert torch.allclose(gh1, gh0, atol=1e-5) and torch.allclose(gw1, gw0, atol=1e-5)


def test_a_frozen_head_gets_no_gradient_and_bfloat16_hidden_gets_its_own_dtype_back() -> None:
    import torch

    from workbench.train.selected_logprobs import selected_logprobs

    torch.manual_seed(1)
    hidden = torch.randn(2, 5, 8, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(50, 8, dtype=torch.bfloat16)  # frozen, as LoRA's base head is
    picked, _ = selected_logprobs(hidden, weight, torch.randint(0, 50, (2, 5)), 1.0, chunk_bytes=3 * 4 * 50)
    picked.sum().backward()
    assert picked.dtype == torch.float32 and hidden.grad is not None and hidden.grad.dtype == torch.bfloat16
    assert weight.grad is None


def test_token_logprobs_through_the_chunks_match_the_models_own_logits(tiny_model: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from workbench.train.loss import token_logprobs
    from workbench.train.selected_logprobs import plain_head_weight

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    assert plain_head_weight(model) is model.get_base_model().lm_head.weight
    ids = torch.randint(3, base.config.vocab_size, (2, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    picked, entropy = token_logprobs(model, batch, 0.8)
    chunked = torch.autograd.grad(picked.sum(), [p for p in model.parameters() if p.requires_grad])
    reference = torch.log_softmax(model(**batch).logits[:, :-1].float() / 0.8, dim=-1)
    expected = reference.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    full = torch.autograd.grad(expected.sum(), [p for p in model.parameters() if p.requires_grad])
    assert picked[:, 0].eq(0).all()  # position 0 predicts nothing
    assert torch.allclose(picked[:, 1:], expected, atol=1e-5)
    assert torch.allclose(entropy[:, 1:], -(reference.exp() * reference).sum(-1), atol=1e-4)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(chunked, full, strict=True))


def test_a_head_with_its_own_adapter_or_bias_takes_the_plain_path(tiny_model: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from workbench.train.selected_logprobs import plain_head_weight

    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    adapted = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"]))
    assert plain_head_weight(adapted) is None
    biased = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    head = biased.get_output_embeddings()
    biased.set_output_embeddings(torch.nn.Linear(head.in_features, head.out_features, bias=True))
    assert plain_head_weight(biased) is None


def test_bfloat16_autocast_skips_peft_input_casting_inside_and_restores_it_after(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer
    from transformers import AutoModelForCausalLM

    from workbench.train.optimize import training_autocast
    from workbench.train.schema import TrainConfig

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]),
    )
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    config = TrainConfig(env=[{"id": "reverse-text"}], autocast_dtype="bfloat16")
    # the CPU's bfloat16 support decides, whatever machine runs this test
    monkeypatch.setattr("workbench.train.optimize.cpu_has_bf16", lambda: True)
    with training_autocast(config, "cpu", model)():
        assert torch.is_autocast_enabled("cpu") and not any(m.cast_input_dtype_enabled for m in layers)
    assert not torch.is_autocast_enabled("cpu") and all(m.cast_input_dtype_enabled for m in layers)
    plain = TrainConfig(env=[{"id": "reverse-text"}])
    with training_autocast(plain, "cpu", model)():
        assert not torch.is_autocast_enabled("cpu") and all(m.cast_input_dtype_enabled for m in layers)
    # a CPU that would emulate bfloat16 (slower than float32) keeps the passes in float32
    monkeypatch.setattr("workbench.train.optimize.cpu_has_bf16", lambda: False)
    with training_autocast(config, "cpu", model)():
        assert not torch.is_autocast_enabled("cpu") and all(m.cast_input_dtype_enabled for m in layers)
