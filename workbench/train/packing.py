"""Packed micro-batches: samples laid end to end in rows instead of one right-padded row each.

A padded micro-batch is [micro_batch_size, longest sample]: every shorter sample drags padding
through the forward and backward passes. Packing (as prime-rl does) concatenates samples into
rows of up to `width` tokens (best-fit decreasing), so only each row's tail is padding. Within a
row every sample is its own sequence:
- position ids restart at 0 per sample (the same RoPE positions as its padded row);
- attention is block-diagonal causal: a 4D additive mask for eager / SDPA attention, or, for
  attention that understands packed position ids (flash-attention varlen, flex), none at all;
- the logprob of a sample's first token would come from the previous sample's last logits: it is
  set to 0 as in the padded path (`workbench.train.loss.token_logprobs`), never a loss token anyway;
- per-sample values (the advantage) are broadcast to the sample's tokens.
Losses are sums over loss tokens divided by the global batch's loss-token count, so the layout
changes nothing but floating-point summation order (tests/test_train_packing.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from workbench.train.samples import Sample

Row = list[Sample]


def pack_rows(samples: Sequence[Sample], width: int) -> list[Row]:
    """Best-fit decreasing: each sample, longest first, goes into the row whose free space fits
    it most tightly (a bisect over the rows' free space: O(n log n), fine for large batches).
    A sample longer than `width` gets a row of its own."""
    rows: list[Row] = []
    spaces: list[tuple[int, int]] = []  # (free tokens, row index), ascending
    for sample in sorted(samples, key=lambda s: len(s.input_ids), reverse=True):
        size = len(sample.input_ids)
        at = bisect.bisect_left(spaces, (size, -1))
        if at < len(spaces):
            space, index = spaces.pop(at)
            rows[index].append(sample)
        else:
            space, index = width, len(rows)
            rows.append([sample])
        bisect.insort(spaces, (space - size, index))
    return rows


def packed_micro_batches(samples: Sequence[Sample], micro_batch_size: int, width: int | None = None) -> list[list[Row]]:
    """Rows of up to `width` tokens (default: the longest sample's length), grouped into
    micro-batches of at most micro_batch_size x the longest sample's tokens: never a larger
    tensor than the padded path's largest micro-batch (so no more memory), and never more
    micro-batches. Rows are sorted by length and cut into contiguous, equally many-rowed runs, so
    each micro-batch's rows are alike in length and its tail padding small."""
    if not samples:
        return []
    longest = max(len(s.input_ids) for s in samples)
    width = max(width or longest, longest)
    rows = sorted(pack_rows(samples, width), key=row_length, reverse=True)
    per_chunk = max(1, micro_batch_size * longest // width)
    count = -(-len(rows) // per_chunk)
    size = -(-len(rows) // count)
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def row_length(row: Row) -> int:
    return sum(len(s.input_ids) for s in row)


def pack_width(samples: Sequence[Sample], micro_batch_size: int, seq_len: int | None, *, masked: bool) -> int:
    """Row width. With a 4D mask (eager / SDPA) attention computes every row's full width x width
    scores, masked or not, so a row packed wider than the longest sample costs more attention
    than it saves padding (reverse-text on the tiny model, fwd/bwd CPU time vs padded: 0.85-0.89
    at 1x, 0.91 at 2x, about 1.0 at 4x): rows are the longest sample wide, shorter samples
    sharing one where they fit. Varlen attention (flash-attention) costs each sample only its own
    length squared, so there rows are as wide as the token budget, as in prime-rl: `seq_len` when
    set, else one row per micro-batch."""
    longest = max((len(s.input_ids) for s in samples), default=1)
    if masked:
        return longest
    return max(seq_len or micro_batch_size * longest, longest)


def collate_packed(rows: Sequence[Row], pad_id: int, *, with_mask: bool = True) -> dict[str, Any]:
    """Tensors for one packed micro-batch: [rows, longest row]. `with_mask`: add the 4D
    block-diagonal causal mask (bool: True = may attend) for eager / SDPA attention; the caller
    turns it into the model's additive float mask."""
    import torch

    length = max(row_length(row) for row in rows)
    columns: dict[str, list[list[Any]]] = {key: [] for key in (
        "input_ids", "position_ids", "loss_mask", "sampler_logprobs", "advantages", "token_advantages", "segments")}
    for row in rows:
        values = _row_values(row, pad_id, length)
        for key, column in columns.items():
            column.append(values[key])
    segments = torch.tensor(columns.pop("segments"))
    floats = ("loss_mask", "sampler_logprobs", "advantages", "token_advantages")
    batch: dict[str, Any] = {key: torch.tensor(values, dtype=torch.float32 if key in floats else torch.long)
                             for key, values in columns.items()}
    if with_mask:
        batch["attention_mask"] = block_causal_mask(segments)
    return batch


def _row_values(row: Row, pad_id: int, length: int) -> dict[str, list[Any]]:
    """One row's concatenated per-token values, padded to `length`. The tail padding is one more
    segment with positions 0.. of its own: it attends only to itself (no fully masked query rows,
    which give NaN in some kernels) and nothing real attends to it."""
    values: dict[str, list[Any]] = {"input_ids": [], "position_ids": [], "loss_mask": [], "sampler_logprobs": [],
                                    "advantages": [], "token_advantages": [], "segments": []}
    for index, sample in enumerate(row):
        size = len(sample.input_ids)
        values["input_ids"] += sample.input_ids
        values["position_ids"] += range(size)
        values["loss_mask"] += sample.loss_mask
        values["sampler_logprobs"] += sample.sampler_logprobs
        values["advantages"] += [sample.advantage] * size
        values["token_advantages"] += sample.token_advantages or [0.0] * size
        values["segments"] += [index] * size
    tail = length - len(values["input_ids"])
    for key, fill in (("input_ids", pad_id), ("loss_mask", 0), ("sampler_logprobs", 0.0), ("advantages", 0.0),
                      ("token_advantages", 0.0), ("segments", len(row))):
        values[key] += [fill] * tail
    values["position_ids"] += range(tail)
    return values


def block_causal_mask(segments: Any) -> Any:
    """[rows, 1, L, L] bool: query i may attend key j when both are in one sample and j <= i."""
    import torch

    length = segments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    same = segments.unsqueeze(2) == segments.unsqueeze(1)
    return (same & causal).unsqueeze(1)
