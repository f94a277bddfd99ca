"""Batched autoregressive decoding with a KV cache and per-row sampling settings.

The rules under `LocalClient`: one call decodes a whole batch of rows, each with its own
prompt, temperature, top-p, top-k, min-p, repetition penalty, max_tokens, stop strings and seed
(min_p and repetition_penalty come in `SamplingParams.extra`, vLLM's names). Rows with different
sampling settings share one forward pass per step, and rows that finish leave the batch.
Two implementations follow these rules: `generate_batch_hf`, a loop over the Hugging Face
forward with a `DynamicCache` (any causal LM; described below), and the lean engine
(`decode_engine` on `lean_model`: Llama/Qwen-family models, a preallocated KV cache, rows
joining mid-decode), which `generate_batch` and `LocalClient` use when the model allows.

- Left padding (the HF loop): prompts are left-padded; the attention mask hides the pads and
  `position_ids = cumsum(mask) - 1` so every row's positions start at 0.
- Shared prefill: identical prompts (an RL group, or n > 1) are prefilled once and their
  cache rows copied (the lean engine also shares a common prompt prefix; see `decode_engine`).
- Sampling is inverse-CDF with one uniform per row and step (over the probabilities sorted
  descending for a row with top-k/top-p, in vocabulary order otherwise). A row with a seed
  draws its uniforms from its own generator, so a seeded request reproduces whatever it is
  batched with (up to floating-point differences between batch shapes).
- Logprobs: the log-probability of the sampled token under the temperature-scaled
  softmax over the *full* vocabulary (`log_softmax(logits / T)`), before top-k/top-p/min-p
  truncation and the repetition penalty. That is what a trainer recomputes from its own logits
  (it divides by the same temperature), so importance ratios are exact for the RL defaults
  (top_p=1, top_k=-1, no min_p, no penalty).
  Greedy rows (T=0) report `log_softmax(logits)` (T=1), which is more useful than the
  point mass's 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from workbench.models.kv_cache_name import cache_argument, returned_cache
from workbench.types import SamplingParams


@dataclass
class GenerationRow:
    """One sequence to decode."""

    prompt_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int  # already capped by the model's context length
    seed: int | None = None


@dataclass
class RowResult:
    """What one row produced."""

    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str | None = None  # set when a stop string cut it; filled in for every row at the end
    finish_reason: str = "length"  # "stop" | "length"
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # with `top_logprobs`: per token


@dataclass
class BatchCounters:
    """Work done by one `generate_batch` call (feeds `LocalClient.stats`)."""

    forward_passes: int = 0
    prefill_rows: int = 0


def generate_batch(
    model: Any,
    tokenizer: Any,
    rows: Sequence[GenerationRow],
    *,
    stop_token_ids: set[int],
    pad_token_id: int,
    counters: BatchCounters | None = None,
    tokenizer_lock: AbstractContextManager[Any] | None = None,
    lean: bool | None = None,
) -> list[RowResult]:
    """Decode all `rows` together; returns one result per row, in order.

    `lean`: None = the lean engine (`decode_engine`) when the model supports it, else the
    Hugging Face forward (`generate_batch_hf`); True/False force one (True raises
    ValueError for an unsupported model). Both follow this module's sampling rules and give
    the same tokens for seeded rows (up to floating-point differences).
    `tokenizer_lock` guards `tokenizer.decode` when another thread may use the same
    tokenizer (fast tokenizers can fail with "Already borrowed" under concurrent use).
    """
    from workbench.inference.decode_engine import DecodeEngine
    from workbench.inference.lean_model import LeanModel

    if not rows:
        return []
    lean_model = LeanModel.build(model) if lean is not False else None
    if lean_model is None:
        if lean:
            raise ValueError(f"the lean decode path does not support {type(model).__name__}")
        return generate_batch_hf(
            model,
            tokenizer,
            rows,
            stop_token_ids=stop_token_ids,
            pad_token_id=pad_token_id,
            counters=counters,
            tokenizer_lock=tokenizer_lock,
        )
    engine = DecodeEngine(
        lean_model,
        tokenizer,
        stop_token_ids=stop_token_ids,
        max_rows=len(rows),
        counters=counters,
        tokenizer_lock=tokenizer_lock,
    )
    results: list[RowResult | None] = [None] * len(rows)
    engine.add(rows, list(range(len(rows))))
    while engine.live_rows:
        for index, result in engine.step():
            results[index] = result
    return [r for r in results if r is not None]


def generate_batch_hf(
    model: Any,
    tokenizer: Any,
    rows: Sequence[GenerationRow],
    *,
    stop_token_ids: set[int],
    pad_token_id: int,
    counters: BatchCounters | None = None,
    tokenizer_lock: AbstractContextManager[Any] | None = None,
) -> list[RowResult]:
    """`generate_batch` on the Hugging Face forward with a `DynamicCache`: any causal LM."""
    import torch

    counters = counters or BatchCounters()
    device = next(model.parameters()).device
    results = [RowResult() for _ in rows]
    decoder = _TextStopper(tokenizer, tokenizer_lock or nullcontext())
    stops = [stop_strings(row) for row in rows]
    with torch.inference_mode():
        logits, cache, attention_mask = _prefill(model, rows, pad_token_id, device, counters)
        active = torch.arange(len(rows), device=device)  # batch position -> row index
        next_position = attention_mask.sum(-1)
        params = _RowParams.build(rows, device, logits.shape[-1])
        while True:
            tokens, logprobs = sample_next(
                logits,
                params.temperature,
                params.top_p,
                params.top_k,
                params.uniforms(len(active), device),
                min_p=params.min_p,
                sampling_logits=params.penalized(logits),
            )
            wanted = [top_logprobs_wanted(rows[row]) for row in active.tolist()]
            if any(wanted):
                record_top(logits, params.temperature, wanted, [results[row] for row in active.tolist()])
            params.mark_seen(tokens)
            finished = _record_step(
                rows,
                results,
                active.tolist(),
                tokens.tolist(),
                logprobs.tolist(),
                stop_token_ids,
                decoder,
                stops,
            )
            if finished:
                keep = [i for i, row in enumerate(active.tolist()) if row not in finished]
                if not keep:
                    break
                keep_index = torch.tensor(keep, device=device)
                cache.batch_select_indices(keep_index)
                active, tokens = active[keep_index], tokens[keep_index]
                attention_mask, next_position = attention_mask[keep_index], next_position[keep_index]
                params = params.select(keep)
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(active), 1))], dim=1)
            out = model(
                input_ids=tokens.unsqueeze(1),
                attention_mask=attention_mask,
                position_ids=next_position.unsqueeze(1),
                **cache_argument(cache),
                use_cache=True,
            )
            counters.forward_passes += 1
            cache = returned_cache(out)
            logits = out.logits[:, -1, :].float()
            next_position = next_position + 1
    for result in results:
        if result.text is None:
            result.text = decoder.decode(result.completion_ids)
    return results


def sample_next(
    logits: Any,
    temperature: Any,
    top_p: Any,
    top_k: Any,
    uniforms: Any,
    *,
    min_p: Any = None,
    sampling_logits: Any = None,
    greedy: bool | None = None,
    truncated: bool | None = None,
) -> tuple[Any, Any]:
    """Sample one token per row; returns (tokens, logprobs under log_softmax(logits / T)).

    `temperature` 0 = greedy; `top_k` <= 0 = off; `uniforms` in [0, 1), one per row;
    `min_p` (per row, 0 = off) drops tokens below min_p x the top token's probability;
    `sampling_logits` (the repetition-penalized logits) is what is sampled from, while the
    logprobs stay those of `logits`. `greedy` / `truncated`: whether any row is greedy / uses
    top-k or top-p, when the caller already knows (a decode loop tracks it per row): False skips
    those branches' ops, which at small batch sizes cost more than the sampling itself; None =
    find out from the tensors. Either way the tokens are the same.
    """
    import torch

    vocab = logits.shape[-1]
    greedy_rows = None if greedy is False else temperature <= 0
    if greedy_rows is None:
        safe_temperature = temperature
    else:
        safe_temperature = torch.where(greedy_rows, torch.ones_like(temperature), temperature)
    logprobs_all = torch.log_softmax(logits / safe_temperature.unsqueeze(1), dim=-1)
    if sampling_logits is None:
        sampling_logits = logits
        probs = logprobs_all.exp()
    else:
        probs = torch.softmax(sampling_logits / safe_temperature.unsqueeze(1), dim=-1)
    if min_p is not None:
        probs = probs * (probs >= min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values)
    truncated_rows = None
    if truncated is not False:
        top_k = torch.where(top_k <= 0, torch.full_like(top_k, vocab), top_k.clamp(max=vocab))
        truncated_rows = (top_k < vocab) | (top_p < 1.0)
        if not bool(truncated_rows.any()):
            truncated_rows = None
    if truncated_rows is None:
        tokens = _inverse_cdf(probs, uniforms)
    else:
        # Rows with top-k/top-p draw from the probabilities sorted descending (then truncated),
        # the others from vocabulary order, whatever the rest of the batch does: a seeded row
        # samples the same token alone or next to rows with other settings.
        ordered, order = probs.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
        # Keep the k most likely tokens, and of those the smallest prefix whose mass reaches
        # top_p (a token stays if the mass *before* it is still below top_p: the top one always).
        keep = (ranks < top_k.unsqueeze(1)) & ((ordered.cumsum(-1) - ordered) < top_p.unsqueeze(1))
        keep[:, 0] = True  # top_p <= 0 still leaves the most likely token
        tokens = order.gather(1, _inverse_cdf(ordered * keep, uniforms).unsqueeze(1)).squeeze(1)
        if not bool(truncated_rows.all()):
            tokens = torch.where(truncated_rows, tokens, _inverse_cdf(probs, uniforms))
    if greedy_rows is not None:
        tokens = torch.where(greedy_rows, sampling_logits.argmax(-1), tokens)
    return tokens, logprobs_all.gather(1, tokens.unsqueeze(1)).squeeze(1)


MAX_TOP_LOGPROBS = 20  # as the OpenAI API and vLLM's default cap


def top_logprobs_wanted(row: GenerationRow) -> int:
    """How many alternatives per token the row's request asked for (`top_logprobs`, 0 = none)."""
    value = row.sampling.extra.get("top_logprobs") or 0
    return min(int(value), MAX_TOP_LOGPROBS) if isinstance(value, int) else 0


