"""loss = "dppo" (prime-rl's default loss): the trust-region mask by advantage sign, the
squared log-ratio term, the masked-share statistics, and a real run on the tiny model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from workbench.train.loss import DPPOSettings, policy_loss
from workbench.train.schema import TrainConfig

# Four loss tokens after a masked first position. The trainer's probability of each moved from
# the sampler's: +0.3 (A > 0: masked), +0.3 (A < 0: kept), -0.3 (A < 0: masked), -0.3 (A > 0: kept).
SAMPLER_P = [0.5, 0.4, 0.4, 0.7, 0.7]
TRAINER_P = [0.5, 0.7, 0.7, 0.4, 0.4]
ADVANTAGES = [0.0, 1.0, -1.0, -1.0, 1.0]
MASKED = [False, True, False, True, False]


def _dppo_loss(settings: DPPOSettings = DPPOSettings()) -> tuple[Any, Any, dict[str, float]]:
    import torch

    logprobs = torch.tensor([[math.log(p) for p in TRAINER_P]], requires_grad=True)
    batch = {
        "loss_mask": torch.tensor([[0.0, 1.0, 1.0, 1.0, 1.0]]),
        "advantages": torch.tensor([ADVANTAGES]),  # one per token, as a packed batch carries them
        "sampler_logprobs": torch.tensor([[math.log(p) for p in SAMPLER_P]]),
    }
    loss, stats = policy_loss(
        "dppo", logprobs, batch, clip_low=0.2, clip_high=0.2, cispo_clip=5.0, total_tokens=4, dppo=settings
    )
    loss.backward()
    return loss, logprobs.grad[0], stats


def test_a_token_pushed_past_the_trust_region_in_its_advantages_direction_is_masked():
    loss, grad, stats = _dppo_loss()
    tau = DPPOSettings().kl_tau
    for t in range(1, 5):
        log_ratio = math.log(TRAINER_P[t] / SAMPLER_P[t])
        kl_grad = 2 * tau * log_ratio / 4  # d/dlogp of kl_tau (log p - log mu)^2, over 4 tokens
        ratio = TRAINER_P[t] / SAMPLER_P[t]
        pg_grad = 0.0 if MASKED[t] else -ADVANTAGES[t] * ratio / 4  # d/dlogp of -A r = -A r
        assert float(grad[t]) == pytest.approx(pg_grad + kl_grad, rel=1e-5), t
    assert float(grad[0]) == 0.0  # not a loss token
    expected = sum(
        (0.0 if MASKED[t] else -ADVANTAGES[t] * TRAINER_P[t] / SAMPLER_P[t])
        + tau * math.log(TRAINER_P[t] / SAMPLER_P[t]) ** 2
        for t in range(1, 5)
    )
    assert float(loss.detach()) == pytest.approx(expected / 4, rel=1e-5)
    assert stats["masked_frac"] == pytest.approx(0.5)
    assert stats["masked_frac_high"] == pytest.approx(0.25)  # token 1: positive advantage, rose
    assert stats["masked_frac_low"] == pytest.approx(0.25)  # token 3: negative advantage, fell
    assert stats["clip_frac"] == stats["masked_frac"]


def test_wider_thresholds_mask_nothing_and_the_taus_scale_their_terms():
    _, _, stats = _dppo_loss(DPPOSettings(mask_low=0.31, mask_high=0.31))
    assert stats["masked_frac"] == 0.0
    _, grad, _ = _dppo_loss(DPPOSettings(mask_low=0.31, mask_high=0.31, adv_tau=0.0, kl_tau=0.0))
    assert all(float(g) == 0.0 for g in grad)  # both terms off: nothing to learn
    _, grad, _ = _dppo_loss(DPPOSettings(adv_tau=2.0, kl_tau=0.0))
    assert float(grad[2]) == pytest.approx(2.0 * 1.0 * 0.7 / 0.4 / 4, rel=1e-5)  # -adv_tau A r, A = -1


def test_on_policy_dppo_is_the_plain_policy_gradient_and_masks_nothing():
    """Trainer = sampler: every ratio is 1, the KL term and its gradient are 0, nothing is masked,
    so the gradient is -A per token (over the batch's tokens), as for grpo."""
    import torch

    logprobs = torch.log(torch.tensor([[0.5, 0.2, 0.9]])).requires_grad_()
    batch = {
        "loss_mask": torch.tensor([[0.0, 1.0, 1.0]]),
        "advantages": torch.tensor([0.5]),
        "sampler_logprobs": logprobs.detach().clone(),
    }
    loss, stats = policy_loss(
        "dppo", logprobs, batch, clip_low=0.2, clip_high=0.2, cispo_clip=5.0, total_tokens=2
    )
    loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, -0.25, -0.25])
    assert stats["masked_frac"] == 0.0 and stats["mismatch_kl"] == 0.0 and stats["mismatch_kl_max"] == 0.0


