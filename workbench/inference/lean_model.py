"""A lean forward pass for Llama-family decoders over a preallocated KV cache.

`generation`'s decode loop spends most of a step, for a small model, in the Hugging Face
forward's bookkeeping (the growing `DynamicCache` concatenates every step, masks and
rotary tables are rebuilt, many small modules are called). `LeanModel` computes the same
function directly: embed, per layer RMSNorm -> q/k/v -> (q/k norm) -> rotary -> write K/V
into `KVCache` at each row's own position -> attention over the cached keys -> o_proj -> MLP,
then the final norm and `lm_head` for the positions whose logits are wanted. Tokens are
packed (no padding) for everything but attention, which runs on [rows, longest row] queries.
The cache, shared prefix and batch structures are in `lean_cache`.

Supported: `model_type` llama, mistral, qwen2 (attention bias), qwen3 (q/k norm), with full
attention on every layer, SiLU MLP and a rotary embedding whose table does not depend on the
sequence length; anything else (and FSDP-sharded weights) gets `None` from `LeanModel.build`
and the caller keeps the Hugging Face path.

Current weights, always: `LeanModel` keeps references to the model's *modules* and reads
`weight` at each call, so in-place updates (an optimizer step, `load_weights_in_place`) are seen
at once. The one copy: for a small model, q/k/v and gate/up run as one matmul each over their
stacked weights (`lean_fused.Fused`; o and down over transposed copies), re-made whenever a
source's version counter moves. A peft LoRA layer over a plain `nn.Linear` is fused by its base
weight, its active adapters run beside it as one low-rank pass with peft's arithmetic and its
enable/disable switches; any other projection (a LoRA variant such as DoRA, a quantized linear)
is called as a module. A module swapped for another object (peft injecting layers) is not
followed: `reads` tells whether a `LeanModel` still reads a model's current modules, and
`LocalClient` builds a new one when it does not (or when weights changed under its lock).

Decode steps (one query per row) cost, for a small model, about one dispatch per op, so the
step is written for few ops: fused projections, the rotary embedding of q and k as one in-place
complex multiply, one `index_put_` per layer for keys and values, residual adds fused into
`addmm`, and attention as a handful of batched matmuls with additive masks (`lean_attention`;
with 16-bit weights on a CPU, the flash kernel). A prefill's last layer runs only at each row's
last token.

"Pairs" head-dim order: q and k are used with the two halves of each head interleaved
(HF index i and i + head_dim/2 side by side), so a rotary pair is one complex number and the
rotation is `view_as_complex(x) *= cos + i sin` (the same products and sums as HF's
`x * cos + rotate_half(x) * sin`, one op instead of four). The order is the same for q and k,
so their dot products are those of HF's order summed in another order; cached keys are kept
in it. Fused q/k weights are stored with their rows in that order (no per-step permutation);
projections that are not fused are permuted after the fact (`_qkv`). Dtypes without a complex
counterpart (bfloat16) rotate with real ops in the same order.

Cascade attention: keys/values of a prompt prefix many rows share (`SharedPrefix`: a system
prompt, an RL group's prompt) are stored once. Decoding attends to it as one matmul for all
rows plus each row's own keys, merged in one softmax, so the prefix is read once per step
instead of once per row (`lean_attention`). Rows of a batch are slots [first, first + n): the decode loop keeps
live rows contiguous (see `decode_engine`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.inference.lean_attention import Attention
from workbench.inference.lean_cache import ForwardBatch, KVCache, SharedPrefix, round_up
from workbench.inference.lean_fused import Fused, base_linear

__all__ = ["ForwardBatch", "KVCache", "LeanModel", "SharedPrefix", "unsupported_reason", "unwrap_causal_lm"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# Rotary types whose cos/sin at a position do not depend on the sequence length (dynamic NTK
# and longrope switch tables with it), so one table per session is exact.
_STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass
class _Layer:
    input_norm: Any
    q: Any
    k: Any
    v: Any
    o: Any
    q_norm: Any  # None unless the model normalizes q/k per head (qwen3)
    k_norm: Any
    post_norm: Any
    gate: Any
    up: Any
    down: Any
    qkv: Fused | None = None  # q, k and v as one matmul, when `Fused` applies
    gate_up: Fused | None = None
    o_copy: Fused | None = None  # o and down alone, for their transposed copies (a plain matmul)
    down_copy: Fused | None = None


class LeanModel:
    """The forward pass of a supported Hugging Face causal LM on a `KVCache`."""

    # Fused copies (`Fused`) cost memory: made only while all of them together stay under this
    # size, i.e. for small models, whose steps are dominated by per-op overhead (a large model's
    # matmuls are arithmetic-bound and gain nothing from fusion). 512 MB takes in SmolLM2-135M
    # even in float32 (its copies: 408 MB; 204 MB in bfloat16), where fusing measured, 64 rows x
    # 64 tokens on 2 cores: 2 threads float32 390 -> 445 tokens/s, 1 thread +5% (float32 and
    # bfloat16). A 1B model's copies (4 GB in float32) would double its memory: not made.
    FUSE_MAX_BYTES = 512 << 20

    def __init__(self, lm: Any, config: Any) -> None:
        import torch

        decoder = lm.model
        self.config = config
        self.embed = decoder.embed_tokens
        self.norm = decoder.norm
        self.lm_head = lm.lm_head
        self.rotary = decoder.rotary_emb
        self._sources = [_modules_of(layer) for layer in decoder.layers]  # what `reads` compares
        self.layers = [_Layer(*modules) for modules in self._sources]
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = float(config.rms_norm_eps)
        weight = self.lm_head.weight if hasattr(self.lm_head, "weight") else next(lm.parameters())
        self.dtype, self.device = weight.dtype, weight.device
        # Rotary table, extended on demand: complex [positions, 1, head_dim / 2] cos + i sin, or,
        # for dtypes without a complex counterpart, real [positions, 2, 1, head_dim] (see `_rotary`).
        self._rope: Any = None
        self._complex_rope = self.dtype in (torch.float32, torch.float64)
        self.attention = Attention(self.heads, self.kv_heads, self.head_dim, self.dtype, self.device)
        self._pairs = _pairs_order(self.head_dim, self.device)
        self._fuse()

    @classmethod
    def build(cls, model: Any) -> LeanModel | None:
        """A `LeanModel` over `model`'s current modules, or None when it is not supported."""
        lm = unwrap_causal_lm(model)
        if lm is None or unsupported_reason(lm) is not None:
            return None
        try:
            return cls(lm, lm.config)
        except AttributeError:  # a supported model_type with an unexpected module layout
            return None

    def reads(self, model: Any) -> bool:
        """Whether this forward reads `model`'s current modules (built over them, and none has
        been replaced since, e.g. by peft injecting its layers)."""
        lm = unwrap_causal_lm(model)
        if lm is None or lm.lm_head is not self.lm_head:
            return False
        decoder = lm.model
        if decoder.embed_tokens is not self.embed or decoder.norm is not self.norm:
            return False
        if decoder.rotary_emb is not self.rotary or len(decoder.layers) != len(self.layers):
            return False
        return all(
            mine is theirs
            for layer, sources in zip(decoder.layers, self._sources, strict=True)
            for mine, theirs in zip(sources, _modules_of(layer), strict=True)
        )

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, dtype=self.dtype, device=self.device)

    def _fuse(self) -> None:
        stacked = [
            (layer, name, modules)
            for layer in self.layers
            for name, modules in (("qkv", [layer.q, layer.k, layer.v]), ("gate_up", [layer.gate, layer.up]))
        ]
        alone = [
            (layer, name, [module])
            for layer in self.layers
            for name, module in (("o_copy", layer.o), ("down_copy", layer.down))
        ]
        budget = self.FUSE_MAX_BYTES
        for groups in (stacked, alone):  # q/k/v and gate/up first (they save ops); o and down if they fit too
            groups = [group for group in groups if Fused.applies(group[2])]
            size = sum(
                base_linear(m).weight.numel() * base_linear(m).weight.element_size()
                for _, _, modules in groups
                for m in modules
            )
            if size > budget:
                return
            budget -= size
            for layer, name, modules in groups:
                # q/k rows in pairs order, unless a q/k norm (whose weight is in HF order) comes first.
                pairs = name == "qkv" and layer.q_norm is None
                setattr(layer, name, Fused(modules, self._qkv_rows(modules) if pairs else None))

    def _qkv_rows(self, modules: list[Any]) -> Any:
        """Fused q/k/v output rows: each q and k head's in pairs order, v's as they are."""
        import torch

        q, k, v = (base_linear(m).weight for m in modules)
        qk_rows = q.shape[0] + k.shape[0]
        heads = torch.arange(0, qk_rows, self.head_dim, device=self.device).unsqueeze(1)
        values = torch.arange(qk_rows, qk_rows + v.shape[0], device=self.device)
        return torch.cat(((heads + self._pairs).flatten(), values))

    def _refresh_fused(self) -> None:
        """Re-copy fused weights whose sources changed (cheap to check: once per forward)."""
        for layer in self.layers:
            for name in ("qkv", "gate_up", "o_copy", "down_copy"):
                fused = getattr(layer, name)
                if fused is not None and fused.stale():
                    if Fused.applies(fused.modules):
                        fused.refresh()
                    else:  # a bias appeared on one of them, or a dtype changed: unfused from now on
                        setattr(layer, name, None)

    def forward(
        self,
        cache: KVCache,
        batch: ForwardBatch,
        prefix: SharedPrefix | None = None,
        *,
        check_weights: bool = True,
    ) -> Any:
        """Run `batch`, writing its keys/values into `cache`; returns float32 logits [rows, vocab]
        at each row's last token (every token for a decode batch), or None for `batch.last` = -1.
        With `prefix`, rows flagged in `batch.prefix_rows` (all when None) also attend to the
        shared prefix's keys, which precede the keys in their own slots. `check_weights=False`
        skips looking for weight changes since the last call (a decode loop whose weights are
        held still: the check is a few dozen Python operations per step)."""
        import torch

        if check_weights:
            self._refresh_fused()
        rows, width = batch.rows, batch.width
        rope = self._rotary(batch.positions, batch.max_position)
        live = slice(batch.first_slot, batch.first_slot + rows)
        attend = self.attention
        mask = attend.prefill_mask(batch) if width > 1 else None
        bias = None  # (own keys, prefix) additive masks of the one-query attention, made when first needed
        write = cache.write_index(batch.slots, batch.cache_index)  # the same rows in every layer
        # Made per pass and indexed per layer (not kept, not `unbind`): outside inference mode,
        # autograd rejects in-place writes to older views and to `unbind`'s.
        layer_rows = cache.data.view(len(self.layers), -1, self.head_dim)
        own = cache.data[
            :, :, live, :, : batch.key_length
        ]  # [layers, 2, rows, kv_heads, keys, head_dim] views
        if width == 1 and attend.flash_decode:  # per layer, keys and values [rows, kv_heads, keys, d]
            own = list(zip(own[:, 0].unbind(0), own[:, 1].unbind(0)))
        elif (
            width == 1
        ):  # per layer, keys transposed [rows * kv_heads, d, keys] and values [rows * kv_heads, keys, d]
            own = list(
                zip(own[:, 0].flatten(1, 2).transpose(2, 3).unbind(0), own[:, 1].flatten(1, 2).unbind(0))
            )
        x = _embed(self.embed, batch.tokens)  # [N, hidden]: packed, no padding
        last_layer = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.input_norm, self.eps)
            q, kv = self._qkv(layer, h, rope)
            layer_rows[index].index_put_((write,), kv)
            own_k, own_v = own[index]
            if index == last_layer and batch.last is not None:
                # The cache has every token's keys now; what follows only feeds the logits, which
                # are wanted at each row's last token (or not at all): run it for those alone.
                if isinstance(batch.last, int):
                    return None
                if width > 1:
                    x, q, width = x[batch.last], q[batch.last], 1
                    if not attend.flash_decode:
                        own_k, own_v = own_k.flatten(0, 1).transpose(1, 2), own_v.flatten(0, 1)
            if width == 1 and attend.flash_decode:
                if bias is None:
                    bias = attend.flash_bias(batch)
                attention = attend.one_flash(q, own_k, own_v, bias, batch, prefix, index)
            elif width == 1:
                if bias is None:
                    bias = attend.decode_bias(batch, prefix is not None)
                attention = attend.one(q, own_k, own_v, bias, prefix, index)
            else:
                attention = attend.rows(q, own_k, own_v, mask, batch, prefix, index)
            x = _linear_add(layer.o, layer.o_copy, attention, x)
            h = _rms_norm(x, layer.post_norm, self.eps)
            x = _linear_add(layer.down, layer.down_copy, self._gate_up(layer, h), x)
        logits = _linear(self.lm_head, _rms_norm(x, self.norm, self.eps))
        return logits if logits.dtype == torch.float32 else logits.float()

    def _qkv(self, layer: _Layer, h: Any, rope: Any) -> tuple[Any, Any]:
        """Rotated queries [N, heads, d] and keys then values [N, 2 * kv_heads, d] (what the cache
        takes in one write), q and k in pairs order: views into one [N, heads + 2 * kv_heads, d]."""
        import torch

        count, dim, heads, kv = h.shape[0], self.head_dim, self.heads, self.kv_heads
        fused = layer.qkv(h).view(count, heads + 2 * kv, dim) if layer.qkv is not None else None
        if fused is not None and layer.q_norm is None:
            qkv = fused  # its q/k rows are already in pairs order (`_fuse`)
        else:
            if fused is not None:
                q, k, v = fused[:, :heads], fused[:, heads : heads + kv], fused[:, heads + kv :]
            else:
                q = _linear(layer.q, h).view(count, heads, dim)
                k = _linear(layer.k, h).view(count, kv, dim)
                v = _linear(layer.v, h).view(count, kv, dim)
            if layer.q_norm is not None:
                q, k = _rms_norm(q, layer.q_norm, self.eps), _rms_norm(k, layer.k_norm, self.eps)
            qkv = torch.cat((q[..., self._pairs], k[..., self._pairs], v), dim=1)
        _rotate(qkv[:, : heads + kv], rope)
        return qkv[:, :heads], qkv[:, heads:]

    def _gate_up(self, layer: _Layer, h: Any) -> Any:
        """The MLP's silu(gate(h)) * up(h); fused, in place in the gate's half of the output (no new
        buffers: at prefill sizes fresh ones cost page faults)."""
        import torch.nn.functional as F

        if layer.gate_up is not None:
            both = layer.gate_up(h)
            half = both.shape[-1] // 2
            return F.silu(both[:, :half], inplace=True).mul_(both[:, half:])
        return F.silu(_linear(layer.gate, h)) * _linear(layer.up, h)  # module outputs: not ours to overwrite

    def _rotary(self, positions: Any, max_position: int | None = None) -> Any:
        """The rotation of each of `positions` [N] for `_rotate`: complex [N, 1, head_dim / 2], or
        real [N, 2, 1, head_dim] (cos, signed sin), from a table made by the model's own rotary
        module (so scaled rope types and their attention factor come out exactly as in HF)."""
        import torch

        needed = (int(positions.max()) if max_position is None else max_position) + 1
        if self._rope is None or self._rope.shape[0] < needed:
            length = round_up(max(needed, 2 * (0 if self._rope is None else self._rope.shape[0])), 256)
            ids = torch.arange(length, device=self.device).unsqueeze(0)
            probe = torch.empty((1, 1), dtype=self.dtype, device=self.device)
            cos, sin = self.rotary(probe, ids)
            cos, sin = cos[0], sin[0]
            half = self.head_dim // 2
            # HF's tables repeat one set of angles in both halves (`cat((freqs, freqs))`): the
            # rotation of pair (i, i + half) by angle i is what the pairs order relies on.
            if not (torch.equal(cos[:, :half], cos[:, half:]) and torch.equal(sin[:, :half], sin[:, half:])):
                raise ValueError("rotary tables whose two halves differ are not supported")
            cos, sin = cos[:, :half], sin[:, :half]
            if self._complex_rope:
                self._rope = torch.complex(cos, sin).unsqueeze(1)
            else:  # pair (a, b) -> (a cos - b sin, b cos + a sin) = x * cos + swap(x) * [-sin, sin]
                signed = torch.stack((-sin, sin), dim=-1).flatten(-2)
                self._rope = torch.stack((cos.repeat_interleave(2, dim=-1), signed), dim=1).unsqueeze(2)
        return self._rope[positions]