def record_top(logits: Any, temperature: Any, wanted: list[int], results: list[RowResult]) -> None:
    """Append each asking row's k most likely (id, logprob) under log_softmax(logits / T), the
    distribution its sampled token's logprob comes from. One extra vocabulary pass, only for
    batches where some row asked."""
    import torch

    k = max(wanted)
    safe = torch.where(temperature <= 0, torch.ones_like(temperature), temperature)
    values, ids = torch.log_softmax(logits / safe.unsqueeze(1), dim=-1).topk(k, dim=-1)
    for row, (want, result) in enumerate(zip(wanted, results)):
        if want:
            result.top.append(list(zip(ids[row, :want].tolist(), values[row, :want].tolist())))


def _inverse_cdf(probs: Any, uniforms: Any) -> Any:
    """Per row, the index where the cumulative (unnormalized) mass first exceeds u x total."""
    import torch

    cdf = probs.cumsum(-1)
    targets = (uniforms * cdf[:, -1]).unsqueeze(1)
    return torch.searchsorted(cdf, targets, right=True).clamp(max=probs.shape[-1] - 1).squeeze(1)


def penalize(logits: Any, seen: Any, penalty: Any) -> Any:
    """Repetition penalty: a positive logit of a seen token divided by the row's penalty, a
    negative one multiplied (transformers' and vLLM's rule)."""
    import torch

    penalty = penalty.unsqueeze(1)
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


