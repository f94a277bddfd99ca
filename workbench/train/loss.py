"""Token-level policy-gradient losses with importance ratios against the sampler's logprobs.

Every variant weights each sampled token by its advantage A (the rollout's, plus a per-token
term in online distillation) and the ratio
r = exp(logp_policy - logp_sampler) (1 on-policy, != 1 when the sampler was an older policy or
numerics differ):

- grpo:  -min(r A, clip(r, 1-eps, 1+eps) A)          PPO-style symmetric clip
- dapo:  -min(r A, clip(r, 1-eps_low, 1+eps_high) A)  asymmetric "clip-higher" keeps exploring
- cispo: -sg(min(r, cap)) A logp_policy               clip the IS weight, never drop a token's gradient
- dppo:  -keep adv_tau r A + kl_tau (log r)^2         prime-rl's default loss (DPPO + Kimi-K2.5's KL):
         keep = 0 where the token's probability moved past the trust region in the direction
         its advantage pushes (p - mu > mask_high with A > 0, mu - p > mask_low otherwise)

Optional KL penalty (k3 estimator, unbiased and positive): exp(ref - new) - (ref - new) - 1.
Losses are summed over tokens and divided by the number of loss tokens in the whole batch
(token-level normalization: long and short completions count per token, as in DAPO).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.models.kv_cache_name import cache_argument, returned_cache
from workbench.train.selected_logprobs import plain_head_weight, selected_logprobs, unwrapped


@dataclass
class LossStats:
    loss: float = 0.0
    entropy: float = 0.0
    kl: float = 0.0
    ratio_mean: float = 0.0
    clip_frac: float = 0.0
    tokens: int = 0


def token_logprobs(model: Any, batch: dict[str, Any], temperature: float) -> tuple[Any, Any]:
    """Logprobs of each next token under `model` (sampling temperature applied), and entropy.

    Position t holds log p(input_ids[t] | input_ids[:t]); position 0 gets 0 (never a loss token).
    A packed batch (`position_ids`, workbench.train.packing) holds several samples per row: each
    sample's first token (`starts`, else position id 0) gets 0 likewise, instead of a
    "prediction" from the previous sample's last token. A batch with shared prompts
    (`prompt_passes`) first runs the prompts and hands each row its prompt's keys/values as a
    KV cache (`_prompt_cache`): every logprob still comes from the previous token in its row.
    """
    import torch

    position_ids = batch.get("position_ids")
    # use_cache=False: a training pass needs no KV cache (its memory), and with one transformers
    # would not look for packed sequences in the position ids (flash-attention varlen)
    inputs = {
        "input_ids": batch["input_ids"],
        "attention_mask": _model_mask(batch.get("attention_mask"), model),
        "use_cache": False,
    }
    if position_ids is not None:
        inputs["position_ids"] = position_ids
    if "prompt_passes" in batch:  # use_cache: models may ignore the cache without it
        inputs.update(cache_argument(_prompt_cache(model, batch)), use_cache=True)
    targets = batch["input_ids"][:, 1:]
    head = _plain_head(model)
    if head is not None:  # the head, log-softmax and pick in chunks: no vocabulary-wide tensors
        weight, no_logits = head
        hidden = model(**inputs, output_hidden_states=True, **no_logits).hidden_states[-1]
        picked, entropy = selected_logprobs(hidden[:, :-1], weight, targets, max(temperature, 1e-6))
    else:
        logits = model(**inputs).logits[:, :-1].float()
        if temperature != 1.0:  # a full-vocabulary pass saved in the common case (x / 1.0 is x exactly)
            logits = logits / max(temperature, 1e-6)
        logprobs_all = torch.log_softmax(logits, dim=-1)
        picked = logprobs_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():  # a logged statistic: no graph (and no saved vocabulary-wide tensors) for it
            entropy = -(logprobs_all.exp() * logprobs_all).sum(-1)
    zeros = torch.zeros_like(picked[:, :1])
    picked, entropy = torch.cat([zeros, picked], dim=1), torch.cat([zeros, entropy], dim=1)
    starts = batch.get("starts")
    if starts is None and position_ids is not None:
        starts = position_ids == 0
    if starts is not None:
        picked, entropy = picked.masked_fill(starts, 0.0), entropy.masked_fill(starts, 0.0)
    return picked, entropy


def _prompt_cache(model: Any, batch: dict[str, Any]) -> Any:
    """Run the prompt passes (a common beginning, then what follows it, ...: see
    workbench.train.packing), each row reading its context's keys/values from the passes
    before, and keep every layer's keys/values of every prompt token (flattened, in the passes'
    flat order); return the final rows' contexts as a KV cache. Reading is a differentiable
    gather: each prompt token gets the sum of its readers' gradients, as k copies would."""
    import torch

    store: list[tuple[Any, Any]] | None = None  # per layer: (keys, values) [prompt tokens, heads, dim]
    one_row = _one_logit_row(model)
    for part in batch["prompt_passes"]:
        out = model(
            input_ids=part["input_ids"],
            attention_mask=_model_mask(part["attention_mask"], model),
            position_ids=part["position_ids"],
            **cache_argument(_read(store, part["context"])),
            use_cache=True,
            **one_row,
        )
        width = part["context"].shape[1]  # the cache holds the context, then this pass's own tokens
        own = [
            (_flatten(keys[:, :, width:]), _flatten(values[:, :, width:]))
            for keys, values in _cache_tensors(returned_cache(out))
        ]
        store = (
            own
            if store is None
            else [
                (torch.cat([k0, k1]), torch.cat([v0, v1]))
                for (k0, v0), (k1, v1) in zip(store, own, strict=True)
            ]
        )
    return _read(store, batch["context"])