def unwrap_causal_lm(model: Any) -> Any | None:
    """The Hugging Face `*ForCausalLM` inside `model` (a peft `PeftModel`'s base model), or
    None for wrappers the lean path cannot see through (DDP, FSDP's wrapper classes)."""
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        model = model.get_base_model()
    return model if hasattr(model, "model") and hasattr(model, "lm_head") else None


def unsupported_reason(lm: Any) -> str | None:
    """Why `LeanModel` cannot run this causal LM, or None when it can."""
    config = lm.config
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return f"model_type {getattr(config, 'model_type', None)!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r}"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "sliding-window layers"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if (rope.get("rope_type") or rope.get("type") or "default") not in _STATIC_ROPE_TYPES:
        return f"rope type {rope.get('rope_type') or rope.get('type')!r}"
    decoder = lm.model
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if not all(hasattr(decoder, name) for name in needed):
        return "unexpected module layout"
    parameters = list(lm.parameters())
    if any(type(p).__name__ == "DTensor" for p in parameters):
        return "sharded (FSDP) weights"
    if len({p.device for p in parameters}) != 1:
        return "weights on several devices"
    return None


def _modules_of(layer: Any) -> tuple[Any, ...]:
    """A Hugging Face decoder layer's modules, in `_Layer`'s field order."""
    attention, mlp = layer.self_attn, layer.mlp
    return (
        layer.input_layernorm,
        attention.q_proj,
        attention.k_proj,
        attention.v_proj,
        attention.o_proj,
        getattr(attention, "q_norm", None),
        getattr(attention, "k_norm", None),
        layer.post_attention_layernorm,
        mlp.gate_proj,
        mlp.up_proj,
        mlp.down_proj,
    )