def _prefill(
    model: Any, rows: Sequence[GenerationRow], pad_token_id: int, device: Any, counters: BatchCounters
) -> tuple[Any, Any, Any]:
    """Run the prompts (each distinct prompt once); returns last logits, cache and mask per row."""
    import torch
    from transformers import DynamicCache

    unique: dict[tuple[int, ...], int] = {}
    row_to_unique = [unique.setdefault(tuple(row.prompt_ids), len(unique)) for row in rows]
    prompts = list(unique)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        input_ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[i, width - len(prompt) :] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        **cache_argument(cache),
        use_cache=True,
        logits_to_keep=1,  # only the last position's logits are needed
    )
    counters.forward_passes += 1
    counters.prefill_rows += len(prompts)
    cache = returned_cache(out)
    logits = out.logits[:, -1, :].float()
    if row_to_unique != list(range(len(prompts))):
        index = torch.tensor(row_to_unique, device=device)
        cache.batch_select_indices(index)
        logits, attention_mask = logits[index], attention_mask[index]
    return logits, cache, attention_mask


@dataclass
class _RowParams:
    """Per-row sampling tensors for the rows still in the batch."""

    temperature: Any
    top_p: Any
    top_k: Any
    generators: list[Any]  # a torch.Generator per seeded row, None otherwise
    min_p: Any = None  # None when no row uses it
    repetition_penalty: Any = None  # None when no row uses it; then `seen` is None too
    seen: Any = None  # [rows, vocab] bool: tokens in the prompt or sampled so far

    @classmethod
    def build(cls, rows: Sequence[GenerationRow], device: Any, vocab: int) -> _RowParams:
        import torch

        generators = []
        for row in rows:
            generator = None
            if row.seed is not None:
                generator = torch.Generator().manual_seed(row.seed)
            generators.append(generator)
        min_p = [float(r.sampling.extra.get("min_p") or 0.0) for r in rows]
        penalty = [float(r.sampling.extra.get("repetition_penalty") or 1.0) for r in rows]
        params = cls(
            temperature=torch.tensor([float(r.sampling.temperature) for r in rows], device=device),
            top_p=torch.tensor([float(r.sampling.top_p) for r in rows], device=device),
            top_k=torch.tensor([int(r.sampling.top_k) for r in rows], device=device),
            generators=generators,
            min_p=torch.tensor(min_p, device=device) if any(min_p) else None,
        )
        if any(p != 1.0 for p in penalty):
            params.repetition_penalty = torch.tensor(penalty, device=device)
            params.seen = torch.zeros((len(rows), vocab), dtype=torch.bool, device=device)
            for i, row in enumerate(rows):  # vLLM's rule: prompt tokens count as repeated too
                ids = torch.tensor(
                    [t for t in row.prompt_ids if 0 <= t < vocab], dtype=torch.long, device=device
                )
                params.seen[i, ids] = True
        return params

    def select(self, keep: list[int]) -> _RowParams:
        import torch

        index = torch.tensor(keep, device=self.temperature.device)
        pick = lambda t: None if t is None else t[index]
        return _RowParams(
            self.temperature[index],
            self.top_p[index],
            self.top_k[index],
            [self.generators[i] for i in keep],
            pick(self.min_p),
            pick(self.repetition_penalty),
            pick(self.seen),
        )

    def penalized(self, logits: Any) -> Any:
        """The logits to sample from (see `penalize`); None when no row penalizes."""
        if self.repetition_penalty is None:
            return None
        return penalize(logits, self.seen, self.repetition_penalty)

    def mark_seen(self, tokens: Any) -> None:
        import torch

        if self.seen is not None:
            self.seen[torch.arange(len(tokens), device=tokens.device), tokens] = True

    def uniforms(self, count: int, device: Any) -> Any:
        import torch

        values = torch.rand(count)
        for i, generator in enumerate(self.generators):
            if generator is not None:
                values[i] = torch.rand(1, generator=generator)[0]
        return values.to(device)