def _read(store: list[tuple[Any, Any]] | None, context: Any) -> Any:
    """A KV cache with, for each row r, the stored tokens context[r] (keys/values [rows, heads, K, dim])."""
    from transformers import DynamicCache

    if store is None or context.shape[1] == 0:
        return None
    cache = DynamicCache()
    for layer, (keys, values) in enumerate(store):
        cache.update(keys[context].transpose(1, 2), values[context].transpose(1, 2), layer)
    return cache


def _flatten(states: Any) -> Any:
    """[rows, heads, L, dim] -> [rows * L, heads, dim], row-major (the flat token order)."""
    rows, heads, length, dim = states.shape
    return states.transpose(1, 2).reshape(rows * length, heads, dim)


def _cache_tensors(cache: Any) -> list[tuple[Any, Any]]:
    """Per layer (keys, values) of a transformers DynamicCache: `layers` since transformers 4.56,
    `key_cache` / `value_cache` lists before."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))


def _one_logit_row(model: Any) -> dict[str, Any]:
    """The keyword that makes a causal LM compute logits for one position only (the prefix
    pass needs none: with a large vocabulary, all of them would be the biggest tensor of the
    step): `logits_to_keep` (transformers >= 4.50), `num_logits_to_keep` before; none if unknown.

    `logits_to_keep` gets an index tensor, not the int 1: transformers slices an int as
    `hidden[:, -1:]`, a strided view, and under autograd torch multiplies a strided 3D input by
    the vocabulary matrix as a bmm against that matrix expanded per row, which bfloat16 copies
    first: 344 ms for SmolLM2's 4 prompts of a step, against 4 ms for the indexed (contiguous)
    position. Which position does not matter; its logits are never read."""
    import torch

    inner = unwrapped(model)
    name = _logits_keyword(type(inner).forward)
    if name == "logits_to_keep":
        device = next(inner.parameters()).device
        return {name: torch.zeros(1, dtype=torch.long, device=device)}
    return {name: 1} if name else {}


def _plain_head(model: Any) -> tuple[Any, dict[str, Any]] | None:
    """For `selected_logprobs`: the head's weight and the keyword that makes the model compute no
    logits (`logits_to_keep` given an empty index, transformers >= 4.50), when the head is plain
    (`selected_logprobs.plain_head_weight`); None when either is missing."""
    import torch

    inner = unwrapped(model)
    weight = plain_head_weight(model)
    if weight is None or _logits_keyword(type(inner).forward) != "logits_to_keep":
        return None
    return weight, {"logits_to_keep": torch.zeros(0, dtype=torch.long, device=weight.device)}


@functools.cache
def _logits_keyword(forward: Callable[..., object]) -> str | None:
    """(Once per model class's forward: signatures are slow to read, and this runs every micro-batch.)"""
    parameters = inspect.signature(forward).parameters
    return next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in parameters), None)


def _model_mask(mask: Any, model: Any) -> Any:
    """A packed batch's 4D bool mask as the additive float mask (0 attend, dtype min block) in
    the model's dtype: the 4D form every transformers version since 4.46 and every eager or
    SDPA attention takes as is. A 2D padding mask passes through."""
    import torch

    if mask is None or mask.dim() != 4 or mask.dtype != torch.bool:
        return mask
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


@dataclass(frozen=True)
class DPPOSettings:
    """The dppo knobs (prime-rl's [trainer.loss] names); the defaults and why are in schema.TrainConfig."""

    mask_low: float = 0.2
    mask_high: float = 0.2
    adv_tau: float = 1.0
    kl_tau: float = 1e-3


