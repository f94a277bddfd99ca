"""One optimizer step over a batch of samples: micro-batches with gradient accumulation,
token-normalized loss, gradient clipping, AdamW, learning-rate schedule.

In a multi-process run (`dist.active`) `samples` is this rank's slice of the global batch; the
loss is normalized by the global token count and the returned stats are global (see
workbench.train.distributed)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from workbench.inference.cpu_features import cpu_has_bf16
from workbench.train.distributed import SINGLE, DistInfo, clip_grad_norm, is_fsdp, sync_gradients
from workbench.train.loss import DPPOSettings, policy_loss, sft_loss, token_logprobs
from workbench.train.packing import (
    collate_packed,
    collate_prefixed,
    item_length,
    pack_width,
    packed_micro_batches,
    prefixed_micro_batches,
    row_length,
)
from workbench.train.policy import Policy
from workbench.train.samples import Sample, collate, micro_batches
from workbench.train.schema import TrainConfig


class NonFiniteLoss(RuntimeError):
    pass


@dataclass
class StepStats:
    loss: float
    grad_norm: float
    entropy: float
    kl: float
    ratio_mean: float
    clip_frac: float
    tokens: int
    forward_backward_s: float
    optimizer_s: float
    padding_fraction: float = 0.0  # of the tokens the forward passes ran on (global)
    mismatch_kl: float = 0.0  # trainer vs sampler on the sampled tokens (loss.policy_loss): the mean
    mismatch_kl_max: float = 0.0  # ... its largest value on any loss token of the step (every rank)
    mismatch_kl_std: float = 0.0  # ... its standard deviation over those tokens
    # loss = "dppo": shares of the step's loss tokens its trust region masked, in all and by the
    # sign of their advantage (None for the other losses, which mask nothing)
    masked_frac: float | None = None
    masked_frac_high: float | None = None
    masked_frac_low: float | None = None


def training_autocast(
    config: TrainConfig, device: str, model: Any
) -> Callable[[], AbstractContextManager[Any]]:
    """The context the training passes of `model` run in: `torch.autocast` to bfloat16 when
    `autocast_dtype` asks for it (weights, gradients and the optimizer stay float32), else nothing.
    On a CPU only where it multiplies bfloat16 natively (`cpu_has_bf16`): elsewhere torch emulates
    bfloat16, slower than float32, so a config written for a fast machine stays float32 on a slow
    one, as `optimization_dtype` does (the dry run says so).

    Under autocast, peft's LoRA layers would first copy each input to their float32 weights' dtype,
    for autocast to copy it back to bfloat16 for the matmul: peft's `disable_input_dtype_casting`
    skips that round trip (a no-op on a model without adapters). Measured on SmolLM2-135M, an RL
    step of 128 rollouts (LoRA r16 on all projections, a bfloat16 base, 2 cores): forward/backward
    14.5 s without autocast, 11.2 s with it, 9.6 s with it and no casting."""
    import torch

    device_type = "cuda" if device.startswith("cuda") else "cpu"
    if config.autocast_dtype != "bfloat16" or (device_type == "cpu" and not cpu_has_bf16()):
        return contextlib.nullcontext
    from peft.helpers import disable_input_dtype_casting

    def context() -> AbstractContextManager[Any]:
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast(device_type, dtype=torch.bfloat16))
        stack.enter_context(disable_input_dtype_casting(model))
        return stack

    return context


def make_optimizer(policy: Policy, config: TrainConfig) -> tuple[Any, Any]:
    import torch

    optimizer = torch.optim.AdamW(
        policy.trainable_parameters(),
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        betas=config.betas,
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, config))


def lr_factor(step: int, config: TrainConfig) -> float:
    """The learning rate of optimizer step `step` (0-based) as a fraction of learning_rate:
    linear warmup over warmup_steps, then constant, or a linear / cosine decay towards min_lr
    over the last lr_decay_steps steps (default: every step after warmup). As in transformers'
    schedules, the last step still learns (its rate is one decay step above min_lr).

    Not transformers' `get_wsd_schedule` (the same decay): its warmup starts at 0 (step 0 would
    learn nothing) and from min_lr when one is set. torch's SequentialLR of LinearLR/ConstantLR/
    CosineAnnealingLR phases draws this curve to 3e-16, but its state_dict carries the phase
    lengths, so a run resumed with a larger max_steps would keep the old schedule; a LambdaLR
    saves only the step, and the curve comes from the resumed run's config."""
    warmup = config.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if config.lr_scheduler == "constant":
        return 1.0
    decay_start = max(warmup, config.max_steps - (config.lr_decay_steps or config.max_steps))
    if step < decay_start:
        return 1.0
    progress = min(1.0, (step - decay_start) / max(1, config.max_steps - decay_start))
    shape = 1.0 - progress if config.lr_scheduler == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    floor = config.min_lr / config.learning_rate if config.learning_rate > 0 else 0.0
    return floor + (1.0 - floor) * shape


