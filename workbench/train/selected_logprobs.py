"""Each sampled token's logprob, and each position's entropy, straight from the final hidden
states: the language-model head, the log-softmax and the pick of the sampled token run over a
few positions at a time, and the backward pass recomputes them, so no tensor of
[rows, positions, vocabulary] is ever made for a whole micro-batch.

Why, measured: on SmolLM2-135M (vocabulary 49,152) an RL step of 128 rollouts built ~8 such
tensors per micro-batch (the logits, their float32 copy, the log-softmax, the entropy's exp and
product, their gradients), ~700 MB each. Each one is fresh memory that the kernel zeroes on first
touch: a quarter of the training process's CPU time went to that (perf: clear_page_erms). Chunks
of at most CHUNK_BYTES of float32 logits stay under glibc's 32 MB mmap ceiling, so a freed chunk
is reused by the next one instead of handed back and zeroed again.

The price is one more head matmul per chunk in the backward pass (the recomputed logits).

Simplifications: only for heads whose logits are exactly `hidden @ weight.T` (a bias-free
`nn.Linear` in the families of PLAIN_HEADS, not sharded by FSDP); every other model takes the
plain path in `loss.token_logprobs`. The head's matmul runs in the dtype autocast gives it (or
the weights' own), as the model's own head would.
"""

from __future__ import annotations

from typing import Any

import torch

# Model families whose causal-LM head is `lm_head(hidden)` and nothing more (no soft-capping,
# no logit scale): a head of another family is not assumed to be.
PLAIN_HEADS = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# float32 logits per chunk: under glibc's largest mmap threshold (32 MB), so chunks reuse memory
CHUNK_BYTES = 16 << 20


def plain_head_weight(model: Any) -> torch.Tensor | None:
    """The weight of `model`'s head when its logits are exactly `hidden @ weight.T`, else None
    (`model` may be wrapped by peft or DDP)."""
    inner = unwrapped(model)
    if getattr(getattr(inner, "config", None), "model_type", None) not in PLAIN_HEADS:
        return None
    head = inner.get_output_embeddings()
    # peft's LoRA on the head replaces the nn.Linear with its own layer: not plain any more
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    if not _is_plain_tensor(head.weight):  # FSDP2 shards it (a DTensor) outside its forward
        return None
    return head.weight


def unwrapped(model: Any) -> Any:
    """The transformers model inside DDP and peft wrappers."""
    inner = getattr(model, "module", model)  # DDP
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner  # peft


def _is_plain_tensor(weight: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return True
    return not isinstance(weight, DTensor)


def selected_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(hidden @ weight.T / temperature)[target] at each position of `hidden`
    ([..., H]; `targets` [...]), float32, differentiable in `hidden` (and `weight` if it trains);
    and the entropy of that distribution at each position (a statistic: no gradient). Positions
    go through in chunks of at most `chunk_bytes` of float32 logits."""
    dtype = _matmul_dtype(hidden, weight)
    flat = hidden.reshape(-1, hidden.shape[-1])
    rows = max(1, chunk_bytes // (4 * weight.shape[0]))
    picked, entropy = _SelectedLogprobs.apply(
        flat, weight, targets.reshape(-1), 1.0 / temperature, dtype, rows
    )
    return picked.view(targets.shape), entropy.view(targets.shape)


def _matmul_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the head's matmul runs in: autocast's where it is on, else the inputs' common one."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


class _SelectedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        scale: float,
        dtype: torch.dtype,
        rows: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, w = hidden.to(dtype), weight.to(dtype)
        picked = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
        entropy = torch.empty_like(picked)
        lse = torch.empty_like(picked)
        for start in range(0, h.shape[0], rows):
            part = slice(start, start + rows)
            logits = _logits(h[part], w, scale)
            lse[part] = torch.logsumexp(logits, dim=-1)
            logprobs = logits.sub_(lse[part, None])  # in place: the chunk's one vocabulary-wide tensor
            picked[part] = logprobs.gather(-1, targets[part, None]).squeeze(-1)
            entropy[part] = -logprobs.exp().mul_(logprobs).sum(-1)
        ctx.save_for_backward(h, w, targets, lse)
        ctx.scale, ctx.rows, ctx.hidden_dtype = scale, rows, hidden.dtype
        ctx.weight_dtype = weight.dtype if weight.requires_grad else None  # a frozen head gets no gradient
        ctx.mark_non_differentiable(entropy)
        return picked, entropy

    @staticmethod
    def backward(ctx: Any, grad_picked: torch.Tensor, _grad_entropy: torch.Tensor) -> tuple[Any, ...]:
        h, w, targets, lse = ctx.saved_tensors
        grad_hidden = torch.empty(h.shape, dtype=ctx.hidden_dtype, device=h.device)
        trains = ctx.weight_dtype is not None
        grad_weight = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if trains else None
        g = grad_picked.float()
        for start in range(0, h.shape[0], ctx.rows):
            part = slice(start, start + ctx.rows)
            # d picked / d logits = onehot(target) - softmax, times the temperature's scale
            grad_logits = _logits(h[part], w, ctx.scale).sub_(lse[part, None]).exp_().mul_(-g[part, None])
            grad_logits.scatter_add_(-1, targets[part, None], g[part, None])
            grad_logits = grad_logits.mul_(ctx.scale).to(w.dtype)
            grad_hidden[part] = grad_logits @ w
            if grad_weight is not None:
                grad_weight += (grad_logits.T @ h[part]).float()
        weight_grad = grad_weight.to(ctx.weight_dtype) if grad_weight is not None else None
        return grad_hidden, weight_grad, None, None, None, None


def _logits(h: torch.Tensor, w: torch.Tensor, scale: float) -> torch.Tensor:
    logits = (h @ w.T).float()
    return logits.mul_(scale) if scale != 1.0 else logits
