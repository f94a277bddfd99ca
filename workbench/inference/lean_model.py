"""A lean forward pass for Llama-family decoders over a preallocated KV cache.

`generation`'s decode loop spends most of a step, for a small model, in the Hugging Face
forward's bookkeeping (the growing `DynamicCache` concatenates every step, masks and
rotary tables are rebuilt, many small modules are called). `LeanModel` computes the same
function directly: embed, per layer RMSNorm -> q/k/v -> (q/k norm) -> rotary -> write K/V
into `KVCache` at each row's own position -> attention over the cached keys -> o_proj -> MLP,
then the final norm and `lm_head` for the positions whose logits are wanted. Tokens are
packed (no padding) for everything but attention, which runs on [rows, longest row] queries.

Supported: `model_type` llama, mistral, qwen2 (attention bias), qwen3 (q/k norm), with full
attention on every layer, SiLU MLP and a rotary embedding whose table does not depend on the
sequence length; anything else (and FSDP-sharded weights) gets `None` from `LeanModel.build`
and the caller keeps the Hugging Face path.

Current weights, always: `LeanModel` keeps references to the model's *modules*, not copies
of their tensors, and reads `weight` at each call, so in-place updates (an optimizer step,
`load_weights_in_place`) are seen at once. A projection that is not a plain `nn.Linear`
(a peft LoRA layer, runtime or trained) is called as a module, so adapters and their
enable/disable switches apply exactly as in the Hugging Face forward. Build one per decode
session: a module swapped for another object (peft injecting layers) is picked up by the next.

Cache layout: one tensor [layers, 2 (k, v), slots, kv_heads, length, head_dim]; a row lives in
one slot, its token at position p at index p - offset (no padding inside a slot), where offset
is the length of a `SharedPrefix` the row uses (0 if none): keys/values of a prompt prefix many
rows share (a system prompt, an RL group's prompt) stored once. Decoding attends to it as one
matmul for all rows plus each row's own keys, merged in one softmax ("cascade" attention), so
the prefix is read once per step instead of once per row. Rows of a batch are slots
[first, first + n): the decode loop keeps live rows contiguous (see `decode_engine`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# Rotary types whose cos/sin at a position do not depend on the sequence length (dynamic NTK
# and longrope switch tables with it), so one table per session is exact.
_STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class KVCache:
    """Preallocated keys and values; grows (by copying, rarely) when asked for more."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, *, dtype: Any, device: Any) -> None:
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.data: Any = None
        self.slots = 0
        self.length = 0

    def reserve(self, slots: int, length: int, *, keep_slots: int, keep_length: int) -> None:
        """Make room for `slots` x `length`, keeping slots [0, keep_slots) up to `keep_length`.
        Sizes round up (length to 64, at least doubling) so growth happens O(log) times."""
        import torch

        if slots <= self.slots and length <= self.length:
            return
        new_slots = max(slots, self.slots)
        new_length = max(_round_up(length, 64), self.length * 2 if length > self.length else self.length)
        # Zeros, not empty: masked-out keys still enter q.k, and NaN garbage would survive the mask.
        data = torch.zeros((self.layers, 2, new_slots, self.kv_heads, new_length, self.head_dim),
                           dtype=self.dtype, device=self.device)
        if self.data is not None and keep_slots and keep_length:
            data[:, :, :keep_slots, :, :keep_length] = self.data[:, :, :keep_slots, :, :keep_length]
        self.data, self.slots, self.length = data, new_slots, new_length

    def fits(self, model: LeanModel) -> bool:
        """Whether this cache has `model`'s shape, dtype and device (so it can be reused)."""
        return (self.layers, self.kv_heads, self.head_dim, self.dtype, self.device) == (
            len(model.layers), model.kv_heads, model.head_dim, model.dtype, model.device)

    def copy_slots(self, dst: Any, src: Any, length: int) -> None:
        """Slots `dst` take the first `length` positions of slots `src` (index tensors)."""
        if length > 0 and len(dst):
            self.data[:, :, dst, :, :length] = self.data[:, :, src, :, :length]


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


