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
token) become one `Shared` item, trained in two passes (`collate_prefixed`, run by
`workbench.train.loss.token_logprobs`):
- the prefix pass runs each group's prompt once (all but its last shared token), prompts packed
  into rows like plain samples, and keeps every layer's keys and values;
- the rest pass runs each member's remaining tokens, starting at that last shared token so every
  logprob it needs comes from its own row, packed into rows like plain samples; each row's
  attention also reads its group's prompt keys/values from the prefix pass (as a KV cache).
Prompts that begin alike (a system prompt, few-shot turns) share that beginning in turn: it runs
in a pass before theirs (`prompt_tree`), so each prompt token runs once per micro-batch.
A rest row holds the rests of at most one group (plus plain samples, which see no prompt), so
its attention reads one prompt's keys, not a wide masked row of them. The prompt's activations
get the sum of every member's gradient, exactly what k separate copies would sum to, so loss and
gradients are those of the padded path while the forward/backward runs on far fewer tokens, and
attention on short rows. Varlen attention (flash-attention) finds sequence boundaries in
position ids alone and cannot express a shared prefix: no sharing there.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from workbench.train.samples import Sample

T = TypeVar("T")
MIN_SHARED_TOKENS = (
    2  # a shorter common prefix is not worth a shared item (and the prefix pass needs >= 1 token)
)


@dataclass(eq=False)
class Shared:
    """Samples whose first `prefix` tokens are the same (no loss token among them): the prefix
    pass runs tokens [0, prefix - 1) once, each sample's rest runs from prefix - 1 on."""

    prefix: int
    samples: list[Sample]


Item = Sample | Shared
Row = list[Item]


def item_length(item: Item) -> int:
    """Tokens the item costs laid out: a shared prefix once (its last token once per member,
    which starts its rest: see `layout_prefixed`)."""
    if isinstance(item, Shared):
        return item.prefix - 1 + sum(len(s.input_ids) - item.prefix + 1 for s in item.samples)
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
            if (
                common >= min_shared
                and common * len(members) > prefix * (len(members) - 1)
                and length <= width
            ):
                groups[-1] = (common, members + [sample], length)
                continue
        groups.append((limit, [sample], size))
    return [Shared(prefix, members) if len(members) > 1 else members[0] for prefix, members, _ in groups]


def pack_rows(samples: Sequence[Item], width: int) -> list[Row]:
    """Best-fit decreasing: each sample (or item), longest first, goes into the row whose free
    space fits it most tightly. An item longer than `width` gets a row of its own."""
    rows: list[Row] = []
    _best_fit([(item_length(item), item) for item in samples], width, rows, [])
    return rows


def _best_fit(
    entries: list[tuple[int, T]], width: int, rows: list[list[T]], spaces: list[tuple[int, int]]
) -> None:
    """Place (size, value) entries, largest first, each in the row of `rows` whose free space
    (`spaces`: (free tokens, row index), ascending) fits it most tightly, else in a new row of
    `width`: a bisect over the free space, O(n log n), fine for large batches."""
    for size, value in sorted(entries, key=lambda entry: entry[0], reverse=True):
        at = bisect.bisect_left(spaces, (size, -1))
        if at < len(spaces):
            space, index = spaces.pop(at)
            rows[index].append(value)
        else:
            space, index = width, len(rows)
            rows.append([value])
        bisect.insort(spaces, (space - size, index))


def packed_micro_batches(
    samples: Sequence[Sample], micro_batch_size: int, width: int | None = None
) -> list[list[Row]]:
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
    return [rows[i : i + size] for i in range(0, len(rows), size)]


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


def collate_packed(
    rows: Sequence[Sequence[Sample]], pad_id: int, *, with_mask: bool = True
) -> dict[str, Any]:
    """Tensors for one packed micro-batch of plain samples: [rows, longest row]. `with_mask`: add
    the 4D block-diagonal causal mask (bool: True = may attend) for eager / SDPA attention; the
    caller turns it into the model's additive float mask."""
    import torch

    length = max(row_length(list(row)) for row in rows)
    values = [
        _row_values([Node(sample.input_ids, 0, sample=sample) for sample in row], pad_id, length)
        for row in rows
    ]
    batch = _tensors(
        values,
        ("input_ids", "position_ids", "loss_mask", "sampler_logprobs", "advantages", "token_advantages"),
    )
    if with_mask:
        batch["attention_mask"] = block_causal_mask(torch.tensor([v["segments"] for v in values]))
    return batch