def policy_loss(
    kind: str,
    logprobs: Any,
    batch: dict[str, Any],
    *,
    clip_low: float,
    clip_high: float,
    cispo_clip: float,
    total_tokens: int,
    ref_logprobs: Any = None,
    kl_beta: float = 0.0,
    dppo: DPPOSettings = DPPOSettings(),
) -> tuple[Any, dict[str, float]]:
    """Sum of per-token losses of one micro-batch divided by the batch's loss-token count, and
    this micro-batch's statistics: means over its loss tokens (`kl`, `mismatch_kl`,
    `mismatch_kl_sq`, `ratio_mean`, `clip_frac`, and for dppo `masked_frac`, `masked_frac_high`,
    `masked_frac_low`), `mismatch_kl_max` over them, and their count `tokens`."""
    import torch

    mask = batch["loss_mask"]
    advantages = batch["advantages"]
    if advantages.dim() == 1:  # padded: one per sample (row); packed batches carry one per token
        advantages = advantages.unsqueeze(1)
    if "token_advantages" in batch:  # online distillation: the teacher's per-token signal
        advantages = advantages + batch["token_advantages"]
    log_ratio = (logprobs - batch["sampler_logprobs"]) * mask
    ratio = torch.exp(log_ratio)
    masks: dict[str, Any] = {}
    if kind == "cispo":
        weight = torch.clamp(ratio, max=cispo_clip).detach()
        per_token = -weight * advantages * logprobs
        clipped = (ratio > cispo_clip).float()
    elif kind == "dppo":
        per_token, masks = _dppo(logprobs, batch["sampler_logprobs"], log_ratio, ratio, advantages, dppo)
        clipped = masks["masked_frac"]  # the trust region's share, shown where the clip fraction is
    else:
        high = clip_high if kind == "dapo" else clip_low
        unclipped = ratio * advantages
        clipped_ratio = torch.clamp(ratio, 1 - clip_low, 1 + high)
        per_token = -torch.minimum(unclipped, clipped_ratio * advantages)
        clipped = (clipped_ratio != ratio).float()
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None:
        delta = (ref_logprobs - logprobs) * mask
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + kl_beta * kl
    loss = (per_token * mask).sum() / max(total_tokens, 1)
    n = mask.sum().clamp(min=1)
    ratio, kl, clipped = ratio.detach(), kl.detach(), clipped.detach()
    # How far the trainer's distribution is from the sampler's on the sampled tokens (k3 estimate of
    # KL(sampler || trainer)): 0 up to arithmetic when both compute the same function; a tokenization,
    # weight-sync or precision problem shows here before it shows as worse learning. The mean hides
    # a few bad tokens (one wrong id in a long sample), so the max and the spread are kept too
    # (prime-rl logs mismatch_kl mean, std and max); float64, as the squares of values near 1e-8
    # would lose their digits summed in float32.
    # expm1 in float64: r - 1 - log r in float32 cancels to small negative values for r near 1
    exact = log_ratio.detach().double()
    mismatch = (torch.expm1(exact) - exact) * mask
    return loss, {
        "kl": float((kl * mask).sum() / n),
        "mismatch_kl": float(mismatch.sum() / n),
        "mismatch_kl_sq": float((mismatch * mismatch).sum() / n),
        # k3 >= 0, and 0 off the mask: the plain max is the max over the loss tokens
        "mismatch_kl_max": float(mismatch.max()) if mismatch.numel() else 0.0,
        "ratio_mean": float((ratio * mask).sum() / n),
        "clip_frac": float((clipped * mask).sum() / n),
        **{name: float((value * mask).sum() / n) for name, value in masks.items()},
        "tokens": int(mask.sum()),
    }


def _dppo(
    logprobs: Any, sampler_logprobs: Any, log_ratio: Any, ratio: Any, advantages: Any, settings: DPPOSettings
) -> tuple[Any, dict[str, Any]]:
    """prime-rl's default loss per token (before the loss mask), and its masks as float tensors.

    DPPO's trust region is on the probability, not the ratio: a token is masked when the
    trainer's probability p moved away from the sampler's mu in the direction its advantage
    pushes — up by more than mask_high with A > 0, down by more than mask_low otherwise — so a
    rare token may grow many-fold while a likely one cannot run away. Masked tokens keep the KL
    term (kl_tau (log p - log mu)^2), which pulls the trainer back towards the sampler; the
    gradient of adv_tau r A goes through r (not detached), as in prime-rl."""
    import torch

    shift = torch.exp(logprobs.detach()) - torch.exp(sampler_logprobs)
    rose, fell = shift > settings.mask_high, shift < -settings.mask_low
    positive = advantages > 0
    masked = torch.where(positive, rose, fell)
    kept = (~masked).float()
    per_token = -kept * settings.adv_tau * advantages * ratio + settings.kl_tau * log_ratio**2
    return per_token, {
        "masked_frac": masked.float(),
        "masked_frac_high": (masked & positive).float(),  # masked with a positive advantage
        "masked_frac_low": (masked & ~positive).float(),  # masked with a negative (or zero) one
    }


def sft_loss(logprobs: Any, batch: dict[str, Any], total_tokens: int) -> Any:
    """Negative log-likelihood of the demonstration tokens, token-normalized over the batch."""
    return -(logprobs * batch["loss_mask"]).sum() / max(total_tokens, 1)
