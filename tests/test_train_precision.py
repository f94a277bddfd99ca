"""Training precision on the CPU: bfloat16 LoRA bases where the CPU multiplies bfloat16 natively,
bfloat16 autocast, and `policy/mismatch_kl`, the trainer-vs-sampler distance that shows what they cost."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from workbench.inference.cpu_features import cpu_has_bf16
from workbench.train.schema import TrainConfig


def test_mismatch_kl_is_zero_for_equal_logprobs_and_the_k3_estimate_otherwise() -> None:
    import torch

    from workbench.train.loss import policy_loss

    logprobs = torch.tensor([[-0.5, -1.0, -2.0, -0.1]])
    batch = {
        "loss_mask": torch.tensor([[0.0, 1.0, 1.0, 1.0]]),
        "advantages": torch.tensor([1.0]),
        "sampler_logprobs": logprobs.clone(),
    }
    _, same = policy_loss(
        "grpo", logprobs, batch, clip_low=0.2, clip_high=0.2, cispo_clip=5.0, total_tokens=3
    )
    assert same["mismatch_kl"] == 0.0
    batch["sampler_logprobs"] = logprobs + torch.tensor([[9.0, 0.1, -0.2, 0.0]])  # position 0 is masked out
    _, shifted = policy_loss(
        "grpo", logprobs, batch, clip_low=0.2, clip_high=0.2, cispo_clip=5.0, total_tokens=3
    )
    k3 = [
        math.exp(-d) - 1 + d for d in (0.1, -0.2, 0.0)
    ]  # ratio - 1 - log ratio, log ratio = trainer - sampler
    assert shifted["mismatch_kl"] == pytest.approx(sum(k3) / 3, rel=1e-5)


@pytest.mark.skipif(not cpu_has_bf16(), reason="this CPU has no native bfloat16 matmuls")
def test_lora_base_weights_are_bfloat16_and_adapters_float32_on_a_bf16_cpu(tiny_model: Path) -> None:
    import torch

    from workbench.train.policy import load_policy

    config = TrainConfig(model=str(tiny_model), env=[{"id": "reverse-text"}], optimization_dtype="bfloat16")
    policy = load_policy(tiny_model, config, need_reference=False)
    frozen = {p.dtype for p in policy.model.parameters() if not p.requires_grad}
    trained = {p.dtype for p in policy.model.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trained == {torch.float32}
    full = load_policy(
        tiny_model,
        TrainConfig(
            model=str(tiny_model),
            env=[{"id": "reverse-text"}],
            optimization_dtype="bfloat16",
            lora={"enabled": False},
        ),
        need_reference=False,
    )
    assert {p.dtype for p in full.model.parameters()} == {
        torch.float32
    }  # AdamW on bf16 weights would drop small updates


@pytest.mark.parametrize("settings", [{"optimization_dtype": "bfloat16"}, {"autocast_dtype": "bfloat16"}])
def test_bfloat16_runs_train_and_log_a_small_mismatch(tiny_workspace: Path, settings: dict[str, str]) -> None:
    from workbench.store.runs import read_metrics
    from workbench.train import run_train

    config = TrainConfig(
        model="tiny",
        env=[{"id": "reverse-text"}],
        max_steps=2,
        batch_size=16,
        rollouts_per_example=4,
        micro_batch_size=16,
        sampling={"max_tokens": 96},
        eval={"interval": 0},
        wandb={"mode": "disabled"},
        output_dir=str(tiny_workspace / "run"),
        **settings,
    )
    result = run_train(config)
    trained = [m for m in read_metrics(result.run_dir) if "policy/mismatch_kl" in m]
    assert result.status == "finished" and len(trained) == 2
    # bfloat16 arithmetic moves logprobs a little, never by much: a broken setup (e.g. the trainer on
    # other weights than the sampler) shows as a mismatch of order 0.1-1
    assert all(0.0 <= m["policy/mismatch_kl"] < 0.05 for m in trained), trained