# -- shared prompts: the prefix pass and the rest pass ----------------------------------------


def prefixed_micro_batches(samples: Sequence[Sample], micro_batch_size: int) -> list[list[Item]]:
    """Shared groups and plain samples (`share_prefixes`) per micro-batch for `collate_prefixed`:
    items longest first, each micro-batch filled until one more item would lay out more than
    micro_batch_size x the longest sample's tokens (the padded path's largest micro-batch: no
    more memory; a larger group is split). Next-fit keeps this linear in the batch."""
    if not samples:
        return []
    budget = micro_batch_size * max(len(s.input_ids) for s in samples)
    items = sorted(
        (part for item in share_prefixes(samples, budget) for part in _within(item, budget)),
        key=item_length,
        reverse=True,
    )
    batches: list[list[Item]] = [[]]
    for item in items:
        if batches[-1] and laid_out_tokens(batches[-1] + [item]) > budget:
            batches.append([])
        batches[-1].append(item)
    return batches


def _within(item: Item, budget: int) -> list[Item]:
    """`item` as parts that each lay out (padding included) within `budget` tokens: a group that
    does not is halved, each half with its own copy of the prompt (a plain sample always fits)."""
    if not isinstance(item, Shared) or laid_out_tokens([item]) <= budget:
        return [item]
    half = len(item.samples) // 2
    parts = [item.samples[:half], item.samples[half:]]
    return [
        piece
        for part in parts
        for piece in _within(Shared(item.prefix, part) if len(part) > 1 else part[0], budget)
    ]


@dataclass(eq=False)
class Node:
    """Tokens `ids` at positions start.. that read their ancestors' tokens (keys/values) before
    their own. A leaf is a sample's tokens from `start` on (its rest, or all of a plain sample);
    an inner node is a prompt part, run in an earlier pass."""

    ids: list[int]
    start: int
    parent: Node | None = None
    sample: Sample | None = None  # leaves only


@dataclass
class PrefixLayout:
    """One micro-batch in passes: `passes[d]` are the rows of the inner nodes at depth d (a
    common prompt beginning, then what follows it, ...), `rests` the rows of the leaves. A row
    holds the children of at most one node (plus parentless nodes), so it reads one context."""

    passes: list[list[list[Node]]]
    rests: list[list[Node]]

    def tokens(self) -> int:
        """Laid-out tokens (padding included): what the passes run on."""
        return sum(
            len(rows) * max(sum(len(n.ids) for n in row) for row in rows)
            for rows in [*self.passes, self.rests]
        )


def prompt_tree(items: Sequence[Item]) -> tuple[list[Node], list[Node]]:
    """Leaves (every sample, once) and inner nodes. A group's prompt is its first prefix - 1
    tokens (each rest starts at the prompt's last token, so every logprob it needs comes from
    its own row); prompts that begin alike (a system prompt, few-shot turns) share that beginning
    in turn, grouped like samples (`share_prefixes`) until no two roots begin alike."""
    leaves: list[Node] = []
    roots: list[Node] = []
    for item in items:
        if isinstance(item, Shared):
            if item.prefix < MIN_SHARED_TOKENS:
                raise ValueError(
                    f"a shared prefix needs at least {MIN_SHARED_TOKENS} tokens (its prompt runs all but the last)"
                )
            head = Node(item.samples[0].input_ids[: item.prefix - 1], 0)
            roots.append(head)
            leaves += [Node(s.input_ids[item.prefix - 1 :], item.prefix - 1, head, s) for s in item.samples]
        else:
            leaves.append(Node(item.input_ids, 0, sample=item))
    inner = list(roots)
    while True:
        # prompt parts carry no loss: a stand-in sample per root, shareable up to its last token
        stand_ins = {}
        for root in roots:
            stand_in = Sample(root.ids, [0] * len(root.ids), [0.0] * len(root.ids), 0.0)
            stand_ins[id(stand_in)] = (stand_in, root)  # (the stand-in kept alive: its id stays its own)
        grouped = share_prefixes([stand_in for stand_in, _ in stand_ins.values()], 1 << 62)
        groups = [item for item in grouped if isinstance(item, Shared)]
        if not groups:
            return leaves, inner
        roots = [stand_ins[id(item)][1] for item in grouped if not isinstance(item, Shared)]
        for group in groups:
            common = Node(group.samples[0].input_ids[: group.prefix], 0)
            for stand_in in group.samples:
                child = stand_ins[id(stand_in)][1]  # a root: starts at 0, no parent yet
                child.ids, child.start, child.parent = child.ids[group.prefix :], group.prefix, common
            roots.append(common)
            inner.append(common)