def test_mismatch_max_and_spread_over_the_loss_tokens():
    import torch

    logprobs = torch.tensor([[-0.5, -1.0, -2.0, -0.1]])
    shifts = [9.0, 0.1, -0.2, 0.0]  # position 0 is not a loss token: its 9.0 must not count
    batch = {
        "loss_mask": torch.tensor([[0.0, 1.0, 1.0, 1.0]]),
        "advantages": torch.tensor([1.0]),
        "sampler_logprobs": logprobs + torch.tensor([shifts]),
    }
    _, stats = policy_loss(
        "grpo", logprobs, batch, clip_low=0.2, clip_high=0.2, cispo_clip=5.0, total_tokens=3
    )
    k3 = [math.exp(-d) - 1 + d for d in shifts[1:]]
    mean = sum(k3) / 3
    assert stats["mismatch_kl_max"] == pytest.approx(max(k3), rel=1e-5)
    assert stats["mismatch_kl_sq"] == pytest.approx(sum(x * x for x in k3) / 3, rel=1e-5)
    assert math.sqrt(stats["mismatch_kl_sq"] - mean**2) == pytest.approx(
        math.sqrt(sum((x - mean) ** 2 for x in k3) / 3), rel=1e-4
    )


def test_dppo_trains_the_tiny_model_and_logs_its_masked_shares(tiny_workspace: Path):
    from workbench.store.runs import read_metrics
    from workbench.train import run_train

    config = TrainConfig(
        model="tiny",
        env=[{"id": "reverse-text"}],
        loss="dppo",
        max_steps=3,
        batch_size=16,
        rollouts_per_example=4,
        micro_batch_size=8,  # two micro-batches: the shares are summed over both
        learning_rate=3e-3,
        sampling={"max_tokens": 48},
        eval={"interval": 3, "num_examples": 4, "rollouts_per_example": 2},  # before step 1 and after step 3
        wandb={"mode": "disabled"},
        output_dir=str(tiny_workspace / "dppo"),
    )
    result = run_train(config)
    assert result.status == "finished" and result.last_step == 3
    lines = read_metrics(result.run_dir)
    steps = [m for m in lines if "policy/masked_frac" in m]
    assert len(steps) == 3
    evaluated = [m for m in lines if "eval/avg@2" in m]  # the metrics file the TUI and W&B get
    assert [m["step"] for m in evaluated] == [0, 3]
    assert all(0.0 <= m["eval/pass@2"] <= 1.0 for m in evaluated)
    for m in steps:
        assert math.isfinite(m["train/loss"]) and m["train/grad_norm"] > 0
        assert 0.0 <= m["policy/masked_frac_high"] <= m["policy/masked_frac"] <= 1.0
        assert m["policy/masked_frac"] == pytest.approx(
            m["policy/masked_frac_high"] + m["policy/masked_frac_low"]
        )
        assert m["masked_advantage_positive/mean"] == m["policy/masked_advantage_positive"]
    # colocated and on-policy: each batch comes from the weights it trains, so nothing moved past the
    # trust region when the loss was computed (DPPO masks off-policy drift, not on-policy steps)
    assert all(m["policy/masked_frac"] == 0.0 for m in steps)


def test_the_other_losses_log_no_masked_shares():
    from workbench.train.optimize import StepStats
    from workbench.train.step_metrics import train_metrics

    stats = StepStats(
        loss=0.1,
        grad_norm=1.0,
        entropy=2.0,
        kl=0.0,
        ratio_mean=1.0,
        clip_frac=0.0,
        tokens=10,
        forward_backward_s=0.1,
        optimizer_s=0.01,
        mismatch_kl=1e-9,
        mismatch_kl_max=1e-8,
    )
    logged = train_metrics(stats, None)
    assert logged["policy/mismatch_kl_max"] == 1e-8 and "policy/masked_frac" not in logged
    stats.masked_frac, stats.masked_frac_high, stats.masked_frac_low = 0.1, 0.025, 0.075
    logged = train_metrics(stats, None)
    assert logged["policy/masked_advantage_positive"] == pytest.approx(0.25)
    assert logged["policy/masked_advantage_negative"] == pytest.approx(0.75)


def test_packed_and_shared_prompt_batches_make_the_padded_dppo_step(tiny_model: Path):
    """The same loss, gradients, masked shares and mismatch statistics whichever way the step's
    samples are laid out (padded rows, packed rows, shared prompts), on the real tiny model with
    sampler logprobs far from its own (so the trust region masks tokens)."""
    from tests.test_train_packing import assert_same_step, load, make_groups, make_samples, step

    policy, config = load(tiny_model, lora=True, loss="dppo")
    for samples in (make_samples(24), make_groups(4, 6, seed=11)):
        assert_same_step(policy, config, samples, temperature=0.8)
        padded, _ = step(policy, config, samples, pack=False, temperature=0.8)
        packed, _ = step(policy, config, samples, pack=True, temperature=0.8)
        assert padded.masked_frac is not None and padded.masked_frac > 0
        for key in ("masked_frac", "masked_frac_high", "masked_frac_low", "mismatch_kl", "mismatch_kl_std"):
            assert getattr(packed, key) == pytest.approx(getattr(padded, key), rel=1e-5), key
        assert packed.mismatch_kl_max == pytest.approx(padded.mismatch_kl_max, rel=1e-4)
        assert padded.mismatch_kl_max > padded.mismatch_kl > 0