def _embed(module: Any, ids: Any) -> Any:
    import torch
    import torch.nn.functional as F

    if type(module) is torch.nn.Embedding and module.max_norm is None:
        return F.embedding(ids, _param(module, "weight"), module.padding_idx)
    return module(ids)


def _linear(module: Any, x: Any) -> Any:
    """A projection: straight to `F.linear` for a plain `nn.Linear` (skips module-call overhead),
    else the module itself (peft LoRA layers, quantized linears)."""
    import torch
    import torch.nn.functional as F

    if type(module) is torch.nn.Linear:
        return F.linear(x, _param(module, "weight"), _param(module, "bias"))
    return module(x)


def _param(module: Any, name: str) -> Any:
    """`module.<name>` for a parameter, read from `_parameters` directly: `nn.Module.__getattr__`
    costs about a microsecond, and a decode step reads a few dozen of these."""
    params = module._parameters
    return params[name] if name in params else getattr(module, name)


def _linear_add(module: Any, copy: Fused | None, x: Any, residual: Any) -> Any:
    """residual + module(x): one `addmm` for a plain bias-free `nn.Linear` (the residual add fused
    into the matmul; over `copy`'s transposed weight when there is one), else the two ops."""
    import torch

    if copy is not None and x.dim() == 2:
        if copy.bias is None and copy.low_rank is None:
            return torch.addmm(residual, x, copy.weight_t)
        # With adapters, their sum is cast to the model's dtype before the residual add, as in peft.
        return residual + copy(x)
    if type(module) is torch.nn.Linear and _param(module, "bias") is None and x.dim() == 2:
        return torch.addmm(residual, x, _param(module, "weight").t())
    return residual + _linear(module, x)


