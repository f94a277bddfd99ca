"""The data `lean_model.LeanModel.forward` works on: the KV cache, a shared prompt prefix, and
one forward pass's packed tokens.

Cache layout: one tensor [layers, 2 (k, v), slots, kv_heads, length, head_dim]; a row lives in
one slot, its token at position p at index p - offset (no padding inside a slot), where offset
is the length of a `SharedPrefix` the row uses (0 if none). Keys are stored in the lean model's
"pairs" head-dim order (see `lean_model`), which only that model reads.

Writes: a forward pass stores its tokens' keys and values with one `index_put_` per layer, on
the layer's cache viewed as rows of head_dim, at flat row indices made once per pass
(`KVCache.write_index`): two scattered writes per layer cost more, at decode sizes, than the
index arithmetic done once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


class KVCache:
    """Preallocated keys and values; grows (by copying, rarely) when asked for more."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, *, dtype: Any, device: Any) -> None:
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.data: Any = None
        self.slots = 0
        self.length = 0
        self._offsets: Any = None  # [2 * kv_heads]: flat row of (k or v, head h) at slot 0, index 0

    def reserve(self, slots: int, length: int, *, keep_slots: int, keep_length: int) -> None:
        """Make room for `slots` x `length`, keeping slots [0, keep_slots) up to `keep_length`.
        Sizes round up (length to 64, at least doubling) so growth happens O(log) times."""
        import torch

        if slots <= self.slots and length <= self.length:
            return
        new_slots = max(slots, self.slots)
        new_length = max(round_up(length, 64), self.length * 2 if length > self.length else self.length)
        # Zeros, not empty: masked-out keys still enter q.k, and NaN garbage would survive the mask.
        data = torch.zeros(
            (self.layers, 2, new_slots, self.kv_heads, new_length, self.head_dim),
            dtype=self.dtype,
            device=self.device,
        )
        if self.data is not None and keep_slots and keep_length:
            data[:, :, :keep_slots, :, :keep_length] = self.data[:, :, :keep_slots, :, :keep_length]
        self.data, self.slots, self.length = data, new_slots, new_length
        kind = torch.arange(2, device=self.device).repeat_interleave(self.kv_heads)  # 0 = key, 1 = value
        head = torch.arange(self.kv_heads, device=self.device).repeat(2)
        self._offsets = (kind * new_slots * self.kv_heads + head) * new_length

    def write_index(self, slots: Any, cache_index: Any) -> Any:
        """[N, 2 * kv_heads] rows of a layer's cache viewed as [2 * slots * kv_heads * length,
        head_dim] where token i's key heads, then its value heads, go: slot `slots[i]`, index
        `cache_index[i]` (the same for every layer)."""
        return (slots * (self.kv_heads * self.length) + cache_index).unsqueeze(1) + self._offsets

    def fits(self, model: Any) -> bool:
        """Whether this cache has `model`'s shape, dtype and device (so it can be reused)."""
        return (self.layers, self.kv_heads, self.head_dim, self.dtype, self.device) == (
            len(model.layers),
            model.kv_heads,
            model.head_dim,
            model.dtype,
            model.device,
        )

    def copy_slots(self, moves: Sequence[tuple[int, int, int]]) -> None:
        """For each (dst, src, length), slot dst takes the first `length` positions of slot src;
        no dst may be another move's src. One strided `copy_` per move: a few times faster than
        one advanced-indexing copy of them all (which gathers into a temporary first)."""
        for dst, src, length in moves:
            if length > 0:
                self.data[:, :, dst, :, :length].copy_(self.data[:, :, src, :, :length])


@dataclass
class SharedPrefix:
    """Keys/values of a prompt prefix that several rows share, stored once (slot 0 of `cache`)."""

    cache: KVCache
    length: int
    _views: list[tuple[Any, Any]] = field(default_factory=list, repr=False)

    def layer(self, index: int) -> tuple[Any, Any]:
        """Layer `index`'s prefix keys, transposed [kv_heads, head_dim, length], and values
        [kv_heads, length, head_dim]: views made once, not per decode step."""
        if not self._views:
            data, length = self.cache.data, self.length
            self._views = [
                (data[i, 0, 0, :, :length].transpose(1, 2), data[i, 1, 0, :, :length])
                for i in range(self.cache.layers)
            ]
        return self._views[index]


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
    max_position: int | None = None  # max(positions) when the caller knows it (saves a device sync)

    @classmethod
    def decode(
        cls,
        tokens: Any,
        positions: Any,
        cache_index: Any,
        slots: Any,
        key_length: int,
        prefix_rows: Any = None,
        max_position: int | None = None,
    ) -> ForwardBatch:
        """One new token for each of the rows in slots [0, len(tokens))."""
        return cls(
            tokens,
            positions,
            slots,
            cache_index,
            0,
            tokens.shape[0],
            1,
            key_length,
            cache_index.unsqueeze(1),
            prefix_rows=prefix_rows,
            max_position=max_position,
        )

    @classmethod
    def prefill(
        cls, pieces: list[tuple[int, int, list[int]]], first_slot: int, device: Any, *, logits: bool = True
    ) -> ForwardBatch:
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

        return cls(
            tensor(tokens),
            tensor(positions),
            tensor(slots),
            tensor(cache_index),
            first_slot,
            len(pieces),
            width,
            max(start - offset + len(ids) for start, offset, ids in pieces),
            tensor(query_index),
            tensor(scatter) if width > 1 else None,
            last,
            None if all(with_prefix) else torch.tensor(with_prefix, device=device),
            max(positions),
        )


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