class _TextStopper:
    """Detects stop strings in decoded text, decoding only a short tail per step."""

    def __init__(self, tokenizer: Any, lock: AbstractContextManager[Any]) -> None:
        self.tokenizer = tokenizer
        self.lock = lock

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def check(self, stops: list[str], ids: list[int]) -> str | None:
        """The trimmed text if one of `stops` has appeared, else None."""
        if not stops:
            return None
        # A stop string of c characters spans at most 4c byte-tokens (UTF-8): a safe tail window.
        window = 4 * max(len(s) for s in stops) + 8
        tail = self.decode(ids[-window:])
        if not any(stop in tail for stop in stops):
            return None
        text = self.decode(ids)
        cut = min((i for i in (text.find(stop) for stop in stops) if i >= 0), default=-1)
        return text[:cut] if cut >= 0 else None


def stop_strings(row: GenerationRow) -> list[str]:
    """The row's non-empty stop strings."""
    return [s for s in row.sampling.stop if s]


def record_token(
    row: GenerationRow,
    result: RowResult,
    token: int,
    logprob: float,
    stop_token_ids: set[int],
    stopper: _TextStopper,
    stops: list[str],
) -> bool:
    """Append one sampled token to `result`; True when the row is finished."""
    result.completion_ids.append(token)
    result.logprobs.append(logprob)
    if token in stop_token_ids:
        result.finish_reason = "stop"
        return True
    text = stopper.check(stops, result.completion_ids) if stops else None
    if text is not None:
        result.text, result.finish_reason = text, "stop"
        return True
    if len(result.completion_ids) >= row.max_new_tokens:
        result.finish_reason = "length"
        return True
    return False


def _record_step(
    rows: Sequence[GenerationRow],
    results: list[RowResult],
    active: list[int],
    tokens: list[int],
    logprobs: list[float],
    stop_token_ids: set[int],
    stopper: _TextStopper,
    stops: list[list[str]],
) -> set[int]:
    """Append each active row's new token; return the rows that finished this step."""
    return {
        row
        for row, token, logprob in zip(active, tokens, logprobs)
        if record_token(rows[row], results[row], token, logprob, stop_token_ids, stopper, stops[row])
    }