class LeanModel:
    """The forward pass of a supported Hugging Face causal LM on a `KVCache`."""

    def __init__(self, lm: Any, config: Any) -> None:
        decoder = lm.model
        self.config = config
        self.embed = decoder.embed_tokens
        self.norm = decoder.norm
        self.lm_head = lm.lm_head
        self.rotary = decoder.rotary_emb
        self.layers = [_Layer(
            layer.input_layernorm, layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
            layer.self_attn.o_proj, getattr(layer.self_attn, "q_norm", None), getattr(layer.self_attn, "k_norm", None),
            layer.post_attention_layernorm, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj,
        ) for layer in decoder.layers]
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = self.head_dim**-0.5
        self.eps = float(config.rms_norm_eps)
        weight = self.lm_head.weight if hasattr(self.lm_head, "weight") else next(lm.parameters())
        self.dtype, self.device = weight.dtype, weight.device
        self._cos: Any = None  # [positions, head_dim] rotary tables, extended on demand
        self._sin: Any = None

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

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, dtype=self.dtype, device=self.device)

    def forward(self, cache: KVCache, batch: ForwardBatch, prefix: SharedPrefix | None = None) -> Any:
        """Run `batch`, writing its keys/values into `cache`; returns float32 logits [rows, vocab]
        at each row's last token (every token for a decode batch), or None for `batch.last` = -1.
        With `prefix`, rows flagged in `batch.prefix_rows` (all when None) also attend to the
        shared prefix's keys, which precede the keys in their own slots."""
        import torch
        import torch.nn.functional as F

        rows, width = batch.rows, batch.width
        cos, sin = self._rotary(batch.positions)  # [N, 1, head_dim]: broadcast over heads
        keys = torch.arange(batch.key_length, device=self.device)
        mask = (keys <= batch.query_index.unsqueeze(-1)).unsqueeze(1)  # [rows, 1, width, keys]
        live = slice(batch.first_slot, batch.first_slot + rows)
        # Cache writes through a flat view: one index_copy_ per tensor instead of an index_put.
        flat = ((batch.slots * self.kv_heads).unsqueeze(1) + torch.arange(self.kv_heads, device=self.device))
        flat = (flat * cache.length + batch.cache_index.unsqueeze(1)).view(-1)
        x = _embed(self.embed, batch.tokens)  # [N, hidden]: packed, no padding
        for index, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.input_norm, self.eps)
            q, k, v = self._qkv(layer, h, cos, sin)
            k_cache, v_cache = cache.data[index, 0], cache.data[index, 1]
            k_cache.view(-1, self.head_dim).index_copy_(0, flat, k.reshape(-1, self.head_dim))
            v_cache.view(-1, self.head_dim).index_copy_(0, flat, v.reshape(-1, self.head_dim))
            if batch.scatter is not None:  # prefill: queries to [rows, width] for one batched attention
                q = q.new_zeros((rows * width, self.heads, self.head_dim)).index_copy_(0, batch.scatter, q)
            q = q.view(rows, width, self.heads, self.head_dim)
            own_k, own_v = k_cache[live, :, : batch.key_length], v_cache[live, :, : batch.key_length]
            if prefix is not None and width == 1:
                attention = self._attend_with_prefix(q, own_k, own_v, mask, prefix, index, batch.prefix_rows)
            else:
                keys_k, keys_v, keys_mask = own_k, own_v, mask
                if prefix is not None:  # prefill: a one-off per-row copy of the prefix keys is cheaper
                    keys_k, keys_v, keys_mask = _with_prefix(own_k, own_v, mask, prefix, index, batch.prefix_rows)
                attention = F.scaled_dot_product_attention(
                    q.transpose(1, 2), keys_k, keys_v, attn_mask=keys_mask, scale=self.scale,
                    enable_gqa=self.kv_heads != self.heads,
                ).transpose(1, 2)
            attention = attention.reshape(rows * width, self.heads * self.head_dim)
            if batch.scatter is not None:
                attention = attention[batch.scatter]
            x = x + _linear(layer.o, attention)
            h = _rms_norm(x, layer.post_norm, self.eps)
            x = x + _linear(layer.down, F.silu(_linear(layer.gate, h)) * _linear(layer.up, h))
        if batch.last is not None:
            if isinstance(batch.last, int):
                return None
            x = x[batch.last]
        return _linear(self.lm_head, _rms_norm(x, self.norm, self.eps)).float()

    def _qkv(self, layer: _Layer, h: Any, cos: Any, sin: Any) -> tuple[Any, Any, Any]:
        """Rotated queries [N, heads, d] and keys [N, kv_heads, d], and values [N, kv_heads, d].
        (Fusing q/k/v into one matmul over concatenated weights was measured slower here.)"""
        count, dim = h.shape[0], self.head_dim
        q = _linear(layer.q, h).view(count, self.heads, dim)
        k = _linear(layer.k, h).view(count, self.kv_heads, dim)
        v = _linear(layer.v, h).view(count, self.kv_heads, dim)
        if layer.q_norm is not None:
            q, k = _rms_norm(q, layer.q_norm, self.eps), _rms_norm(k, layer.k_norm, self.eps)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def _attend_with_prefix(self, q: Any, own_k: Any, own_v: Any, mask: Any, prefix: SharedPrefix, layer: int,
                            prefix_rows: Any) -> Any:
        """Softmax attention over [shared prefix keys, own keys] without materializing the prefix
        per row ("cascade" attention): the prefix is read once for all queries, as one matmul.
        `q` [rows, width, heads, head_dim]; returns [rows, width, heads, head_dim]."""
        rows, width, heads, dim = q.shape
        kv, groups = self.kv_heads, heads // self.kv_heads
        # Query head h = kv * groups + g uses key head kv (HF's repeat_kv order).
        queries = (q * self.scale).view(rows, width, kv, groups, dim).permute(0, 2, 3, 1, 4)  # [rows, kv, g, width, d]
        own = queries.reshape(rows, kv, groups * width, dim) @ own_k.transpose(-1, -2)
        own = own.view(rows, kv, groups, width, -1).masked_fill(~mask.unsqueeze(1), float("-inf"))
        pre_k, pre_v = prefix.cache.data[layer, 0, 0, :, : prefix.length], prefix.cache.data[layer, 1, 0, :, : prefix.length]
        stacked = queries.permute(1, 0, 2, 3, 4).reshape(kv, rows * groups * width, dim)
        pre = (stacked @ pre_k.transpose(-1, -2)).view(kv, rows, groups, width, -1).permute(1, 0, 2, 3, 4)
        if prefix_rows is not None:  # rows without the prefix: its keys do not exist for them
            pre = pre.masked_fill(~prefix_rows.view(rows, 1, 1, 1, 1), float("-inf"))
        own, pre = own.float(), pre.float()  # softmax in float32 whatever the model's dtype (as SDPA)
        top = own.amax(-1, keepdim=True).maximum(pre.amax(-1, keepdim=True))  # finite: a query sees itself
        own, pre = (own - top).exp(), (pre - top).exp()
        total = own.sum(-1, keepdim=True) + pre.sum(-1, keepdim=True)
        out = own.view(rows, kv, groups * width, -1).to(own_v.dtype) @ own_v  # [rows, kv, g * width, d]
        pre = pre.permute(1, 0, 2, 3, 4).reshape(kv, rows * groups * width, -1).to(pre_v.dtype) @ pre_v
        out = out.float() + pre.view(kv, rows, groups * width, dim).transpose(0, 1).float()
        out = (out / total.view(rows, kv, groups * width, 1)).to(q.dtype)
        return out.view(rows, kv, groups, width, dim).permute(0, 3, 1, 2, 4)  # [rows, width, kv, g, d]

    def _rotary(self, positions: Any) -> tuple[Any, Any]:
        """cos and sign-folded sin for `positions` [N], from a table made by the model's own rotary
        module (so scaled rope types and their attention factor come out exactly as in HF)."""
        import torch

        needed = int(positions.max()) + 1
        if self._cos is None or self._cos.shape[0] < needed:
            length = _round_up(max(needed, 2 * (0 if self._cos is None else self._cos.shape[0])), 256)
            ids = torch.arange(length, device=self.device).unsqueeze(0)
            probe = torch.empty((1, 1), dtype=self.dtype, device=self.device)
            cos, sin = self.rotary(probe, ids)
            half = self.head_dim // 2
            # rotate_half(x) * sin == roll(x, half) * (sign * sin), sign = [-1]*half + [1]*half:
            # the same products (a sign flip is exact), one op instead of three.
            sign = torch.ones(self.head_dim, dtype=sin.dtype, device=self.device)
            sign[:half] = -1
            self._cos, self._sin = cos[0], sin[0] * sign
        return self._cos[positions].unsqueeze(1), self._sin[positions].unsqueeze(1)


