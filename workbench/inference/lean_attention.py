"""Attention of the lean forward (`lean_model.LeanModel`) over its `KVCache`, and the masks it takes.

Split out of `lean_model` (the forward's layer loop stays there). Three paths:
- `rows`: a prefill (several queries per row) on SDPA, or with a shared prefix on the CPU,
  `rows_cascade`: the rows' own keys and the prefix's keys each on the CPU flash kernel, merged
  by their log-sum-exps (`merge_prefix`), so the prefix is never copied per row;
- `one`: a decode step (one query per row) as a handful of batched matmuls with additive masks,
  the shared prefix read once for all rows ("cascade" attention);
- `one_flash`: the same on the CPU flash kernel, used for 16-bit weights on a CPU
  (`flash_decode`): oneDNN's batched bfloat16 matmuls on the cache's transposed key views cost
  ~4x a plain one. Measured per SmolLM2 layer, 64 rows, 28 shared prefix keys: bfloat16 1 thread
  1,360 -> 833 us at 44 own keys (779 -> 666 at 12, 2,266 -> 1,075 at 100); 2 threads 981 -> 928
  at 44, 1,837 -> 1,201 at 100, 566 -> 661 at 12. float32 stays on the matmuls, 7-45% faster
  there than the kernel.
The flash kernel is reached as `torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`: the
only torch entry point that returns the log-sum-exp the prefix merge needs.
"""

from __future__ import annotations

from typing import Any

from workbench.inference.lean_cache import ForwardBatch, SharedPrefix, round_up