def layout_prefixed(items: Sequence[Item]) -> PrefixLayout:
    """`prompt_tree`'s inner nodes in passes by depth, then the leaves; each pass packed by
    `_pack_children`."""
    leaves, inner = prompt_tree(items)
    depth: dict[int, int] = {}

    def depth_of(node: Node) -> int:
        if id(node) not in depth:
            depth[id(node)] = 0 if node.parent is None else depth_of(node.parent) + 1
        return depth[id(node)]

    levels: list[list[Node]] = [[] for _ in range(1 + max((depth_of(n) for n in inner), default=-1))]
    for node in inner:
        levels[depth_of(node)].append(node)
    return PrefixLayout([_pack_children(level) for level in levels], _pack_children(leaves))


def _pack_children(nodes: Sequence[Node]) -> list[list[Node]]:
    """Rows as wide as the longest node: each parent's children best-fit decreasing among rows of
    their own (a row reads one context: attention over one prompt's keys, not a wide masked
    row of several), then parentless nodes best-fit into any row's free space or new rows."""
    width = max(len(n.ids) for n in nodes)
    rows: list[list[Node]] = []
    families: dict[int, list[Node]] = {}
    for node in nodes:
        if node.parent is not None:
            families.setdefault(id(node.parent), []).append(node)
    for children in families.values():
        own: list[list[Node]] = []
        _best_fit([(len(n.ids), n) for n in children], width, own, [])
        rows += own
    spaces = sorted((width - sum(len(n.ids) for n in row), at) for at, row in enumerate(rows))
    _best_fit([(len(n.ids), n) for n in nodes if n.parent is None], width, rows, spaces)
    return rows


def laid_out_tokens(items: Sequence[Item]) -> int:
    return layout_prefixed(items).tokens()


def collate_prefixed(items: Sequence[Item], pad_id: int) -> dict[str, Any]:
    """Tensors for one micro-batch of shared groups and plain samples (`layout_prefixed`):
    - the leaves' pass, [rows, longest]: input_ids, position_ids (a rest continues its prompt's
      positions), the per-token loss values, `starts` (True where a token has no predecessor
      in its row: its logprob is 0) and `attention_mask` [rows, 1, L, K + L] (bool: the first K
      columns are the row's context, then block-diagonal causal over the row), `context`
      [rows, K]: where the context's tokens are among the prompt passes' tokens (0: masked);
    - `prompt_passes` (only when there are groups): per pass the same input_ids, position_ids,
      attention_mask and context, for the prompt parts.
    Every token of the passes gets a flat index, pass by pass, row-major: a row's context is the
    flat indices of its nodes' parent and that parent's ancestors, in order."""
    layout = layout_prefixed(items)
    flat: dict[int, list[int]] = {}  # id(inner node) -> the flat indices of its tokens
    offset = 0
    passes = []
    for rows in layout.passes:
        batch = _collate_pass(rows, pad_id, flat, with_loss=False)
        length = batch["input_ids"].shape[1]
        for r, row in enumerate(rows):
            column = 0
            for node in row:
                at = offset + r * length + column
                flat[id(node)] = list(range(at, at + len(node.ids)))
                column += len(node.ids)
        offset += batch["input_ids"].numel()
        passes.append(batch)
    batch = _collate_pass(layout.rests, pad_id, flat, with_loss=True)
    if passes:
        batch["prompt_passes"] = passes
    else:
        del batch["context"]
    return batch


