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

Current weights, always: `LeanModel` keeps references to the model's *modules* and reads
`weight` at each call, so in-place updates (an optimizer step, `load_weights_in_place`) are seen
at once. The one copy: for a small model, q/k/v and gate/up (plain `nn.Linear`s) run as one
matmul each over their stacked weights (`_Fused`), re-stacked whenever a source's version
counter moves. A projection that is not a plain `nn.Linear` (a peft LoRA layer, runtime or
trained) is called as a module, so adapters and their enable/disable switches apply exactly as
in the Hugging Face forward. Build one per decode session: a module swapped for another object
(peft injecting layers) is picked up by the next.

Decode steps (one query per row) cost, for a small model, about one dispatch per op, so the
step is written for few ops: fused projections, one rotary pass for q and k, cache writes by
`index_put_`, residual adds fused into `addmm`, and attention as a handful of batched matmuls
with additive masks (`_attend_one`). A prefill's last layer runs only at each row's last token.

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
    qkv: _Fused | None = None  # q, k and v as one matmul, when `_Fused` applies
    gate_up: _Fused | None = None


class _Fused:
    """Several plain `nn.Linear` projections of one input (q/k/v; gate/up) as one matmul over a
    copy of their weights stacked along the output dimension: one op instead of three (two), and
    q and k come out side by side, so one rotary pass covers both.

    The copy is remade whenever a source changes: `stale` compares each module's current `weight`
    and `bias` objects and their version counters (bumped by every in-place update: an optimizer
    step, `load_weights_in_place`'s `copy_`) with those it was made from, once per forward. Writes
    through `.data` (and to inference tensors) move no version counter: made between decode
    sessions they are still seen, since a `LeanModel` is built per session (under the caller's
    weights lock) and copies afresh."""

    def __init__(self, modules: list[Any]) -> None:
        self.modules = modules
        self.sources: list[tuple[dict[str, Any], str, Any, int]] = []  # (module._parameters, name, tensor, version)
        self.weight: Any = None
        self.bias: Any = None
        self.refresh()

    @staticmethod
    def applies(modules: list[Any]) -> bool:
        import torch

        if not all(type(m) is torch.nn.Linear for m in modules):
            return False
        weights = [m.weight for m in modules]
        return (len({(w.shape[1], w.dtype, w.device) for w in weights}) == 1
                and len({m.bias is None for m in modules}) == 1)

    def stale(self) -> bool:
        # `_parameters` directly: nn.Module.__getattr__ would cost more than the check itself.
        return any(params.get(name) is not tensor or _version(tensor) != version
                   for params, name, tensor, version in self.sources)

    def refresh(self) -> None:
        import torch

        with torch.no_grad():
            self.weight = torch.cat([m.weight for m in self.modules])
            self.bias = None if self.modules[0].bias is None else torch.cat([m.bias for m in self.modules])
        self.sources = [(m._parameters, name, m._parameters.get(name), _version(m._parameters.get(name)))
                        for m in self.modules for name in ("weight", "bias")]

    def __call__(self, x: Any) -> Any:
        import torch.nn.functional as F

        return F.linear(x, self.weight, self.bias)