class Attention:
    """Attention for a model with `heads` query heads over `kv_heads` key/value heads of
    `head_dim`, in `dtype` on `device`."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int, dtype: Any, device: Any) -> None:
        import torch

        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.device = device
        # One query per row on the flash kernel (`one_flash`): 16-bit weights on a CPU.
        self.flash_decode = device.type == "cpu" and dtype not in (torch.float32, torch.float64)
        self._keys: Any = None  # arange over cache indices, for the attention masks
        self._zero = torch.zeros((), dtype=dtype, device=device)  # additive-mask values
        self._minus_inf = torch.full((), float("-inf"), dtype=dtype, device=device)

    def prefill_mask(self, batch: ForwardBatch) -> Any:
        """[rows, 1, width, keys] bool: query (row, i) sees the row's cache indices <= its own."""
        return (self.arange(batch.key_length) <= batch.query_index.unsqueeze(-1)).unsqueeze(1)

    def decode_bias(self, batch: ForwardBatch, with_prefix: bool) -> tuple[Any, Any]:
        """Additive masks (0 / -inf) for `one`: [rows * kv_heads, 1, keys] over the rows'
        own keys (cache indices up to each row's last query) and [1, rows * groups, 1] over the
        prefix keys (-inf for rows without the prefix; a broadcast zero when all have it)."""
        import torch

        zero, minus_inf = self._zero, self._minus_inf
        rows, kv = batch.rows, self.kv_heads
        own = self.own_keys_bias(batch).unsqueeze(1).expand(rows, kv, -1).reshape(rows * kv, 1, -1)
        pre = zero.view(1, 1, 1)
        if with_prefix and batch.prefix_rows is not None:
            groups = self.heads // kv
            pre = (
                torch.where(batch.prefix_rows, zero, minus_inf)
                .repeat_interleave(groups)
                .view(1, rows * groups, 1)
            )
        return own, pre

    def one(
        self, q: Any, own_kt: Any, own_v: Any, bias: tuple[Any, Any], prefix: SharedPrefix | None, layer: int
    ) -> Any:
        """Attention of one query per row (`q` [rows, heads, d]) over the row's own keys (`own_kt`
        [rows * kv_heads, d, keys], transposed, and `own_v` [rows * kv_heads, keys, d]: views of its
        cache slot) and, with `prefix`, the shared prefix's keys, read once for all rows ("cascade"
        attention): scores against both, one softmax over them together, two weighted sums.
        Returns [rows, heads * d]. A handful of ops per layer: at decode sizes their count, not
        their arithmetic, is the cost (so with one query head per key head, the common case, the
        layout changes below are single views)."""
        import torch

        rows, kv, dim = q.shape[0], self.kv_heads, self.head_dim
        groups, keys = self.heads // kv, own_v.shape[1]
        own_bias, prefix_bias = bias
        # Query head h = kv * groups + g uses key head kv (HF's repeat_kv order).
        scores = torch.baddbmm(
            own_bias, q.reshape(rows * kv, groups, dim), own_kt, alpha=self.scale
        )  # [rows * kv, groups, keys]
        if prefix is None:
            return torch.bmm(_softmax(scores, own_v.dtype), own_v).view(rows, self.heads * dim)
        length = prefix.length
        pre_kt, pre_v = prefix.layer(layer)
        by_kv = (
            q.transpose(0, 1)
            if groups == 1
            else q.view(rows, kv, groups, dim).transpose(0, 1).reshape(kv, rows * groups, dim)
        )
        pre = torch.baddbmm(prefix_bias, by_kv, pre_kt, alpha=self.scale)  # [kv, rows * groups, prefix]
        both = torch.cat(
            (pre.view(kv, rows, groups, length).transpose(0, 1), scores.view(rows, kv, groups, keys)), dim=-1
        )
        probs = _softmax(both, own_v.dtype)  # [rows, kv, groups, prefix + keys]
        out = torch.bmm(probs[..., length:].view(rows * kv, groups, keys), own_v).view(rows, kv, groups, dim)
        pre_probs = probs[..., :length].transpose(0, 1)  # [kv, rows, groups, prefix]
        pre_probs = pre_probs.squeeze(2) if groups == 1 else pre_probs.reshape(kv, rows * groups, length)
        pre_out = torch.bmm(pre_probs, pre_v).view(kv, rows, groups, dim)
        return (out + pre_out.transpose(0, 1)).view(rows, self.heads * dim)

    def own_keys_bias(self, batch: ForwardBatch) -> Any:
        """[rows, keys] additive mask (0 / -inf) of one query per row over its own keys: the cache
        indices up to the row's last query."""
        import torch

        seen = self.arange(batch.key_length) <= batch.query_index[:, -1:]
        return torch.where(seen, self._zero, self._minus_inf)

    def flash_bias(self, batch: ForwardBatch) -> Any:
        """`own_keys_bias` as the flash kernel takes it: [rows, 1, 1, keys]."""
        return self.own_keys_bias(batch).view(batch.rows, 1, 1, -1)

    def one_flash(
        self,
        q: Any,
        own_k: Any,
        own_v: Any,
        bias: Any,
        batch: ForwardBatch,
        prefix: SharedPrefix | None,
        layer: int,
    ) -> Any:
        """`one` on the CPU flash kernel (`own_k`, `own_v` [rows, kv_heads, keys, d] views
        of the rows' slots): one query per row over its own keys and, with `prefix`, all rows'
        queries as one batch over the prefix keys, merged by their log-sum-exps as in
        `rows_cascade`. Returns [rows, heads * d]."""
        import torch

        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        rows, heads, dim = q.shape
        own, own_lse = flash(q.unsqueeze(2), own_k, own_v, attn_mask=bias, scale=self.scale)
        own = own.view(rows, heads, dim)
        if prefix is None:
            return own.view(rows, heads * dim)
        return self.merge_prefix(q, own, own_lse.view(rows, heads), batch.prefix_rows, prefix, layer)

    def rows(
        self,
        q: Any,
        own_k: Any,
        own_v: Any,
        mask: Any,
        batch: ForwardBatch,
        prefix: SharedPrefix | None,
        layer: int,
    ) -> Any:
        """Prefill attention (several queries per row) with SDPA: packed `q` [N, heads, d] goes to
        [rows, width] and back. Returns [N, heads * d]."""
        import torch.nn.functional as F

        rows, width = batch.rows, batch.width
        if prefix is not None and self.device.type == "cpu":
            return self.rows_cascade(q, own_k, own_v, mask, batch, prefix, layer)
        q = q.new_zeros((rows * width, self.heads, self.head_dim)).index_copy_(0, batch.scatter, q)
        q = q.view(rows, width, self.heads, self.head_dim)
        keys_k, keys_v, keys_mask = own_k, own_v, mask
        if prefix is not None:  # a one-off per-row copy of the prefix keys is cheaper here
            keys_k, keys_v, keys_mask = _with_prefix(own_k, own_v, mask, prefix, layer, batch.prefix_rows)
        attention = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            keys_k,
            keys_v,
            attn_mask=keys_mask,
            scale=self.scale,
            enable_gqa=self.kv_heads != self.heads,
        ).transpose(1, 2)
        return attention.reshape(rows * width, self.heads * self.head_dim)[batch.scatter]

    def rows_cascade(
        self, q: Any, own_k: Any, own_v: Any, mask: Any, batch: ForwardBatch, prefix: SharedPrefix, layer: int
    ) -> Any:
        """`rows` with a shared prefix on the CPU, without a per-row copy of the prefix keys:
        attention over the rows' own keys (padded queries) and over the prefix keys (all packed
        queries as one batch) separately, each with its log-sum-exp from the CPU flash kernel, then
        merged (`merge_prefix`)."""
        import torch

        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        rows, width, heads, dim = batch.rows, batch.width, self.heads, self.head_dim
        padded = (
            q.new_zeros((rows * width, heads, dim))
            .index_copy_(0, batch.scatter, q)
            .view(rows, width, heads, dim)
        )
        bias = torch.where(mask, self._zero, self._minus_inf)  # the kernel takes additive masks only
        own, own_lse = flash(padded.transpose(1, 2), own_k, own_v, attn_mask=bias, scale=self.scale)
        own = own.transpose(1, 2).reshape(rows * width, heads, dim)[batch.scatter]  # [N, heads, d]
        own_lse = own_lse.transpose(1, 2).reshape(rows * width, heads)[batch.scatter]  # [N, heads]
        has_prefix = None if batch.prefix_rows is None else batch.prefix_rows[batch.slots - batch.first_slot]
        return self.merge_prefix(q, own, own_lse, has_prefix, prefix, layer)

    def merge_prefix(
        self, q: Any, own: Any, own_lse: Any, has_prefix: Any, prefix: SharedPrefix, layer: int
    ) -> Any:
        """Attention of `q` [N, heads, d] over the shared prefix's keys (all queries as one batch,
        on the CPU flash kernel) merged with `own` [N, heads, d], the attention over each query's
        own keys, by their shares of the softmax mass: own * s + prefix * (1 - s),
        s = sigmoid(lse_own - lse_prefix). `has_prefix` [N] bool: queries that see the prefix
        (None: all). Returns [N, heads * d]."""
        import torch

        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        length = prefix.length
        pre_k, pre_v = (
            prefix.cache.data[layer, 0, :1, :, :length],
            prefix.cache.data[layer, 1, :1, :, :length],
        )
        pre, pre_lse = flash(q.transpose(0, 1).unsqueeze(0), pre_k, pre_v, scale=self.scale)
        pre, pre_lse = pre[0].transpose(0, 1), pre_lse[0].transpose(0, 1)  # [N, heads, d], [N, heads]
        if has_prefix is not None:  # queries without the prefix: its keys do not exist for them
            pre_lse = pre_lse.masked_fill(~has_prefix.unsqueeze(1), float("-inf"))
        share = torch.sigmoid(own_lse - pre_lse).unsqueeze(-1).to(pre.dtype)
        return torch.lerp(pre, own, share).reshape(-1, q.shape[1] * q.shape[2])

    def arange(self, length: int) -> Any:
        import torch

        if self._keys is None or self._keys.shape[0] < length:
            self._keys = torch.arange(round_up(length, 256), device=self.device)
        return self._keys[:length]


def _with_prefix(
    own_k: Any, own_v: Any, mask: Any, prefix: SharedPrefix, layer: int, prefix_rows: Any
) -> tuple[Any, Any, Any]:
    """Keys, values and mask with the shared prefix in front of each row's own (for SDPA)."""
    import torch

    rows = own_k.shape[0]
    pre_k = prefix.cache.data[layer, 0, 0, :, : prefix.length].expand(rows, -1, -1, -1)
    pre_v = prefix.cache.data[layer, 1, 0, :, : prefix.length].expand(rows, -1, -1, -1)
    seen = mask.new_ones((rows, 1, mask.shape[2], prefix.length))
    if prefix_rows is not None:
        seen = seen & prefix_rows.view(rows, 1, 1, 1)
    return torch.cat((pre_k, own_k), dim=2), torch.cat((pre_v, own_v), dim=2), torch.cat((seen, mask), dim=-1)


def _softmax(scores: Any, dtype: Any) -> Any:
    """Softmax over the last dim in float32 whatever the model's dtype (as SDPA), cast to `dtype`."""
    import torch

    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    return probs if probs.dtype == dtype else probs.to(dtype)