def train_on_samples(
    policy: Policy,
    optimizer: Any,
    scheduler: Any,
    samples: list[Sample],
    config: TrainConfig,
    *,
    sft: bool = False,
    temperature: float = 1.0,
    kl_beta: float = 0.0,
    dist: DistInfo = SINGLE,
) -> StepStats:
    """One optimizer step on `samples`. `temperature`: the one the rollouts were sampled at, so
    the trainer's logprobs are of the sampler's distribution (SFT always uses 1.0)."""
    import torch

    started = time.perf_counter()
    model = policy.training_module
    model.train()
    optimizer.zero_grad(set_to_none=True)
    pad_id = policy.tokenizer.pad_token_id
    total_tokens = int(
        dist.sum([sum(sum(s.loss_mask) for s in samples)])[0]
    )  # the global batch's loss tokens
    # FSDP2 frees a module's gathered weights after each forward, and a prompt pass followed by
    # the completion pass is two forwards before one backward: its backward then finds them
    # freed. FSDP packs plainly (no shared prompts) instead.
    chunks, own_tokens = _equal_micro_batches(
        samples, config, pad_id, dist, masked=_takes_mask(model), share_prompts=not is_fsdp(policy)
    )
    real, laid_out = dist.sum([own_tokens, sum(_laid_out(c) for c in chunks)])
    use_kl = (not sft) and config.kl_penalty.enabled
    dppo = config.loss == "dppo" and not sft
    # token-weighted means: each micro-batch adds its mean x its share of the batch's loss tokens
    weighted = ["kl", "ratio_mean", "clip_frac", "mismatch_kl", "mismatch_kl_sq"]
    weighted += ["masked_frac", "masked_frac_high", "masked_frac_low"] if dppo else []
    totals = {"loss": 0.0, "entropy": 0.0, **dict.fromkeys(weighted, 0.0)}
    mismatch_max = 0.0
    autocast = training_autocast(config, dist.device, model)
    for index, chunk in enumerate(chunks):
        # DDP reads "sync or not" at forward time, so the forward goes inside too
        with sync_gradients(policy, sync=index == len(chunks) - 1):
            batch = _to_device(chunk, dist.device)
            with autocast():
                logprobs, entropy = token_logprobs(model, batch, 1.0 if sft else temperature)
            mask = batch["loss_mask"]
            weight = float(mask.sum()) / max(total_tokens, 1)  # this chunk's share of the batch's tokens
            if sft:
                loss = sft_loss(logprobs, batch, total_tokens)
                extra = {"ratio_mean": 1.0}
            else:
                ref = None
                if use_kl:
                    with torch.no_grad(), policy.reference_model() as reference, autocast():
                        ref, _ = token_logprobs(reference, batch, temperature)
                loss, extra = policy_loss(
                    config.loss,
                    logprobs,
                    batch,
                    clip_low=config.clip_low,
                    clip_high=config.clip_high,
                    cispo_clip=config.cispo_clip,
                    total_tokens=total_tokens,
                    ref_logprobs=ref,
                    kl_beta=kl_beta,
                    dppo=DPPOSettings(
                        config.dppo_mask_low, config.dppo_mask_high, config.adv_tau, config.kl_tau
                    ),
                )
            if (
                not torch.isfinite(loss) and not dist.active
            ):  # multi-process: the global grad norm check below
                optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLoss(f"loss is {float(loss)}")
            # DDP/FSDP average gradients over ranks; x world_size makes that the global batch's sum
            (loss * dist.world_size if dist.active else loss).backward()
            totals["loss"] += float(loss.detach())
            totals["entropy"] += float((entropy.detach() * mask).sum()) / max(total_tokens, 1)
            for key in weighted:
                totals[key] += extra.get(key, 0.0) * weight
            mismatch_max = max(mismatch_max, extra.get("mismatch_kl_max", 0.0))
    if dist.active:  # each rank holds its tokens' share of every stat: the sums are the global values
        totals = dict(zip(totals, dist.sum(list(totals.values())), strict=True))
        mismatch_max = max(dist.all_gather(mismatch_max))  # (DistInfo.max takes integers)
    forward_backward_s = time.perf_counter() - started
    started = time.perf_counter()
    grad_norm = clip_grad_norm(policy, config.max_grad_norm)
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteLoss(f"gradient norm is {grad_norm}")
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return StepStats(
        loss=totals["loss"],
        grad_norm=grad_norm,
        entropy=totals["entropy"],
        kl=totals["kl"],
        ratio_mean=totals["ratio_mean"],
        clip_frac=totals["clip_frac"],
        mismatch_kl=totals["mismatch_kl"],
        mismatch_kl_max=mismatch_max,
        mismatch_kl_std=math.sqrt(max(0.0, totals["mismatch_kl_sq"] - totals["mismatch_kl"] ** 2)),
        masked_frac=totals.get("masked_frac"),
        masked_frac_high=totals.get("masked_frac_high"),
        masked_frac_low=totals.get("masked_frac_low"),
        tokens=total_tokens,
        forward_backward_s=forward_backward_s,
        optimizer_s=time.perf_counter() - started,
        padding_fraction=1.0 - real / max(laid_out, 1),
    )