class LeanModel:
    """The forward pass of a supported Hugging Face causal LM on a `KVCache`."""

    # Fused copies (`_Fused`) cost memory: made only while all of them together stay under this
    # size, i.e. for small models, whose steps are dominated by per-op overhead (a large model's
    # matmuls are arithmetic-bound and gain nothing from fusion).
    FUSE_MAX_BYTES = 64 << 20

    def __init__(self, lm: Any, config: Any) -> None:
        import torch

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
        self._rope: Any = None  # [positions, 2, 1, head_dim] rotary cos and signed sin, extended on demand
        self._keys: Any = None  # arange over cache indices, for the attention masks
        self._zero = torch.zeros((), dtype=self.dtype, device=self.device)  # additive-mask values
        self._minus_inf = torch.full((), float("-inf"), dtype=self.dtype, device=self.device)
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

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, dtype=self.dtype, device=self.device)

    def _fuse(self) -> None:
        groups = [(layer, name, modules) for layer in self.layers
                  for name, modules in (("qkv", [layer.q, layer.k, layer.v]), ("gate_up", [layer.gate, layer.up]))]
        groups = [group for group in groups if _Fused.applies(group[2])]
        size = sum(m.weight.numel() * m.weight.element_size() for _, _, modules in groups for m in modules)
        if size <= self.FUSE_MAX_BYTES:
            for layer, name, modules in groups:
                setattr(layer, name, _Fused(modules))

    def _refresh_fused(self) -> None:
        """Re-copy fused weights whose sources changed (cheap to check: once per forward)."""
        for layer in self.layers:
            for name in ("qkv", "gate_up"):
                fused = getattr(layer, name)
                if fused is not None and fused.stale():
                    if _Fused.applies(fused.modules):
                        fused.refresh()
                    else:  # a bias appeared on one of them, or a dtype changed: unfused from now on
                        setattr(layer, name, None)

    def forward(self, cache: KVCache, batch: ForwardBatch, prefix: SharedPrefix | None = None) -> Any:
        """Run `batch`, writing its keys/values into `cache`; returns float32 logits [rows, vocab]
        at each row's last token (every token for a decode batch), or None for `batch.last` = -1.
        With `prefix`, rows flagged in `batch.prefix_rows` (all when None) also attend to the
        shared prefix's keys, which precede the keys in their own slots."""
        self._refresh_fused()
        rows, width = batch.rows, batch.width
        rope = self._rotary(batch.positions)
        cos, sin = rope[:, 0], rope[:, 1]  # [N, 1, head_dim]: broadcast over heads
        live = slice(batch.first_slot, batch.first_slot + rows)
        mask = self._prefill_mask(batch) if width > 1 else None
        bias = None  # (own keys, prefix) additive masks of the one-query attention, made when first needed
        x = _embed(self.embed, batch.tokens)  # [N, hidden]: packed, no padding
        last_layer = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.input_norm, self.eps)
            q, k, v = self._qkv(layer, h, cos, sin)
            k_cache, v_cache = cache.data[index, 0], cache.data[index, 1]
            # One index_put_ per tensor on a [slots, length, kv_heads, head_dim] view: token i's
            # keys go to (slots[i], cache_index[i]), no flat index to build, no copy of k or v.
            k_cache.transpose(1, 2).index_put_((batch.slots, batch.cache_index), k)
            v_cache.transpose(1, 2).index_put_((batch.slots, batch.cache_index), v)
            own_k, own_v = k_cache[live, :, : batch.key_length], v_cache[live, :, : batch.key_length]
            if index == last_layer and batch.last is not None:
                # The cache has every token's keys now; what follows only feeds the logits, which
                # are wanted at each row's last token (or not at all): run it for those alone.
                if isinstance(batch.last, int):
                    return None
                if width > 1:
                    x, q, width = x[batch.last], q[batch.last], 1
            if width == 1:
                if bias is None:
                    bias = self._decode_bias(batch, prefix is not None)
                attention = self._attend_one(q, own_k, own_v, bias, prefix, index)
            else:
                attention = self._attend_rows(q, own_k, own_v, mask, batch, prefix, index)
            x = _linear_add(layer.o, attention, x)
            h = _rms_norm(x, layer.post_norm, self.eps)
            x = _linear_add(layer.down, self._gate_up(layer, h), x)
        return _linear(self.lm_head, _rms_norm(x, self.norm, self.eps)).float()

    def _qkv(self, layer: _Layer, h: Any, cos: Any, sin: Any) -> tuple[Any, Any, Any]:
        """Rotated queries [N, heads, d] and keys [N, kv_heads, d], and values [N, kv_heads, d]
        (views into one fused output when q/k/v are fused)."""
        count, dim, heads, kv = h.shape[0], self.head_dim, self.heads, self.kv_heads
        if layer.qkv is not None:
            qkv = layer.qkv(h).view(count, heads + 2 * kv, dim)
            if layer.q_norm is None:
                qk = _rotate(qkv[:, : heads + kv], cos, sin)  # q and k side by side: one rotary pass
                return qk[:, :heads], qk[:, heads:], qkv[:, heads + kv :]
            q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv], qkv[:, heads + kv :]
        else:
            q = _linear(layer.q, h).view(count, heads, dim)
            k = _linear(layer.k, h).view(count, kv, dim)
            v = _linear(layer.v, h).view(count, kv, dim)
        if layer.q_norm is not None:
            q, k = _rms_norm(q, layer.q_norm, self.eps), _rms_norm(k, layer.k_norm, self.eps)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def _gate_up(self, layer: _Layer, h: Any) -> Any:
        """The MLP's silu(gate(h)) * up(h)."""
        import torch.nn.functional as F

        if layer.gate_up is not None:
            both = layer.gate_up(h)
            half = both.shape[-1] // 2
            return F.silu(both[:, :half]) * both[:, half:]
        return F.silu(_linear(layer.gate, h)) * _linear(layer.up, h)

    def _prefill_mask(self, batch: ForwardBatch) -> Any:
        """[rows, 1, width, keys] bool: query (row, i) sees the row's cache indices <= its own."""
        return (self._arange(batch.key_length) <= batch.query_index.unsqueeze(-1)).unsqueeze(1)

    def _decode_bias(self, batch: ForwardBatch, with_prefix: bool) -> tuple[Any, Any]:
        """Additive masks (0 / -inf) for `_attend_one`: [rows * kv_heads, 1, keys] over the rows'
        own keys (cache indices up to each row's last query) and [1, rows * groups, 1] over the
        prefix keys (-inf for rows without the prefix; a broadcast zero when all have it)."""
        import torch

        zero, minus_inf = self._zero, self._minus_inf
        rows, kv = batch.rows, self.kv_heads
        seen = self._arange(batch.key_length) <= batch.query_index[:, -1:]  # [rows, keys]
        own = torch.where(seen, zero, minus_inf).unsqueeze(1).expand(rows, kv, -1).reshape(rows * kv, 1, -1)
        pre = zero.view(1, 1, 1)
        if with_prefix and batch.prefix_rows is not None:
            groups = self.heads // kv
            pre = torch.where(batch.prefix_rows, zero, minus_inf).repeat_interleave(groups).view(1, rows * groups, 1)
        return own, pre

    def _attend_one(self, q: Any, own_k: Any, own_v: Any, bias: tuple[Any, Any], prefix: SharedPrefix | None,
                    layer: int) -> Any:
        """Attention of one query per row (`q` [rows, heads, d]) over the row's own keys (`own_k`,
        `own_v` [rows, kv_heads, keys, d]: views of its cache slot) and, with `prefix`, the shared
        prefix's keys, read once for all rows ("cascade" attention): scores against both, one
        softmax over them together, two weighted sums. Returns [rows, heads * d].
        A handful of ops per layer: at decode sizes their count, not their arithmetic, is the cost."""
        import torch

        rows, kv, dim = q.shape[0], self.kv_heads, self.head_dim
        groups, keys = self.heads // kv, own_k.shape[2]
        own_bias, prefix_bias = bias
        # Query head h = kv * groups + g uses key head kv (HF's repeat_kv order).
        queries = q.reshape(rows * kv, groups, dim)
        own_k, own_v = own_k.reshape(rows * kv, keys, dim), own_v.reshape(rows * kv, keys, dim)
        scores = torch.baddbmm(own_bias, queries, own_k.transpose(1, 2), alpha=self.scale)  # [rows * kv, groups, keys]
        if prefix is None:
            return torch.bmm(_softmax(scores, own_v.dtype), own_v).view(rows, self.heads * dim)
        length = prefix.length
        pre_k, pre_v = prefix.cache.data[layer, 0, 0, :, :length], prefix.cache.data[layer, 1, 0, :, :length]
        stacked = q.view(rows, kv, groups, dim).transpose(0, 1).reshape(kv, rows * groups, dim)
        pre = torch.baddbmm(prefix_bias, stacked, pre_k.transpose(1, 2), alpha=self.scale)  # [kv, rows * groups, prefix]
        both = torch.cat((pre.view(kv, rows, groups, length).transpose(0, 1), scores.view(rows, kv, groups, keys)), dim=-1)
        probs = _softmax(both, own_v.dtype)  # [rows, kv, groups, prefix + keys]
        out = torch.bmm(probs[..., length:].reshape(rows * kv, groups, keys), own_v)
        pre_out = torch.bmm(probs[..., :length].transpose(0, 1).reshape(kv, rows * groups, length), pre_v)
        out = out.view(rows, kv, groups, dim) + pre_out.view(kv, rows, groups, dim).transpose(0, 1)
        return out.view(rows, self.heads * dim)

    def _attend_rows(self, q: Any, own_k: Any, own_v: Any, mask: Any, batch: ForwardBatch, prefix: SharedPrefix | None,
                     layer: int) -> Any:
        """Prefill attention (several queries per row) with SDPA: packed `q` [N, heads, d] goes to
        [rows, width] and back. Returns [N, heads * d]."""
        import torch.nn.functional as F

        rows, width = batch.rows, batch.width
        if prefix is not None and self.device.type == "cpu":
            return self._attend_rows_cascade(q, own_k, own_v, mask, batch, prefix, layer)
        q = q.new_zeros((rows * width, self.heads, self.head_dim)).index_copy_(0, batch.scatter, q)
        q = q.view(rows, width, self.heads, self.head_dim)
        keys_k, keys_v, keys_mask = own_k, own_v, mask
        if prefix is not None:  # a one-off per-row copy of the prefix keys is cheaper here
            keys_k, keys_v, keys_mask = _with_prefix(own_k, own_v, mask, prefix, layer, batch.prefix_rows)
        attention = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys_k, keys_v, attn_mask=keys_mask, scale=self.scale,
            enable_gqa=self.kv_heads != self.heads,
        ).transpose(1, 2)
        return attention.reshape(rows * width, self.heads * self.head_dim)[batch.scatter]

    def _attend_rows_cascade(self, q: Any, own_k: Any, own_v: Any, mask: Any, batch: ForwardBatch, prefix: SharedPrefix,
                             layer: int) -> Any:
        """`_attend_rows` with a shared prefix on the CPU, without a per-row copy of the prefix keys:
        attention over the rows' own keys (padded queries) and over the prefix keys (all packed
        queries as one batch) separately, each with its log-sum-exp from the CPU flash kernel, then
        merged by their shares of the softmax mass: own * s + prefix * (1 - s), s = sigmoid(lse_own - lse_prefix)."""
        import torch

        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        rows, width, heads, dim = batch.rows, batch.width, self.heads, self.head_dim
        padded = q.new_zeros((rows * width, heads, dim)).index_copy_(0, batch.scatter, q).view(rows, width, heads, dim)
        bias = torch.where(mask, self._zero, self._minus_inf)  # the kernel takes additive masks only
        own, own_lse = flash(padded.transpose(1, 2), own_k, own_v, attn_mask=bias, scale=self.scale)
        own = own.transpose(1, 2).reshape(rows * width, heads, dim)[batch.scatter]  # [N, heads, d]
        own_lse = own_lse.transpose(1, 2).reshape(rows * width, heads)[batch.scatter]  # [N, heads]
        length = prefix.length
        pre_k, pre_v = prefix.cache.data[layer, 0, :1, :, :length], prefix.cache.data[layer, 1, :1, :, :length]
        pre, pre_lse = flash(q.transpose(0, 1).unsqueeze(0), pre_k, pre_v, scale=self.scale)
        pre, pre_lse = pre[0].transpose(0, 1), pre_lse[0].transpose(0, 1)  # [N, heads, d], [N, heads]
        if batch.prefix_rows is not None:  # rows without the prefix: its keys do not exist for them
            has_prefix = batch.prefix_rows[batch.slots - batch.first_slot]
            pre_lse = pre_lse.masked_fill(~has_prefix.unsqueeze(1), float("-inf"))
        share = torch.sigmoid(own_lse - pre_lse).unsqueeze(-1).to(pre.dtype)
        return torch.lerp(pre, own, share).reshape(-1, heads * dim)

    def _arange(self, length: int) -> Any:
        import torch

        if self._keys is None or self._keys.shape[0] < length:
            self._keys = torch.arange(_round_up(length, 256), device=self.device)
        return self._keys[:length]

    def _rotary(self, positions: Any) -> Any:
        """[N, 2, 1, head_dim]: cos and sign-folded sin for `positions` [N], from a table made by
        the model's own rotary module (so scaled rope types and their attention factor come out
        exactly as in HF); one gather for both."""
        import torch

        needed = int(positions.max()) + 1
        if self._rope is None or self._rope.shape[0] < needed:
            length = _round_up(max(needed, 2 * (0 if self._rope is None else self._rope.shape[0])), 256)
            ids = torch.arange(length, device=self.device).unsqueeze(0)
            probe = torch.empty((1, 1), dtype=self.dtype, device=self.device)
            cos, sin = self.rotary(probe, ids)
            half = self.head_dim // 2
            # rotate_half(x) * sin == roll(x, half) * (sign * sin), sign = [-1]*half + [1]*half:
            # the same products (a sign flip is exact), one op instead of three.
            sign = torch.ones(self.head_dim, dtype=sin.dtype, device=self.device)
            sign[:half] = -1
            self._rope = torch.stack((cos[0], sin[0] * sign), dim=1).unsqueeze(2)
        return self._rope[positions]

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


def _version(tensor: Any) -> int:
    """A tensor's version counter (-1 for None, and for inference tensors, which have none)."""
    return -1 if tensor is None or tensor.is_inference() else tensor._version


def _linear_add(module: Any, x: Any, residual: Any) -> Any:
    """residual + module(x): one `addmm` for a plain bias-free `nn.Linear` (the residual add fused
    into the matmul), else the two ops."""
    import torch

    if type(module) is torch.nn.Linear and module.bias is None and x.dim() == 2:
        return torch.addmm(residual, x, module.weight.t())
    return residual + _linear(module, x)


def _softmax(scores: Any, dtype: Any) -> Any:
    """Softmax over the last dim in float32 whatever the model's dtype (as SDPA), cast to `dtype`."""
    import torch

    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    return probs if probs.dtype == dtype else probs.to(dtype)


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