@dataclass
class SharedPrefix:
    """Keys/values of a prompt prefix that several rows share, stored once (slot 0 of `cache`)."""

    cache: KVCache
    length: int


@dataclass
class ForwardBatch:
    """One forward pass's tokens, packed: row after row, no padding (N tokens in all).

    A row's slot holds its positions from its `offset` on (positions before it, if any, are in
    the shared prefix): position p is at cache index p - offset."""

    tokens: Any  # [N] ids
    positions: Any  # [N] each token's position (for the rotary embedding)
    slots: Any  # [N] each token's cache slot
    cache_index: Any  # [N] where in its slot the token's key/value goes
    first_slot: int  # the rows are the slots [first_slot, first_slot + rows)
    rows: int
    width: int  # most tokens in one row: attention runs on [rows, width] queries
    key_length: int  # slot indices attended to (each query sees those <= its own)
    query_index: Any  # [rows, width] cache index of each padded query (a pad repeats its row's last)
    scatter: Any = None  # [N] index of each token in [rows * width]; None when width == 1
    last: Any = None  # [rows] index into N of each row's last token; None = every token; -1 = no logits
    prefix_rows: Any = None  # [rows] bool: rows that see the shared prefix; None = all of them

    @classmethod
    def decode(cls, tokens: Any, positions: Any, cache_index: Any, slots: Any, key_length: int,
               prefix_rows: Any = None) -> ForwardBatch:
        """One new token for each of the rows in slots [0, len(tokens))."""
        return cls(tokens, positions, slots, cache_index, 0, tokens.shape[0], 1, key_length, cache_index.unsqueeze(1),
                   prefix_rows=prefix_rows)

    @classmethod
    def prefill(cls, pieces: list[tuple[int, int, list[int]]], first_slot: int, device: Any, *,
                logits: bool = True) -> ForwardBatch:
        """Row i (slot first_slot + i) runs `pieces[i] = (start, offset, ids)`: ids at positions
        start, start + 1, ... of a row whose slot begins at position `offset`."""
        import torch

        width = max(len(ids) for _, _, ids in pieces)
        tokens: list[int] = []
        positions: list[int] = []
        cache_index: list[int] = []
        slots: list[int] = []
        scatter: list[int] = []
        query_index = []
        for row, (start, offset, ids) in enumerate(pieces):
            tokens.extend(ids)
            positions.extend(range(start, start + len(ids)))
            cache_index.extend(range(start - offset, start - offset + len(ids)))
            slots.extend([first_slot + row] * len(ids))
            scatter.extend(range(row * width, row * width + len(ids)))
            end = start - offset + len(ids) - 1
            query_index.append([*range(start - offset, end + 1), *[end] * (width - len(ids))])
        ends = [len(ids) for _, _, ids in pieces]
        last = torch.tensor(ends, device=device).cumsum(0) - 1 if logits else -1
        with_prefix = [offset > 0 for _, offset, _ in pieces]

        def tensor(values: list[Any]) -> Any:
            return torch.tensor(values, dtype=torch.long, device=device)

        return cls(tensor(tokens), tensor(positions), tensor(slots), tensor(cache_index), first_slot, len(pieces), width,
                   max(start - offset + len(ids) for start, offset, ids in pieces), tensor(query_index),
                   tensor(scatter) if width > 1 else None, last,
                   None if all(with_prefix) else torch.tensor(with_prefix, device=device))