def _equal_micro_batches(
    samples: list[Sample],
    config: TrainConfig,
    pad_id: int,
    dist: DistInfo,
    *,
    masked: bool,
    share_prompts: bool = True,
) -> tuple[list[dict[str, Any]], int]:
    """This rank's collated micro-batches (packed or padded, `config.pack_samples`), padded with
    empty ones (no loss tokens: zero gradient) to the largest count on any rank, so every rank
    joins the same number of gradient all-reduces; and how many of their tokens are not padding
    (a shared prefix counts once). `masked`: the model's attention takes a 4D mask (see
    workbench.train.packing); only then, and with `share_prompts`, are common prompts shared."""
    empty = Sample([pad_id, pad_id], [0, 0], [0.0, 0.0], 0.0)
    if config.pack_samples and masked and share_prompts:  # shared prompts run once (workbench.train.packing)
        groups = prefixed_micro_batches(samples, config.micro_batch_size)
        chunks = [collate_prefixed(items, pad_id) for items in groups]
        tokens = sum(item_length(item) for items in groups for item in items)
        filler = collate_prefixed([empty], pad_id)
    elif config.pack_samples:
        width = pack_width(samples, config.micro_batch_size, config.seq_len, masked=masked)
        batches = packed_micro_batches(samples, config.micro_batch_size, width)
        # pack_rows of plain samples makes rows of samples only (no Shared prefix items)
        chunks = [collate_packed(rows, pad_id, with_mask=masked) for rows in batches]  # type: ignore[arg-type]
        tokens = sum(row_length(row) for rows in batches for row in rows)
        filler = collate_packed([[empty]], pad_id, with_mask=masked)
    else:
        chunks = [collate(chunk, pad_id) for chunk in micro_batches(samples, config.micro_batch_size)]
        tokens = sum(len(s.input_ids) for s in samples)
        filler = collate([empty], pad_id)
    if dist.active:
        chunks += [filler] * (dist.max(len(chunks)) - len(chunks))
    return chunks, tokens


def _laid_out(batch: dict[str, Any]) -> int:
    """Tokens the forward passes run on, padding included (the prompt passes' too)."""
    return batch["input_ids"].numel() + sum(
        part["input_ids"].numel() for part in batch.get("prompt_passes", ())
    )


def _takes_mask(model: Any) -> bool:
    """Whether packed batches need the explicit 4D mask: all but flash-attention and flex, which
    find packed-sequence boundaries in the position ids themselves (varlen; untested here)."""
    config = getattr(getattr(model, "module", model), "config", None)  # DDP keeps the model in .module
    implementation = str(getattr(config, "_attn_implementation", None) or "")
    return not implementation.startswith(("flash", "flex"))


def _to_device(batch: dict[str, Any], device: str) -> dict[str, Any]:
    if device == "cpu":
        return batch
    return {
        key: [_to_device(part, device) for part in value] if key == "prompt_passes" else value.to(device)
        for key, value in batch.items()
    }


def adapt_kl_beta(beta: float, observed_kl: float, target_kl: float | None) -> float:
    """Adaptive KL coefficient: double it when KL overshoots the target 1.5x, halve it when KL
    stays under target / 1.5 (the PPO paper's rule; keeps KL near the target without tuning)."""
    if target_kl is None or target_kl <= 0:
        return beta
    if observed_kl > 1.5 * target_kl:
        return beta * 2.0
    if observed_kl < target_kl / 1.5:
        return beta / 2.0
    return beta