def _rms_norm(x: Any, norm: Any, eps: float) -> Any:
    """HF's Llama RMSNorm: normalize in float32, cast back, then scale by the weight. In float32
    as a chain of in-place ops: the same arithmetic as HF (and as `F.rms_norm`, bit for bit),
    fewer dispatches and buffers than `F.rms_norm`'s composite."""
    import torch

    eps = getattr(norm, "variance_epsilon", eps)
    weight = _param(norm, "weight")
    if x.dtype == torch.float32:
        return (x * (x * x).mean(-1, keepdim=True).add_(eps).rsqrt_()).mul_(weight)
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def _pairs_order(head_dim: int, device: Any) -> Any:
    """[head_dim]: the HF head-dim index at each position of the pairs order (0, h, 1, h + 1, ...)."""
    import torch

    half = torch.arange(head_dim // 2, device=device)
    return torch.stack((half, half + head_dim // 2), dim=1).flatten()


def _rotate(x: Any, rope: Any) -> None:
    """Apply HF's rotary embedding (`apply_rotary_pos_emb`) in place to `x` [N, heads, head_dim]
    (a view, pairs order), with `rope` from `LeanModel._rotary`."""
    import torch

    count, heads, dim = x.shape
    pairs = x.view(count, heads, dim // 2, 2)
    if rope.is_complex():
        torch.view_as_complex(pairs).mul_(rope)
    else:
        x.copy_(x * rope[:, 0] + pairs.flip(-1).view(count, heads, dim) * rope[:, 1])