def _context(node: Node | None, flat: dict[int, list[int]]) -> list[int]:
    return [] if node is None else _context(node.parent, flat) + flat[id(node)]


def _collate_pass(
    rows: list[list[Node]], pad_id: int, flat: dict[int, list[int]], *, with_loss: bool
) -> dict[str, Any]:
    import torch

    length = max(sum(len(n.ids) for n in row) for row in rows)
    values = [_row_values(row, pad_id, length) for row in rows]
    keys = ["input_ids", "position_ids"]
    if with_loss:
        keys += ["loss_mask", "sampler_logprobs", "advantages", "token_advantages"]
    batch = _tensors(values, keys)
    if with_loss:
        batch["starts"] = torch.tensor([v["starts"] for v in values], dtype=torch.bool)
    own = block_causal_mask(torch.tensor([v["segments"] for v in values]))
    # a row reads the context of its nodes' one parent (parentless nodes in it read nothing)
    contexts = [_context(next((n.parent for n in row if n.parent is not None), None), flat) for row in rows]
    width = max(len(c) for c in contexts)
    context = torch.zeros(len(rows), width, dtype=torch.long)
    sees = torch.zeros(len(rows), length, width, dtype=torch.bool)
    for r, indices in enumerate(contexts):
        if indices:
            context[r, : len(indices)] = torch.tensor(indices)
            reads = torch.tensor(values[r]["reads_context"], dtype=torch.bool)
            sees[r, :, : len(indices)] = reads.unsqueeze(1)
    batch["context"] = context
    batch["attention_mask"] = torch.cat([sees.unsqueeze(1), own], dim=-1)
    return batch


def _row_values(row: Sequence[Node], pad_id: int, length: int) -> dict[str, list[Any]]:
    """One row's concatenated per-token values, padded to `length` (loss values: those of a
    leaf's sample from its start on; 0 for prompt parts). The tail padding is one more segment
    with positions 0.. of its own: it attends only to itself (no fully masked query rows, which
    give NaN in some kernels) and nothing real attends to it."""
    values: dict[str, list[Any]] = {
        key: []
        for key in (
            "input_ids",
            "position_ids",
            "loss_mask",
            "sampler_logprobs",
            "advantages",
            "token_advantages",
            "segments",
            "starts",
            "reads_context",
        )
    }
    for segment, node in enumerate(row):
        size, start, sample = len(node.ids), node.start, node.sample
        values["input_ids"] += node.ids
        values["position_ids"] += range(start, start + size)
        if sample is not None:
            values["loss_mask"] += sample.loss_mask[start:]
            values["sampler_logprobs"] += sample.sampler_logprobs[start:]
            values["advantages"] += [sample.advantage] * size
            values["token_advantages"] += (sample.token_advantages or [0.0] * len(sample.input_ids))[start:]
        values["segments"] += [segment] * size
        values["starts"] += [True] + [False] * (size - 1)
        values["reads_context"] += [node.parent is not None] * size
    tail = length - len(values["input_ids"])
    for key, fill in (
        ("input_ids", pad_id),
        ("segments", len(row)),
        ("starts", True),
        ("reads_context", False),
    ):
        values[key] += [fill] * tail
    for key in ("loss_mask", "sampler_logprobs", "advantages", "token_advantages"):
        values[key] += [0.0] * (length - len(values[key]))
    values["position_ids"] += range(tail)
    return values


def _tensors(values: list[dict[str, list[Any]]], keys: Sequence[str]) -> dict[str, Any]:
    import torch

    floats = ("loss_mask", "sampler_logprobs", "advantages", "token_advantages")
    return {
        key: torch.tensor([v[key] for v in values], dtype=torch.float32 if key in floats else torch.long)
        for key in keys
    }


def block_causal_mask(segments: Any) -> Any:
    """[rows, 1, L, L] bool: query i may attend key j when j <= i and both are in one segment."""
    import torch

    length = segments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return ((segments.unsqueeze(2) == segments.unsqueeze(1)) & causal).unsqueeze(1)
