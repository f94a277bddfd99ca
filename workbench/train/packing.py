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

Shared prompts (`share_prefixes`, eager / SDPA attention only): an RL group's rollouts start with
the same prompt, often most of each sample. Samples that begin with the same tokens (never a loss
token) become one `Shared` item laid out as [prefix, rest_1, ..., rest_k]: the prefix is run once,
each rest attends to the whole prefix and causally to itself (positions continue from the
prefix's), and the logprob of a rest's first token comes from the prefix's last logits
(`predecessors` in the batch). The prefix's activations get the sum of every member's gradient,
exactly what k separate copies would sum to, so loss and gradients are those of the padded path
while the forward/backward runs on far fewer tokens. Varlen attention (flash-attention) finds
sequence boundaries in position ids alone and cannot express a shared prefix: no sharing there.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.train.samples import Sample

# Shared-prefix items are at most this many times the longest sample wide (a group split into
# several items, each with its own copy of the prefix, beyond): with a 4D mask attention costs
# every row its full width squared.
SHARED_WIDTH_FACTOR = 4
MIN_SHARED_TOKENS = 2  # a shorter common prefix is not worth a shared item


@dataclass(eq=False)
class Shared:
    """Samples whose first `prefix` tokens are the same (no loss token among them), laid out as
    the prefix once, then each sample's remaining tokens."""
    prefix: int
    samples: list[Sample]


Item = Sample | Shared
Row = list[Item]


def item_length(item: Item) -> int:
    if isinstance(item, Shared):
        return item.prefix + sum(len(s.input_ids) - item.prefix for s in item.samples)
    return len(item.input_ids)


def item_samples(item: Item) -> list[Sample]:
    return item.samples if isinstance(item, Shared) else [item]


def shareable(sample: Sample) -> int:
    """How many leading tokens of `sample` may be shared: up to its first loss token, and never
    all of it (each member keeps at least one token of its own)."""
    first_loss = next((i for i, m in enumerate(sample.loss_mask) if m), len(sample.input_ids))
    return min(first_loss, len(sample.input_ids) - 1)


def share_prefixes(samples: Sequence[Sample], width: int, min_shared: int = MIN_SHARED_TOKENS) -> list[Item]:
    """Samples grouped by common prefix: sorted by token ids (samples with a common prefix end up
    adjacent), each joins the current group when that saves more tokens than the group saved
    without it (the group's prefix shrinks to what all members share) and keeps the group within
    `width` tokens; else it starts a new group. Groups of one are plain samples."""
    groups: list[tuple[int, list[Sample], int]] = []  # (prefix, members, laid-out length)
    for sample in sorted(samples, key=lambda s: s.input_ids):
        size, limit = len(sample.input_ids), shareable(sample)
        if groups:
            prefix, members, _ = groups[-1]
            first = members[0].input_ids
            common = 0
            bound = min(prefix, limit)
            while common < bound and first[common] == sample.input_ids[common]:
                common += 1
            total = sum(len(s.input_ids) for s in members) + size
            length = total - common * len(members)  # common + sum(len - common) over all members
            if common >= min_shared and common * len(members) > prefix * (len(members) - 1) and length <= width:
                groups[-1] = (common, members + [sample], length)
                continue
        groups.append((limit, [sample], size))
    return [Shared(prefix, members) if len(members) > 1 else members[0] for prefix, members, _ in groups]


def pack_rows(samples: Sequence[Item], width: int) -> list[Row]:
    """Best-fit decreasing: each sample (or shared item), longest first, goes into the row whose
    free space fits it most tightly (a bisect over the rows' free space: O(n log n), fine for
    large batches). An item longer than `width` gets a row of its own."""
    rows: list[Row] = []
    spaces: list[tuple[int, int]] = []  # (free tokens, row index), ascending
    for sample in sorted(samples, key=item_length, reverse=True):
        size = item_length(sample)
        at = bisect.bisect_left(spaces, (size, -1))
        if at < len(spaces):
            space, index = spaces.pop(at)
            rows[index].append(sample)
        else:
            space, index = width, len(rows)
            rows.append([sample])
        bisect.insort(spaces, (space - size, index))
    return rows


def packed_micro_batches(samples: Sequence[Sample], micro_batch_size: int, width: int | None = None, *,
                         share: bool = False) -> list[list[Row]]:
    """Rows of up to `width` tokens (default: the longest sample's length), grouped into
    micro-batches of at most micro_batch_size x the longest sample's tokens: never a larger
    tensor than the padded path's largest micro-batch (so no more memory), and never more
    micro-batches. Rows are sorted by length and cut into contiguous, equally many-rowed runs, so
    each micro-batch's rows are alike in length and its tail padding small.
    `share`: samples with a common prefix become `Shared` items (see the module doc) of up to
    SHARED_WIDTH_FACTOR x the longest sample (at most one micro-batch's tokens); rows are then as
    wide as the widest item."""
    if not samples:
        return []
    longest = max(len(s.input_ids) for s in samples)
    width = max(width or longest, longest)
    items: Sequence[Item] = samples
    if share:
        items = share_prefixes(samples, max(width, min(SHARED_WIDTH_FACTOR, micro_batch_size) * longest))
        width = max(width, max(item_length(item) for item in items))
    rows = sorted(pack_rows(items, width), key=row_length, reverse=True)
    per_chunk = max(1, micro_batch_size * longest // width)
    count = -(-len(rows) // per_chunk)
    size = -(-len(rows) // count)
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def row_length(row: Row) -> int:
    return sum(item_length(item) for item in row)


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
        "input_ids", "position_ids", "loss_mask", "sampler_logprobs", "advantages", "token_advantages", "segments",
        "shared", "predecessors")}
    for row in rows:
        values = _row_values(row, pad_id, length)
        for key, column in columns.items():
            column.append(values[key])
    segments, shared = torch.tensor(columns.pop("segments")), torch.tensor(columns.pop("shared"))
    predecessors = columns.pop("predecessors")
    floats = ("loss_mask", "sampler_logprobs", "advantages", "token_advantages")
    batch: dict[str, Any] = {key: torch.tensor(values, dtype=torch.float32 if key in floats else torch.long)
                             for key, values in columns.items()}
    if any(isinstance(item, Shared) for row in rows for item in row):
        if not with_mask:
            raise ValueError("shared prefixes need the 4D attention mask")
        # where a token's logprob comes from (-1: none); plain samples keep the t-1 default
        batch["predecessors"] = torch.tensor(predecessors, dtype=torch.long)
    if with_mask:
        batch["attention_mask"] = block_causal_mask(segments, shared)
    return batch


def _row_values(row: Row, pad_id: int, length: int) -> dict[str, list[Any]]:
    """One row's concatenated per-token values, padded to `length`. The tail padding is one more
    segment with positions 0.. of its own: it attends only to itself (no fully masked query rows,
    which give NaN in some kernels) and nothing real attends to it."""
    values: dict[str, list[Any]] = {"input_ids": [], "position_ids": [], "loss_mask": [], "sampler_logprobs": [],
                                    "advantages": [], "token_advantages": [], "segments": [], "shared": [],
                                    "predecessors": []}
    segment = 0

    def lay(sample: Sample, start: int, size: int, sees: int, after: int) -> None:
        """Tokens [start, start + size) of `sample` as one segment that also sees segment `sees`
        (-1: none); its first token's logprob comes from row index `after` (-1: none)."""
        nonlocal segment
        end, offset = start + size, len(values["input_ids"])
        values["input_ids"] += sample.input_ids[start:end]
        values["position_ids"] += range(start, end)
        values["loss_mask"] += sample.loss_mask[start:end]
        values["sampler_logprobs"] += sample.sampler_logprobs[start:end]
        values["advantages"] += [sample.advantage] * size
        values["token_advantages"] += (sample.token_advantages or [0.0] * len(sample.input_ids))[start:end]
        values["segments"] += [segment] * size
        values["shared"] += [sees] * size
        values["predecessors"] += [after, *range(offset, offset + size - 1)]
        segment += 1

    for item in row:
        if isinstance(item, Shared):
            head, prefix = item.samples[0], item.prefix
            # the prefix carries no loss and no per-sample values: zeros, whichever member it is copied from
            lay(Sample(head.input_ids[:prefix], [0] * prefix, [0.0] * prefix, 0.0), 0, prefix, -1, -1)
            own, last = segment - 1, len(values["input_ids"]) - 1
            for sample in item.samples:
                lay(sample, prefix, len(sample.input_ids) - prefix, own, last)
        else:
            lay(item, 0, len(item.input_ids), -1, -1)
    tail = length - len(values["input_ids"])
    for key, fill in (("input_ids", pad_id), ("loss_mask", 0), ("sampler_logprobs", 0.0), ("advantages", 0.0),
                      ("token_advantages", 0.0), ("segments", segment), ("shared", -1), ("predecessors", -1)):
        values[key] += [fill] * tail
    values["position_ids"] += range(tail)
    return values


def block_causal_mask(segments: Any, shared: Any = None) -> Any:
    """[rows, 1, L, L] bool: query i may attend key j when j <= i and both are in one segment, or
    j is in the segment i shares (`shared`: per token, the segment of its shared prefix or -1)."""
    import torch

    length = segments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    same = segments.unsqueeze(2) == segments.unsqueeze(1)
    if shared is not None:
        same = same | (shared.unsqueeze(2) == segments.unsqueeze(1))
    return (same & causal).unsqueeze(1)
