"""`LocalClient`: a Hugging Face causal LM in-process, with continuous batching.

Concurrent `chat` calls (the engine runs many rollouts at once) are queued; one background
worker thread takes everything pending (up to `max_batch_size` rows; a request with n > 1
brings n rows) and decodes it as one batch with a KV cache, handing each result back to its
event loop with `call_soon_threadsafe` as soon as that request's rows are done. Rows with
different sampling settings share a batch. On the lean engine (`decode_engine`: Llama/Qwen
family models) the batch is a running session: requests arriving meanwhile join it at the
next step boundary while rows are free, and finished rows leave it. Other models decode one
batch at a time on the Hugging Face forward (`generation.generate_batch_hf`); requests
arriving meanwhile form the next batch.

Weight changes (runtime LoRA adapters, a full-weights reload) happen between batches under
`exclusive_weights()`, which also stops the worker from starting a new batch (or letting
requests join a running one) while a change waits, so an update is never starved by a busy queue. A batch holds requests for one
adapter version only (see `adapters`): each request runs on the adapter version that was
current when it was accepted, even if the name is reloaded or unloaded before it runs.

The model runs in a thread, not the event loop, so the loop stays responsive (reward
functions, HTTP, the TUI's file writes) while tokens are generated. torch/transformers are
imported when a client is created, never when this module is imported.

Semantics (as in vLLM/OpenAI where they define them): a stop string ends the generation and
is cut from the text, but `tokens.completion_ids`/logprobs keep every sampled token (RL trains
on what was sampled); an EOS / `<|im_end|>` token is kept in the ids and dropped from the
text. Logprobs: see `generation` (temperature-scaled, before top-k/top-p/min-p and the
repetition penalty). Of `sampling.extra`, `min_p` and `repetition_penalty` are honoured (vLLM's
meaning); other server-specific knobs are ignored here.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from workbench.errors import ContextLengthError, InferenceError
from workbench.inference.adapters import AdapterError, AdapterSet
from workbench.inference.chat_tokens import continuation_ids, prompt_ids
from workbench.inference.decode_engine import DecodeEngine
from workbench.inference.generation import BatchCounters, GenerationRow, RowResult, generate_batch_hf
from workbench.inference.lean_model import LeanModel
from workbench.inference.passing_thread import in_passing_thread, settle
from workbench.inference.prompt_cache import RenderedPrompts
from workbench.inference.reasoning import (
    prompt_ends_in_thinking,
    reasoning_message,
    resolve_reasoning_parser,
    think_token_ids,
)
from workbench.inference.tool_parsing import parse_hermes_tool_calls
from workbench.types import Completion, Messages, SamplingParams, TokenData

T = TypeVar("T")


@dataclass
class LocalClientStats:
    """Counters for tests, benchmarks and the run log."""

    requests: int = 0
    rows: int = 0  # sequences decoded (a request with n=3 is 3 rows)
    batches: int = (
        0  # decode batches run (< requests when batching works); a group joining a running one counts
    )
    forward_passes: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    max_batch_rows: int = 0  # most rows decoded together


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    parse_tools: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[Completion]]
    adapter_version: str | None = None  # pinned LoRA version; None = the base model
    rows: int = field(init=False)

    def __post_init__(self) -> None:
        self.rows = max(1, self.sampling.n)


class LocalClient:
    """In-process `Client` for any `AutoModelForCausalLM` (the tiny model, a hub id, a folder)."""

    # Continue multi-turn rollouts by token ids (`continue_chat`) instead of re-rendering the
    # conversation: set by a trainer whose trajectory strategy is "interleaved".
    tokens_in: bool = False
    # Decode on the lean engine (static KV cache, continuous batching; `decode_engine`) when the
    # model supports it. False: every batch on the Hugging Face forward (`generate_batch_hf`).
    lean_decode: bool = True

    def __init__(
        self,
        model_path: str | Path,
        *,
        model_name: str | None = None,
        max_batch_size: int = 64,
        device: str = "cpu",
        dtype: str = "auto",
        reasoning_parser: str | None = "auto",
        _loaded: tuple[Any, Any] | None = None,
    ) -> None:
        """Load the model and tokenizer. `dtype`: "auto" (float32 on CPU, the checkpoint's
        dtype elsewhere) or a torch dtype name such as "bfloat16". `reasoning_parser`: split
        `<think>…</think>` into `reasoning_content` ("qwen3", "deepseek_r1", None; "auto" = qwen3
        when the vocabulary has both tags as tokens; see `inference.reasoning`)."""
        self.model = model_name or str(model_path)
        self.max_batch_size = max(1, max_batch_size)
        self.stats = LocalClientStats()
        self._hf_model, self._tokenizer = _loaded or _load(model_path, device, dtype)
        self.reasoning_parser = resolve_reasoning_parser(reasoning_parser, self._tokenizer)
        # Ids to tell whether a prompt leaves a think block open (the template opened it).
        self._think_ids = think_token_ids(self._tokenizer) if self.reasoning_parser else None
        # Hold this to change weights between batches (a colocated trainer syncing the policy).
        self.weights_lock = threading.Lock()
        # The loop thread encodes prompts while the worker decodes: one tokenizer user at a time.
        self._tokenizer_lock = threading.Lock()
        self._rendered = RenderedPrompts(self._tokenizer)  # a group's rollouts render their prompt once
        self._max_positions = _max_positions(self._hf_model)
        self._stop_token_ids = _stop_token_ids(self._hf_model, self._tokenizer)
        pad = self._tokenizer.pad_token_id
        self._pad_token_id = pad if pad is not None else min(self._stop_token_ids, default=0)
        self._staged: list[_Request] = []  # queued this loop turn, not yet visible to the worker
        self._pending: deque[_Request] = deque()
        self._wakeup = threading.Condition()
        self._closed = False
        self._worker: threading.Thread | None = None
        self._waiting_updates = 0  # exclusive_weights() callers waiting: the worker yields to them
        self._jobs: deque[tuple[Callable[[], Any], Future[Any]]] = deque()  # run_between_batches
        self._adapters: AdapterSet | None = None  # created by the first load_adapter
        self._engine: DecodeEngine | None = None  # the last decode session's, for its buffers
        self._lean: LeanModel | None = None  # the last session's lean forward (`_lean_model`)

    @classmethod
    def from_model(
        cls,
        model: Any,
        tokenizer: Any,
        *,
        model_name: str,
        max_batch_size: int = 64,
        reasoning_parser: str | None = "auto",
    ) -> LocalClient:
        """Wrap an already loaded model (e.g. the trainer's policy) without copying it."""
        return cls(
            model_name,
            model_name=model_name,
            max_batch_size=max_batch_size,
            reasoning_parser=reasoning_parser,
            _loaded=(model, tokenizer),
        )

    def token_to_str(self, token_id: int) -> str:
        """One token's text, as vLLM writes it in `logprobs.content[].token` (a byte-level piece
        that is not whole UTF-8 on its own decodes with replacement characters, as there)."""
        with self._tokenizer_lock:
            return str(self._tokenizer.decode([token_id]))

    def encode_text(self, text: str) -> list[int]:
        """Token ids of plain `text` (no chat template), with the tokenizer's special tokens
        (a BOS where the model has one), as vLLM tokenizes a `/v1/completions` prompt."""
        with self._tokenizer_lock:
            return list(self._tokenizer.encode(text, add_special_tokens=True))

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_positions(self) -> int:
        """Longest sequence (prompt + completion) the model accepts."""
        return self._max_positions

    @property
    def adapters(self) -> dict[str, str]:
        """Runtime LoRA adapters now loaded: name -> folder."""
        return self._adapters.names if self._adapters is not None else {}

    @contextmanager
    def exclusive_weights(self) -> Iterator[None]:
        """Hold the model between batches to change its weights. The worker finishes its
        current batch and starts no new one until the block ends."""
        with self._wakeup:
            self._waiting_updates += 1
        try:
            with self.weights_lock:
                try:
                    yield
                finally:  # weights may have changed by any means: the next session builds anew
                    self._lean = None
        finally:
            with self._wakeup:
                self._waiting_updates -= 1
                self._wakeup.notify_all()

    def load_adapter(self, name: str, path: str | Path, *, max_rank: int | None = None) -> None:
        """Load the LoRA adapter folder `path` as `name`, replacing one of that name
        (blocking: call it from a thread). Raises `AdapterError`; nothing changes on failure."""
        with self.exclusive_weights():
            if self._adapters is None:
                self._adapters = AdapterSet(self._hf_model)
            adapters = self._adapters
            self._off_decoding(lambda: adapters.load(name, path, max_rank=max_rank))

    def unload_adapter(self, name: str) -> None:
        """Remove adapter `name`; requests already accepted for it finish first. AdapterError if unknown."""
        if self._adapters is None:
            raise AdapterError(f"The lora adapter '{name}' cannot be found.", status=404)
        adapters = self._adapters
        with self.exclusive_weights():
            self._off_decoding(lambda: adapters.unload(name))

    def update_weights(self, weight_dir: str | Path) -> int:
        """Replace the base weights with those of model folder `weight_dir`, in place (blocking).
        Raises `WeightReloadError` with the model unchanged when the folder does not fit."""
        from workbench.inference.weight_reload import load_weights_in_place

        with self.exclusive_weights():
            return self._off_decoding(lambda: load_weights_in_place(self._hf_model, weight_dir))

    def _off_decoding(self, work: Callable[[], T]) -> T:
        """A weight change's torch work, in a passing thread on the CPU: callers call from a
        long-lived thread (an executor's), where a thread team would stay and slow the decode
        thread's every step (`passing_thread`)."""
        device = next(self._hf_model.parameters()).device.type
        return in_passing_thread(work, device=device)

    def render_prompt_ids(self, messages: Messages, tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of `messages` under the chat template, ready for the assistant's turn."""
        key = self._rendered.key(messages, tools or None)
        ids = self._rendered.get(key)
        if ids is not None:
            return ids
        with self._tokenizer_lock:
            ids = prompt_ids(self._tokenizer, messages, tools)
        self._rendered.put(key, ids)
        return ids

    async def chat(
        self,
        messages: Messages,
        *,
        sampling: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
        adapter: str | None = None,
    ) -> list[Completion]:
        """Return `sampling.n` completions for `messages` (see `Client.chat`), generated with
        the runtime LoRA adapter `adapter` when given (else the base model)."""
        try:
            prompt_ids = self.render_prompt_ids(messages, tools)
        except Exception as exc:  # a template error is the caller's input, not a transient fault
            raise InferenceError(f"could not apply the chat template: {exc}", transient=False) from exc
        return await self.complete_ids(
            prompt_ids, sampling=sampling, parse_tools=bool(tools), adapter=adapter
        )

    async def continue_chat(
        self,
        previous: TokenData,
        new_messages: Messages,
        *,
        sampling: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
        adapter: str | None = None,
    ) -> list[Completion]:
        """Tokens in: the next turn after `previous` (a turn's prompt ids + the ids it sampled),
        with the environment's `new_messages` rendered by the chat template (see chat_tokens)."""
        try:
            with self._tokenizer_lock:
                bridge = continuation_ids(self._tokenizer, previous.completion_ids, new_messages, tools)
        except Exception as exc:  # a template error is the caller's input, not a transient fault
            raise InferenceError(f"could not apply the chat template: {exc}", transient=False) from exc
        prompt_ids = previous.prompt_ids + previous.completion_ids + bridge
        return await self.complete_ids(
            prompt_ids, sampling=sampling, parse_tools=bool(tools), adapter=adapter
        )

    async def complete_ids(
        self,
        prompt_ids: list[int],
        *,
        sampling: SamplingParams,
        parse_tools: bool = False,
        adapter: str | None = None,
    ) -> list[Completion]:
        """Tokens-in form of `chat`: continue `prompt_ids` as given (multi-turn RL never re-tokenizes)."""
        if self._closed:
            raise InferenceError("LocalClient is closed", transient=False)
        if not prompt_ids:
            raise InferenceError("empty prompt", transient=False)
        if len(prompt_ids) >= self._max_positions:
            raise ContextLengthError(
                f"prompt is {len(prompt_ids)} tokens; {self.model}'s maximum context length is "
                f"{self._max_positions} (prompt + completion)"
            )
        version = None
        if adapter is not None:
            if self._adapters is None:
                raise InferenceError(f"The model `{adapter}` does not exist.", transient=False, status=404)
            version = self._adapters.acquire(adapter)  # AdapterError (404) when not loaded
        loop = asyncio.get_running_loop()
        request = _Request(
            prompt_ids=list(prompt_ids),
            sampling=sampling,
            max_new_tokens=max(1, min(sampling.max_tokens, self._max_positions - len(prompt_ids))),
            parse_tools=parse_tools,
            loop=loop,
            future=loop.create_future(),
            adapter_version=version,
        )
        with self._wakeup:
            self._staged.append(request)
        # Release to the worker on the next loop turn, not now: requests started in the same
        # turn (asyncio.gather of many rollouts) are all staged by then and form one batch.
        loop.call_soon(self._release_staged)
        return await request.future

    async def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """log p(ids[t] | ids[:t]) for every t (0.0 for the first, which has no context), at
        temperature 1: what a teacher gives for distillation (`/v1/completions` with echo)."""
        if self._closed:
            raise InferenceError("LocalClient is closed", transient=False)
        if not ids or len(ids) > self._max_positions:
            raise InferenceError(
                f"cannot score {len(ids)} tokens (1 to {self._max_positions})", transient=False
            )
        # the executor's thread lives on: the scoring's team must not (`_off_decoding`)
        return await asyncio.to_thread(self._off_decoding, lambda: self._score(list(ids)))

    def _score(self, ids: list[int]) -> list[float]:
        import torch

        # exclusive_weights, not the bare lock: a running decode session stops admitting and drains.
        with self.exclusive_weights(), torch.inference_mode():
            model = self._hf_model
            input_ids = torch.tensor([ids], device=next(model.parameters()).device)
            logits = model(input_ids=input_ids).logits[0, :-1].float()
            picked = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        return [0.0, *picked.tolist()]

    def _release_staged(self) -> None:
        with self._wakeup:
            if self._staged:
                self._pending.extend(self._staged)
                self._staged.clear()
                self._ensure_worker()
                self._wakeup.notify()

    async def close(self) -> None:
        """Stop the worker (after its current batch), fail queued requests, drop the model."""
        with self._wakeup:
            self._closed = True
            self._wakeup.notify_all()
            pending = self._staged + list(self._pending)
            self._staged.clear()
            self._pending.clear()
            jobs, self._jobs = list(self._jobs), deque()
            worker, self._worker = self._worker, None
        for _, done in jobs:
            done.set_exception(InferenceError("LocalClient closed", transient=False))
        for request in pending:
            _deliver(request, InferenceError("LocalClient closed", transient=False))
            self._release(request)
        if worker is not None:
            await asyncio.to_thread(worker.join)
        self._engine = self._lean = None  # its KV cache and buffers; the fused weight copies

    # -- worker thread -------------------------------------------------------------------

    def run_between_batches(self, work: Callable[[], T]) -> T:
        """`work()` (torch work: a colocated trainer's optimizer step) run on the decode thread
        between batches, blocking until it returns; its exception is raised here. Decoding and
        training then share one thread, so one OpenMP team and one malloc arena: run in a thread
        of its own, the step ran beside the decode thread's idle team, and GNU OpenMP, with more
        threads than cores, waits on a wake-up at every parallel op (`passing_thread`). SmolLM2's
        RL forward/backward (batch 16, bfloat16, 2 cores): 2.1 s there, 1.5 s alone."""
        done: Future[T] = Future()
        with self._wakeup:
            if self._closed:
                raise InferenceError("LocalClient is closed", transient=False)
            self._jobs.append((work, done))
            self._ensure_worker()
            self._wakeup.notify_all()
        return done.result()

    def _ensure_worker(self) -> None:
        """(Holding `_wakeup`.) Start the worker unless it runs."""
        if self._worker is None and not self._closed:
            self._worker = threading.Thread(target=self._work, name="local-client-worker", daemon=True)
            self._worker.start()

    def _work(self) -> None:
        """Run queued `run_between_batches` work, else decode the pending requests, until the
        client closes. The thread lives as long as the client: its OpenMP team
        and its malloc arena serve every batch and every step run here. (Ending it when idle, so
        that a colocated trainer's step in another thread would not run beside its idle team,
        made the two threads' memory grow apart: SmolLM2's real-model RL, batch 128, peaked at
        ~17 GB instead of ~11.5 GB, and one run was killed for memory.)"""
        while True:
            with self._wakeup:
                while ((not self._pending and not self._jobs) or self._waiting_updates) and not self._closed:
                    self._wakeup.wait()
                if self._closed:
                    return
                job = self._jobs.popleft() if self._jobs else None
                batch, cancelled = self._take_batch() if job is None else ([], [])
            if job is not None:
                settle(*job)
                continue
            for request in cancelled:
                self._release(request)
            if batch:
                self._run_batch(batch)

    def _take_batch(self) -> tuple[list[_Request], list[_Request]]:
        """Pending requests for the oldest request's adapter version, in order, up to
        `max_batch_size` rows (always at least one); others keep their place in the queue.
        Also returns the cancelled requests dropped on the way."""
        batch: list[_Request] = []
        cancelled: list[_Request] = []
        skipped: deque[_Request] = deque()
        rows = 0
        while self._pending:
            request = self._pending.popleft()
            if request.future.cancelled():
                cancelled.append(request)
                continue
            if batch and request.adapter_version != batch[0].adapter_version:
                skipped.append(request)
                continue
            if batch and rows + request.rows > self.max_batch_size:
                self._pending.appendleft(request)
                break
            batch.append(request)
            rows += request.rows
        skipped.extend(self._pending)
        self._pending = skipped
        return batch, cancelled

    def _release(self, request: _Request) -> None:
        if request.adapter_version is not None and self._adapters is not None:
            self._adapters.release(request.adapter_version)

    def _run_batch(self, batch: list[_Request]) -> None:
        """Decode `batch`: as a continuous session on the lean engine when the model supports
        it (requests may join it), else as one `generate_batch_hf` call."""
        with self.weights_lock:
            lean = self._lean_model() if self.lean_decode else None
            if lean is not None:
                self._run_session(lean, batch)
                return
            try:
                self._run_hf_batch(batch)
            except Exception as exc:  # every waiter must hear about the failure
                for request in batch:
                    _deliver(request, _generation_error(exc))

    def _lean_model(self) -> LeanModel | None:
        """(Weights lock held.) The lean forward over the model as it is now, or None when the
        model has no lean path: the last session's while it still reads the model's current
        modules and no `exclusive_weights()` block ran since, else a new one. Its fused copies are
        checked at a session's first forward, so in-place updates in between (a colocated
        trainer's optimizer step on the adapters) re-copy what moved; a weight change by any
        other means (`.data`, inference tensors) must be made under `exclusive_weights()`.
        Building one copies every fused base weight: in a colocated SmolLM2 RL step (LoRA,
        bfloat16) that was ~0.25 s of a ~1.8 s generation, for weights that had not changed."""
        lean = self._lean  # None after an exclusive_weights() block
        if lean is None or not lean.reads(self._hf_model):
            lean = self._lean = LeanModel.build(self._hf_model)
        return lean

    def _run_hf_batch(self, batch: list[_Request]) -> None:
        """The whole batch in one `generate_batch_hf` call (weights lock held)."""
        rows = [row for request in batch for row in _generation_rows(request)]
        counters = BatchCounters()
        try:
            if self._adapters is not None:
                self._adapters.activate(batch[0].adapter_version)
            results = generate_batch_hf(
                self._hf_model,
                self._tokenizer,
                rows,
                stop_token_ids=self._stop_token_ids,
                pad_token_id=self._pad_token_id,
                counters=counters,
                tokenizer_lock=self._tokenizer_lock,
            )
        finally:
            # Before anyone hears back, so a caller never sees a stale pin or version.
            self._finish(batch)
        self._count_batch(batch, len(rows))
        self.stats.forward_passes += counters.forward_passes
        offset = 0
        for request in batch:
            own = results[offset : offset + request.rows]
            offset += request.rows
            self._complete(request, own)

    def _run_session(self, model: LeanModel, batch: list[_Request]) -> None:
        """Continuous batching (weights lock held): decode `batch` on the lean engine; at every
        step boundary, pending requests for the same adapter version join while rows are free,
        and each request is answered as soon as its own rows finish. The session ends when
        no row is left; it admits nobody once a weight change waits or the client closes."""
        version = batch[0].adapter_version
        engine = DecodeEngine(
            model,
            self._tokenizer,
            stop_token_ids=self._stop_token_ids,
            max_rows=max(self.max_batch_size, sum(r.rows for r in batch)),
            tokenizer_lock=self._tokenizer_lock,
            reuse=self._engine,
        )
        self._engine = engine  # its buffers serve the next session
        running: dict[int, tuple[_Request, list[RowResult | None]]] = {
            id(r): (r, [None] * r.rows) for r in batch
        }
        try:
            if self._adapters is not None:
                self._adapters.activate(version)
            self._join(engine, batch)
            while engine.live_rows:
                for (key, choice), result in engine.step():
                    request, results = running[key]
                    results[choice] = result
                    if all(r is not None for r in results):
                        del running[key]
                        self._finish([request])
                        self._complete(request, [r for r in results if r is not None])
                self.stats.forward_passes += engine.counters.forward_passes
                engine.counters.forward_passes = 0
                free = self.max_batch_size - engine.live_rows
                joiners = self._take_joiners(version, free) if free > 0 else []
                running.update((id(r), (r, [None] * r.rows)) for r in joiners)
                self._join(engine, joiners)
        except Exception as exc:  # every waiter must hear about the failure
            unanswered = [request for request, _ in running.values()]
            self._finish(unanswered)
            for request in unanswered:
                _deliver(request, _generation_error(exc))

    def _join(self, engine: DecodeEngine, requests: list[_Request]) -> None:
        """Prefill `requests` into the session and count them as one batch."""
        if not requests:
            return
        rows: list[GenerationRow] = []
        tags: list[tuple[int, int]] = []
        for request in requests:
            own = _generation_rows(request)
            rows.extend(own)
            tags.extend((id(request), choice) for choice in range(len(own)))
        engine.add(rows, tags)
        self._count_batch(requests, len(rows), live_rows=engine.live_rows)
        self.stats.forward_passes += engine.counters.forward_passes
        engine.counters.forward_passes = 0

    def _take_joiners(self, version: str | None, free_rows: int) -> list[_Request]:
        """Requests that may join a running session: from the head of the queue, in order, while
        they want the session's adapter version (an older request for another version waits at
        the head, so it is served as soon as this session drains) and fit in `free_rows`."""
        joiners: list[_Request] = []
        cancelled: list[_Request] = []
        with self._wakeup:
            if self._closed or self._waiting_updates:
                return []
            while self._pending:
                request = self._pending[0]
                if request.future.cancelled():
                    cancelled.append(self._pending.popleft())
                    continue
                if request.adapter_version != version or request.rows > free_rows:
                    break
                joiners.append(self._pending.popleft())
                free_rows -= request.rows
        for request in cancelled:
            self._release(request)
        return joiners

    def _count_batch(self, batch: list[_Request], rows: int, *, live_rows: int | None = None) -> None:
        self.stats.batches += 1
        self.stats.requests += len(batch)
        self.stats.rows += rows
        self.stats.max_batch_rows = max(self.stats.max_batch_rows, rows if live_rows is None else live_rows)

    def _complete(self, request: _Request, results: list[RowResult]) -> None:
        """Count and deliver a finished request."""
        try:
            completions = [self._to_completion(request, result) for result in results]
        except Exception as exc:  # the caller hears about it; the batch goes on
            _deliver(request, _generation_error(exc))
            return
        self.stats.prompt_tokens += len(request.prompt_ids) * len(results)
        self.stats.completion_tokens += sum(len(r.completion_ids) for r in results)
        _deliver(request, completions)

    def _finish(self, batch: list[_Request]) -> None:
        """Unpin the batch's adapter version; drop versions nothing uses any more.
        Called with the weights lock held."""
        if self._adapters is None or not batch or batch[0].adapter_version is None:
            return
        for request in batch:
            self._release(request)
        self._adapters.reap()

    def _to_completion(self, request: _Request, result: RowResult) -> Completion:
        # Thinking first, then tool calls from the answer only (as vLLM): a call the model
        # merely considered inside <think> is not made.
        prompt_open = prompt_ends_in_thinking(request.prompt_ids, self._think_ids)
        message = reasoning_message(result.text or "", self.reasoning_parser, prompt_open=prompt_open)
        finish_reason = result.finish_reason
        if request.parse_tools:
            content, tool_calls = parse_hermes_tool_calls(message["content"])
            if tool_calls:
                message.update(content=content, tool_calls=tool_calls)
                finish_reason = "tool_calls"
        return Completion(
            message=message,
            finish_reason=finish_reason,
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(result.completion_ids),
            tokens=TokenData(
                prompt_ids=list(request.prompt_ids),
                completion_ids=result.completion_ids,
                completion_logprobs=result.logprobs,
                top_logprobs=result.top or None,
            ),
        )


def _generation_error(exc: Exception) -> InferenceError:
    if isinstance(exc, InferenceError):
        return exc
    return InferenceError(f"local generation failed: {type(exc).__name__}: {exc}", transient=False)


def _generation_rows(request: _Request) -> list[GenerationRow]:
    """The request's rows: choice i of a seeded request gets its own derived seed."""
    rows = []
    for choice in range(request.rows):
        seed = None if request.sampling.seed is None else request.sampling.seed * 1_000_003 + choice
        rows.append(GenerationRow(request.prompt_ids, request.sampling, request.max_new_tokens, seed))
    return rows


def _deliver(request: _Request, value: list[Completion] | BaseException) -> None:
    """Resolve the request's future on its own event loop (we are on the worker thread)."""

    def resolve() -> None:
        if request.future.done():
            return
        if isinstance(value, BaseException):
            request.future.set_exception(value)
        else:
            request.future.set_result(value)

    try:
        request.loop.call_soon_threadsafe(resolve)
    except RuntimeError:
        pass  # the caller's loop is closed: nobody is waiting any more


def _load(model_path: str | Path, device: str, dtype: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype == "auto":
        torch_dtype: Any = torch.float32 if device == "cpu" else "auto"  # CPU kernels want fp32
    else:
        torch_dtype = getattr(torch, dtype)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch_dtype)
    except (OSError, ValueError) as exc:
        raise InferenceError(f"could not load model {model_path}: {exc}", transient=False) from exc
    # transformers wraps `to` with functools.wraps; typeshed's _Wrapped does not bind `self` of a method.
    model.to(device)  # type: ignore[arg-type]
    model.eval()
    return model, tokenizer


def _max_positions(model: Any) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1 << 20  # no declared limit (e.g. pure RoPE without a config value)


def _stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """EOS ids from the generation config, the tokenizer, and `<|im_end|>` if the vocab has it."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return ids