def _with_prefix(own_k: Any, own_v: Any, mask: Any, prefix: SharedPrefix, layer: int, prefix_rows: Any) -> tuple[Any, Any, Any]:
    """Keys, values and mask with the shared prefix in front of each row's own (for SDPA)."""
    import torch

    rows = own_k.shape[0]
    pre_k = prefix.cache.data[layer, 0, 0, :, : prefix.length].expand(rows, -1, -1, -1)
    pre_v = prefix.cache.data[layer, 1, 0, :, : prefix.length].expand(rows, -1, -1, -1)
    seen = mask.new_ones((rows, 1, mask.shape[2], prefix.length))
    if prefix_rows is not None:
        seen = seen & prefix_rows.view(rows, 1, 1, 1)
    return torch.cat((pre_k, own_k), dim=2), torch.cat((pre_v, own_v), dim=2), torch.cat((seen, mask), dim=-1)


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


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _embed(module: Any, ids: Any) -> Any:
    import torch
    import torch.nn.functional as F

    if type(module) is torch.nn.Embedding and module.max_norm is None:
        return F.embedding(ids, module.weight, module.padding_idx)
    return module(ids)


def _linear(module: Any, x: Any) -> Any:
    """A projection: straight to `F.linear` for a plain `nn.Linear` (skips module-call overhead),
    else the module itself (peft LoRA layers, quantized linears)."""
    import torch
    import torch.nn.functional as F

    if type(module) is torch.nn.Linear:
        return F.linear(x, module.weight, module.bias)
    return module(x)


def _rms_norm(x: Any, norm: Any, eps: float) -> Any:
    """HF's Llama RMSNorm: normalize in float32, cast back, then scale by the weight."""
    import torch

    eps = getattr(norm, "variance_epsilon", eps)
    if x.dtype == torch.float32:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, eps)
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return norm.weight * y.to(x.dtype)


def _rotate(x: Any, cos: Any, signed_sin: Any) -> Any:
    """HF's `apply_rotary_pos_emb` for one tensor, x * cos + rotate_half(x) * sin (see `_rotary`)."""
    import torch

    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin
