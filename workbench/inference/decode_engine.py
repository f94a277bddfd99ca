"""Continuous-batching decode loop on `LeanModel` and a preallocated KV cache.

`DecodeEngine` holds the live rows of a decode session. `add` prefills new rows (they may
join while others are mid-decode: continuous batching) and `step` samples one token for every
live row, returns the rows that finished, and runs one forward pass for the rest. Sampling,
stop handling and logprobs are `generation`'s (`sample_next`, `record_token`, `penalize`),
so results match `generate_batch_hf` for seeded rows up to floating-point differences.

Layout: live rows occupy cache slots [0, n). A finished row's slot is filled by moving the
last live row into it (its keys/values, one strided copy per moved row, and per-row tensors are
copied), so every forward pass works on contiguous views and the cache is never reallocated per
step; buffers grow (doubling, rarely) only when a session needs more rows or positions than any
before (`reuse` hands them from one session to the next).

A decode step's Python work is one pass over the rows (recording each row's token): the longest
row's length (the attention's key count, the rotary table's extent) is kept up to date rather
than recomputed per step, and the forward skips its weight-change check (the weights are held
still for the session).

Prefill shares work between prompts:
- a shared prefix (`lean_model.SharedPrefix`): when no live row uses one, the longest prefix
  the new prompts share (system prompt + chat template; an RL group's whole prompt but its last
  token) or that one shares with a live row, if at least `MIN_SHARED_PREFIX` tokens, is run
  once (or copied from that row) and stored once; every row whose prompt extends it, now or
  joining later, skips it in prefill and reads it once per step, for all rows, in decoding;
- identical prompts (an RL group, n > 1) are run once and their rows copied;
- a new prompt that extends the prompt of a row already in the cache copies that row's KV for
  the shared part (prefix reuse across joins; valid because weights do not change in a session).
Only the remaining suffixes are run, shortest first, packed, in passes bounded by
`PREFILL_TOKENS` and `PREFILL_ELEMENTS`.

RNG: per step, one `torch.rand(n)` from the global generator for the n live rows, handed out in
admission order (as the HF path does), and seeded rows use their own generator's stream, drawn
up front (`torch.rand(k, generator=g)` on the CPU yields the same numbers as k single draws).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from workbench.inference.generation import (
    BatchCounters,
    GenerationRow,
    RowResult,
    _TextStopper,
    penalize,
    record_token,
    record_top,
    sample_next,
    stop_strings,
    top_logprobs_wanted,
)
from workbench.inference.lean_cache import KVCache
from workbench.inference.lean_model import ForwardBatch, LeanModel, SharedPrefix

MIN_SHARED_PREFIX = 16  # tokens: below this a separate prefix pass costs more than it saves
PREFILL_ELEMENTS = 1 << 26  # rows x query tokens x key positions x heads per prefill pass (attention memory)
# Tokens per prefill pass: smaller passes keep temporaries small enough for the allocator to
# reuse (fresh pages from the OS cost more than the extra passes), at the same matmul speed.
PREFILL_TOKENS = 1024


@dataclass
class _Row:
    """Python-side state of one live row."""

    spec: GenerationRow
    tag: Any  # the caller's handle, returned with the result
    order: int  # admission order: which of the step's global uniforms this row gets
    stops: list[str]
    result: RowResult
    offset: int  # positions [0, offset) are in the shared prefix; its slot holds the rest

    @property
    def length(self) -> int:
        """The sequence's length once the last sampled token is written."""
        return len(self.spec.prompt_ids) + len(self.result.completion_ids)

    @property
    def slot_length(self) -> int:
        """Cache indices the row's slot uses once the last sampled token is written."""
        return self.length - self.offset


class _SlotTensors:
    """Per-slot tensors, indexed like the cache slots; grown by `resize`."""

    # What `move` carries: not `logits`, which a move (finished rows leaving, after sampling)
    # always precedes a forward pass that rewrites them for every live slot.
    FIELDS = (
        "position",
        "offset",
        "steps",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "penalty",
        "seeded",
        "seeded_uniforms",
        "prompts",
        "seen",
    )

    def __init__(self, device: Any) -> None:
        self.device = device
        self.capacity = 0
        self.vocab = 0
        self.position: Any = None  # the position of the next token to write
        self.offset: Any = None  # the row's shared-prefix length: position p is at slot index p - offset
        self.steps: Any = None  # tokens sampled so far
        self.temperature: Any = None
        self.top_p: Any = None
        self.top_k: Any = None
        self.min_p: Any = None
        self.penalty: Any = None
        self.seeded: Any = None
        self.seeded_uniforms: Any = None  # [slots, width]: a seeded row's draws, step by step
        self.logits: Any = None  # [slots, vocab] float32: what the next step samples from
        self.prompts: Any = None  # [slots, width] prompt ids, -1 padded: finds shared prefixes
        self.seen: Any = None  # [slots, vocab] bool, only once a row uses a repetition penalty
        self.index: Any = None  # arange(capacity): slot ids for cache writes and row indexing

    def resize(
        self,
        capacity: int,
        vocab: int,
        live: int,
        *,
        uniform_width: int = 0,
        prompt_width: int = 0,
        seen: bool = False,
    ) -> None:
        """At least `capacity` slots and the given widths, keeping the first `live` slots."""
        import torch

        self.vocab = vocab
        if capacity > self.capacity or self.position is None:
            specs = {
                "position": torch.long,
                "offset": torch.long,
                "steps": torch.long,
                "temperature": torch.float32,
                "top_p": torch.float32,
                "top_k": torch.long,
                "min_p": torch.float32,
                "penalty": torch.float32,
                "seeded": torch.bool,
            }
            for name, dtype in specs.items():
                setattr(self, name, _regrow(getattr(self, name), (capacity,), dtype, self.device, live))
            self.logits = _regrow(self.logits, (capacity, vocab), torch.float32, self.device, live)
            self.index = torch.arange(capacity, device=self.device)
            self.capacity = capacity
        width = self.seeded_uniforms.shape[1] if self.seeded_uniforms is not None else 0
        self.seeded_uniforms = _regrow(
            self.seeded_uniforms,
            (self.capacity, max(uniform_width, width, 1)),
            torch.float32,
            self.device,
            live,
        )
        width = self.prompts.shape[1] if self.prompts is not None else 0
        self.prompts = _regrow(
            self.prompts, (self.capacity, max(prompt_width, width, 1)), torch.long, self.device, live, fill=-1
        )
        if seen or self.seen is not None:
            self.seen = _regrow(self.seen, (self.capacity, vocab), torch.bool, self.device, live)

    def move(self, dst: Any, src: Any) -> None:
        """Slots `dst` take the values of slots `src` (index tensors)."""
        for name in self.FIELDS:
            tensor = getattr(self, name)
            if tensor is not None:
                tensor[dst] = tensor[src]


class DecodeEngine:
    """Live rows of one decode session; see the module docstring. Not thread-safe: one thread
    drives it, with the model's weights held still (the caller's lock) for the whole session."""

    def __init__(
        self,
        model: LeanModel,
        tokenizer: Any,
        *,
        stop_token_ids: set[int],
        max_rows: int,
        counters: BatchCounters | None = None,
        tokenizer_lock: AbstractContextManager[Any] | None = None,
        reuse: DecodeEngine | None = None,
    ) -> None:
        """`reuse`: a finished engine whose buffers (cache, slot tensors) this one takes over when
        they fit the model, so back-to-back sessions allocate (and page-fault) nothing new."""
        self.model = model
        self.stop_token_ids = stop_token_ids
        self.max_rows = max(1, max_rows)
        self.counters = counters or BatchCounters()
        self.stopper = _TextStopper(tokenizer, tokenizer_lock or nullcontext())
        self.vocab = _vocab(model)
        self.cache: KVCache
        self.slots: _SlotTensors
        if (
            reuse is not None
            and not reuse.live_rows
            and reuse.cache.fits(model)
            and reuse.vocab == self.vocab
        ):
            # Stale keys/values and prompts in free slots are never read: every admitted row
            # gets its prompt, its prefix and its sampling tensors written first.
            self.cache, self.slots = reuse.cache, reuse.slots
        else:
            self.cache, self.slots = model.new_cache(), _SlotTensors(model.device)
        self.rows: list[_Row] = []  # row i lives in cache slot i
        self.prefix: SharedPrefix | None = None  # this session's shared prompt prefix, if any
        self._prefix_tokens: tuple[int, ...] = ()
        self._prefix_rows = 0  # live rows that use it
        self._prefix_mask: Any = None  # [live] bool: which rows use it; None when all (or none) do
        self._orders = itertools.count()
        self._rank: Any = None  # live slot -> rank by admission order; None while that is the identity
        self._min_p_rows = 0  # live rows with min_p > 0: min_p is passed only when some row uses it
        self._penalty_rows = 0  # live rows with a repetition penalty != 1
        self._seeded_rows = 0
        self._greedy_rows = 0  # live rows with temperature 0 / with top-k or top-p: while none are
        self._truncated_rows = 0  # live, `sample_next` skips those branches
        self._longest = 0  # the longest live row's length / slot length (`_Row.length`, `_Row.slot_length`)
        self._longest_slot = 0

    @property
    def live_rows(self) -> int:
        return len(self.rows)

    @property
    def free_rows(self) -> int:
        return self.max_rows - len(self.rows)

    # -- admission ---------------------------------------------------------------------

    def add(self, specs: Sequence[GenerationRow], tags: Sequence[Any]) -> None:
        """Prefill `specs` and make them live; `tags` come back with their results from `step`."""
        import torch

        if not specs:
            return
        if len(self.rows) + len(specs) > self.max_rows:
            raise ValueError(f"{len(self.rows)} live + {len(specs)} new rows exceed max_rows={self.max_rows}")
        with torch.inference_mode():
            self._add(specs, tags)

    def _add(self, specs: Sequence[GenerationRow], tags: Sequence[Any]) -> None:
        import torch

        first = len(self.rows)
        holders: dict[tuple[int, ...], list[int]] = {}  # distinct prompt -> the rows that have it
        for i, spec in enumerate(specs):
            holders.setdefault(tuple(spec.prompt_ids), []).append(i)
        # Slots: each distinct prompt first, shortest first (similar lengths share a prefill
        # chunk: less padding in its attention), then the duplicates.
        prompts = sorted(holders, key=len)
        row_to_unique = [0] * len(specs)
        for u, prompt in enumerate(prompts):
            for i in holders[prompt]:
                row_to_unique[i] = u
        order = [holders[p][0] for p in prompts] + [i for p in prompts for i in holders[p][1:]]
        self._reserve(first + len(specs), max(len(p) for p in prompts) + 1, specs)
        new = self._write_prompts(prompts, first)
        offsets = self._choose_prefix(prompts, new, first, duplicated=len(specs) > len(prompts))
        starts = self._copy_from_live_rows(prompts, new, first, offsets)
        self._prefill(prompts, starts, offsets, first)
        duplicates = order[len(prompts) :]
        if duplicates:
            dst = torch.arange(first + len(prompts), first + len(specs), device=self.model.device)
            src = torch.tensor([first + row_to_unique[i] for i in duplicates], device=self.model.device)
            self.cache.copy_slots(
                [
                    (
                        slot,
                        first + row_to_unique[i],
                        len(prompts[row_to_unique[i]]) - offsets[row_to_unique[i]],
                    )
                    for slot, i in enumerate(duplicates, start=first + len(prompts))
                ]
            )
            self.slots.logits[dst] = self.slots.logits[src]
            self.slots.prompts[dst] = self.slots.prompts[
                src
            ]  # a stale prompt here would fake a shared prefix
        base = next(self._orders)
        self._orders = itertools.count(base + len(specs))
        for slot, i in enumerate(
            order, start=first
        ):  # admission order is the caller's row order, not the slot order
            self._admit(slot, specs[i], tags[i], base + i, offsets[row_to_unique[i]])
        self._membership_changed()

    def _reserve(self, rows: int, length: int, specs: Sequence[GenerationRow]) -> None:
        live = len(self.rows)
        capacity = rows if rows > self.cache.slots else self.cache.slots
        if rows > self.cache.slots:  # grow by doubling, capped by max_rows
            capacity = min(self.max_rows, max(rows, 2 * self.cache.slots))
        self.cache.reserve(capacity, length, keep_slots=live, keep_length=self._slot_length())
        self.slots.resize(
            capacity,
            self.vocab,
            live,
            uniform_width=max((s.max_new_tokens for s in specs if s.seed is not None), default=0),
            prompt_width=max(len(s.prompt_ids) for s in specs),
            seen=any(_penalty(s) != 1.0 for s in specs),
        )

    def _write_prompts(self, prompts: list[tuple[int, ...]], first: int) -> Any:
        """Record the new prompts in `slots.prompts` (for later joins); returns them as a
        -1 padded tensor [prompts, width]."""
        import torch

        width = max(len(p) for p in prompts)
        new = torch.full((len(prompts), width), -1, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            new[i, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        new = new.to(self.model.device)
        self.slots.prompts[first : first + len(prompts), :width] = new
        self.slots.prompts[first : first + len(prompts), width:] = -1
        return new

    def _choose_prefix(
        self, prompts: list[tuple[int, ...]], new: Any, first: int, *, duplicated: bool
    ) -> list[int]:
        """Each new prompt's offset: the shared prefix's length if the prompt extends it, else 0.
        When no live row uses a shared prefix, a new one is made from the longest prefix these
        prompts share with each other (an RL group's whole prompt but its last token) or with a
        live row, if that is at least `MIN_SHARED_PREFIX` tokens."""
        if self._prefix_rows == 0:
            self.prefix, self._prefix_tokens = None, ()
            shortest = min(len(p) for p in prompts) - 1  # a row must run at least its last token
            length, donor = 0, -1
            if len(prompts) > 1 or duplicated:
                length = min(_common_prefix_length(new), shortest)
            if first:
                shared, slot = _shared_with_live(new, self.slots.prompts[:first, : new.shape[1]]).max(dim=1)
                best = int(shared.argmax())
                if min(int(shared[best]), len(prompts[best]) - 1) > length:
                    length, donor = min(int(shared[best]), len(prompts[best]) - 1), int(slot[best])
                    self._prefix_tokens = prompts[best][:length]
            if length >= MIN_SHARED_PREFIX:
                self._prefix_tokens = self._prefix_tokens or prompts[0][:length]
                self.prefix = self._make_prefix(length, donor)
        if self.prefix is None:
            return [0] * len(prompts)
        length = self.prefix.length
        return [length if len(p) > length and p[:length] == self._prefix_tokens else 0 for p in prompts]

    def _make_prefix(self, length: int, donor: int) -> SharedPrefix:
        """The shared prefix `self._prefix_tokens`: copied from live row `donor` (whose slot holds
        it from position 0), or run as one forward pass when `donor` is -1."""
        cache = self.model.new_cache()
        cache.reserve(1, length, keep_slots=0, keep_length=0)
        if donor >= 0:
            cache.data[:, :, 0, :, :length] = self.cache.data[:, :, donor, :, :length]
        else:
            batch = ForwardBatch.prefill(
                [(0, 0, list(self._prefix_tokens))], 0, self.model.device, logits=False
            )
            self.model.forward(cache, batch)
            self.counters.forward_passes += 1
        return SharedPrefix(cache, length)

    def _copy_from_live_rows(
        self, prompts: list[tuple[int, ...]], new: Any, first: int, offsets: list[int]
    ) -> list[int]:
        """Copy into the new slots the keys/values of the longest prefix each prompt shares with a
        live row of the same offset (prefix reuse across joins); returns, per prompt, the first
        position still to run (always < its length: the last token gives the first logits)."""
        import torch

        starts = list(offsets)
        if not first:
            return starts
        shared = _shared_with_live(new, self.slots.prompts[:first, : new.shape[1]])
        same_offset = self.slots.offset[:first].unsqueeze(0) == torch.tensor(
            offsets, device=shared.device
        ).unsqueeze(1)
        best, donor = shared.masked_fill(~same_offset, 0).max(dim=1)
        moves = []
        for i, (length, slot) in enumerate(zip(best.tolist(), donor.tolist())):
            length = min(length, len(prompts[i]) - 1)
            if length > starts[i]:
                starts[i] = length
                moves.append((first + i, slot))
        self.cache.copy_slots([(dst, src, starts[dst - first] - offsets[dst - first]) for dst, src in moves])
        return starts

    def _prefill(
        self, prompts: list[tuple[int, ...]], starts: list[int], offsets: list[int], first: int
    ) -> None:
        """Run each prompt from its start, in chunks; the last position's logits go to `slots.logits`."""
        shared = self.prefix.length if self.prefix is not None else 0
        index = 0
        while index < len(prompts):
            count, width, keys = 0, 0, 0
            tokens = 0
            while index + count < len(prompts):  # grow the chunk while it stays within both bounds
                i = index + count
                grown_width = max(width, len(prompts[i]) - starts[i])
                grown_keys = max(keys, len(prompts[i]) - offsets[i])
                attention = (count + 1) * grown_width * (grown_keys + shared) * self.model.heads
                tokens += len(prompts[i]) - starts[i]
                if count and (attention > PREFILL_ELEMENTS or tokens > PREFILL_TOKENS):
                    break
                width, keys, count = grown_width, grown_keys, count + 1
            chunk = range(index, index + count)
            pieces = [(starts[i], offsets[i], list(prompts[i][starts[i] :])) for i in chunk]
            batch = ForwardBatch.prefill(pieces, first + index, self.model.device)
            prefix = self.prefix if any(offsets[i] for i in chunk) else None
            self.slots.logits[first + index : first + index + count] = self.model.forward(
                self.cache, batch, prefix
            )
            self.counters.forward_passes += 1
            self.counters.prefill_rows += count
            index += count

    def _admit(self, slot: int, spec: GenerationRow, tag: Any, order: int, offset: int) -> None:
        """Fill slot `slot`'s sampling tensors and make the row live."""
        import torch

        s = self.slots
        sampling = spec.sampling
        min_p = float(sampling.extra.get("min_p") or 0.0)
        penalty = _penalty(spec)
        s.position[slot] = len(spec.prompt_ids)
        s.offset[slot] = offset
        s.steps[slot] = 0
        s.temperature[slot] = float(sampling.temperature)
        s.top_p[slot] = float(sampling.top_p)
        s.top_k[slot] = int(sampling.top_k)
        s.min_p[slot] = min_p
        s.penalty[slot] = penalty
        s.seeded[slot] = spec.seed is not None
        if spec.seed is not None:
            generator = torch.Generator().manual_seed(spec.seed)
            s.seeded_uniforms[slot, : spec.max_new_tokens] = torch.rand(
                spec.max_new_tokens, generator=generator
            )
        if s.seen is not None:
            s.seen[slot] = False
            if penalty != 1.0:  # vLLM's rule: prompt tokens count as repeated too
                ids = [t for t in spec.prompt_ids if 0 <= t < s.vocab]
                s.seen[slot, torch.tensor(ids, dtype=torch.long, device=s.device)] = True
        self._min_p_rows += min_p > 0
        self._penalty_rows += penalty != 1.0
        self._seeded_rows += spec.seed is not None
        self._greedy_rows += _greedy(spec)
        self._truncated_rows += _truncated(spec, s.vocab)
        self._prefix_rows += offset > 0
        self.rows.append(_Row(spec, tag, order, stop_strings(spec), RowResult(), offset))

    # -- decoding ----------------------------------------------------------------------

    def step(self) -> list[tuple[Any, RowResult]]:
        """Sample a token for every live row; returns (tag, result) of the rows that finished,
        then runs the next forward pass for the rest."""
        import torch

        with torch.inference_mode():
            tokens, finished = self._sample()
            done = [(self.rows[i].tag, self._complete(self.rows[i])) for i in finished]
            if finished:
                tokens = self._remove(finished, tokens)
            if self.rows:
                self._decode(tokens)
        return done

    def _sample(self) -> tuple[Any, list[int]]:
        s, n = self.slots, len(self.rows)
        logits = s.logits[:n]
        penalized = penalize(logits, s.seen[:n], s.penalty[:n]) if self._penalty_rows else None
        tokens, logprobs = sample_next(
            logits,
            s.temperature[:n],
            s.top_p[:n],
            s.top_k[:n],
            self._uniforms(n),
            min_p=s.min_p[:n] if self._min_p_rows else None,
            sampling_logits=penalized,
            greedy=None if self._greedy_rows else False,
            truncated=None if self._truncated_rows else False,
        )
        wanted = [top_logprobs_wanted(row.spec) for row in self.rows]
        if any(wanted):
            record_top(logits, s.temperature[:n], wanted, [row.result for row in self.rows])
        if self._penalty_rows:
            s.seen[s.index[:n], tokens] = True
        if self._seeded_rows:  # steps index a seeded row's own uniforms; nothing else reads them
            s.steps[:n] += 1
        finished = [
            i
            for i, (row, token, logprob) in enumerate(zip(self.rows, tokens.tolist(), logprobs.tolist()))
            if record_token(
                row.spec, row.result, token, logprob, self.stop_token_ids, self.stopper, row.stops
            )
        ]
        self._longest += 1  # every live row has one more token
        self._longest_slot += 1
        return tokens, finished

    def _uniforms(self, n: int) -> Any:
        import torch

        s = self.slots
        values = torch.rand(n)  # the global generator, one draw per live row (as the HF path)
        if self._rank is not None:
            values = values[self._rank]
        if s.device.type != "cpu":
            values = values.to(s.device)
        if self._seeded_rows:
            steps = s.steps[:n].clamp(max=s.seeded_uniforms.shape[1] - 1)
            seeded = s.seeded_uniforms[s.index[:n], steps]
            values = torch.where(s.seeded[:n], seeded, values)
        return values

    def _decode(self, tokens: Any) -> None:
        """Write the sampled tokens into the cache and compute the next logits."""
        n, s = len(self.rows), self.slots
        key_length = self._longest_slot
        if key_length > self.cache.length:
            self.cache.reserve(self.cache.slots, key_length, keep_slots=n, keep_length=key_length - 1)
        position = s.position[:n]
        batch = ForwardBatch.decode(
            tokens,
            position,
            position - s.offset[:n],
            s.index[:n],
            key_length,
            prefix_rows=self._prefix_mask,
            max_position=self._longest - 1,
        )
        # Weights are held still for the session (see the class): no need to look for changes.
        s.logits[:n] = self.model.forward(
            self.cache, batch, self.prefix if self._prefix_rows else None, check_weights=False
        )
        position += 1
        self.counters.forward_passes += 1

    def _remove(self, finished: list[int], tokens: Any) -> Any:
        """Drop the finished rows, moving the last live rows into their slots; returns the
        survivors' tokens in their new slot order."""
        import torch

        n = len(self.rows)
        gone = set(finished)
        keep = n - len(gone)
        holes = [i for i in finished if i < keep]
        movers = [i for i in range(keep, n) if i not in gone]
        order = list(range(keep))
        for hole, mover in zip(holes, movers):
            order[hole] = mover
        for i in finished:
            row = self.rows[i]
            self._min_p_rows -= float(row.spec.sampling.extra.get("min_p") or 0.0) > 0
            self._penalty_rows -= _penalty(row.spec) != 1.0
            self._seeded_rows -= row.spec.seed is not None
            self._greedy_rows -= _greedy(row.spec)
            self._truncated_rows -= _truncated(row.spec, self.slots.vocab)
            self._prefix_rows -= row.offset > 0
        if not holes:  # only rows at the end left: nothing moves
            self.rows = self.rows[:keep]
            self._membership_changed()
            return tokens[:keep]
        # The movers' last sampled token is not in the cache yet: slot_length - 1 indices.
        self.cache.copy_slots(
            [(hole, mover, self.rows[mover].slot_length - 1) for hole, mover in zip(holes, movers)]
        )
        device = self.model.device
        self.slots.move(torch.tensor(holes, device=device), torch.tensor(movers, device=device))
        self.rows = [self.rows[i] for i in order]
        self._membership_changed()
        return tokens[torch.tensor(order, device=tokens.device)]

    def _membership_changed(self) -> None:
        """Recompute what depends on which rows are live: the uniform ranks and the prefix mask."""
        import torch

        orders = [row.order for row in self.rows]
        if orders == sorted(orders):
            self._rank = None
        else:
            rank = [0] * len(orders)
            for position, slot in enumerate(sorted(range(len(orders)), key=orders.__getitem__)):
                rank[slot] = position
            self._rank = torch.tensor(rank)
        uses = [row.offset > 0 for row in self.rows]
        self._prefix_mask = (
            None if all(uses) or not any(uses) else torch.tensor(uses, device=self.model.device)
        )
        # Kept up to date by `_sample` until the next change: no per-row loop in a decode step.
        self._longest = max((row.length for row in self.rows), default=0)
        self._longest_slot = self._slot_length()

    def _complete(self, row: _Row) -> RowResult:
        if row.result.text is None:
            row.result.text = self.stopper.decode(row.result.completion_ids)
        return row.result

    def _slot_length(self) -> int:
        return max((row.slot_length for row in self.rows), default=0)


def _vocab(model: LeanModel) -> int:
    weight = getattr(model.lm_head, "weight", None)
    return int(weight.shape[0]) if weight is not None else int(model.config.vocab_size)


def _penalty(spec: GenerationRow) -> float:
    return float(spec.sampling.extra.get("repetition_penalty") or 1.0)


def _float32(value: float) -> float:
    """`value` rounded as the float32 slot tensors hold it (what `sample_next` compares)."""
    return struct.unpack("f", struct.pack("f", float(value)))[0]


def _greedy(spec: GenerationRow) -> bool:
    return _float32(spec.sampling.temperature) <= 0


def _truncated(spec: GenerationRow, vocab: int) -> bool:
    """Whether the row uses top-k or top-p (as `sample_next` decides it)."""
    return 0 < int(spec.sampling.top_k) < vocab or _float32(spec.sampling.top_p) < 1.0


def _shared_with_live(new: Any, live: Any) -> Any:
    """[new, live] lengths of the common prefix of each new prompt with each live row's prompt
    (both -1 padded to the same width)."""
    same = (new.unsqueeze(1) == live.unsqueeze(0)) & (new.unsqueeze(1) >= 0)
    return same.long().cumprod(-1).sum(-1)


def _common_prefix_length(prompts: Any) -> int:
    """Leading positions where every row of `prompts` [rows, width] (-1 padded) agrees."""
    same = ((prompts == prompts[:1]) & (prompts >= 0)).all(dim=0)
    return int(same.long().cumprod(0).sum())


def _regrow(tensor: Any, shape: tuple[int, ...], dtype: Any, device: Any, live: int, fill: Any = 0) -> Any:
    """`tensor` if it already has `shape`, else a new one of `shape` keeping its first `live` rows."""
    import torch

    if tensor is not None and tuple(tensor.shape) == shape:
        return tensor
    grown = torch.full(shape, fill, dtype=dtype, device=device)
    if tensor is not None and live:
        columns = min(tensor.shape[1], shape[1]) if tensor.dim() > 1 else None
        if columns is None:
            grown[:live] = tensor[:live]
        else:
            grown[:live, :columns] = tensor[:live, :columns]
    return grown
