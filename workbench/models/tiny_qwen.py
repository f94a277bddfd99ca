"""Build `tiny-qwen`: a test model with Qwen3's architecture and Qwen's real vocabulary.

Where the byte-level `tiny` model stands in for "some chat model", `tiny-qwen` stands in for
Qwen/Qwen3-0.6B itself: `Qwen3ForCausalLM` (q/k norms, GQA, tied embeddings, 151,936 rows),
Qwen's BPE and added tokens at their real ids, a chat template with Qwen3's behaviour (thinking
kept only after the last user query, Hermes tools), saved with `save_pretrained`, so code
paths that depend on a real tokenizer (multi-byte tokens, `<think>`, tool-call tokens, BPE
merges across turns) and vLLM's loader are exercised offline in seconds. Only the width and
depth are tiny.

Training reuses the tiny model's SFT loop (`tiny.train_sft`) on demonstrations with short
`<think>` blocks, just long enough that the model emits the formats; its scores are low.
A 152k-way softmax would be nearly all of a step's time, so the embedding rows of ids the
demonstrations never use (all but a few thousand) are held at zero: their logits are exactly
0, the softmax over them is a constant, and training runs on a compact copy of the model with
only the used rows (`CompactVocabularyLoss`, at trained positions only). Widened back to the
full vocabulary (`widen_vocabulary`), the model's loss is exactly the training loss.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.models import qwen_vocab, sft_data, tiny
from workbench.models.sft_data import IGNORE_INDEX, Tools
from workbench.models.tiny import ProgressFn, TinyModelSpec
from workbench.types import Messages

# A demonstration: a conversation and the tools its system turn lists (None: no tools).
Demonstration = tuple[Messages, Tools]


@dataclass(frozen=True)
class TinyQwenSpec(TinyModelSpec):
    """Architecture and training of tiny-qwen (all part of the fingerprint)."""

    # Width 64 keeps the 151,936 x 64 tied embedding small (9.7M of the ~9.8M parameters,
    # 39 MB in float32). Head dim 32 (2 query heads, 1 KV head: GQA as
    # in Qwen3) is a size every vLLM attention backend supports.
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 32
    intermediate_size: int = 192  # 3x width, as in the tiny model
    max_position_embeddings: int = 4096
    # Qwen3 uses 1e6 for 32k+ contexts; at a few hundred tokens and a few hundred steps the
    # Llama default let the model find its place in long tool prompts sooner (tool calls came
    # out well-formed 3/8 vs 1/8 of the time in the same budget).
    rope_theta: float = 10_000.0
    # Training: enough for the formats (think block, tags, tool calls), not for the tasks.
    # Small batches, more steps: measured the best formats per CPU second (500 x 8: tool calls
    # parse 6/8, 400 x 16 took 40% longer for 1/8), ~45 s of one core for the whole build.
    steps: int = 500
    batch_size: int = 8
    lr: float = 2e-2  # a from-scratch 2-layer model takes (and needs) a high lr
    warmup_steps: int = 10
    max_seq_len: int = 768  # room for a tool list + a tool call + its result
    num_demonstrations: int = 600


def builder_sources() -> list[Path]:
    """The files whose source goes into tiny-qwen's build fingerprint."""
    here = Path(__file__).parent
    return [
        here / "tiny_qwen.py",
        here / "qwen_vocab.py",
        here / "tiny.py",
        here / "sft_data.py",
        here / "tokenizer.py",
    ]


def build_fingerprint(spec: TinyQwenSpec, extra: str = "") -> str:
    return tiny.build_fingerprint(spec, extra, sources=builder_sources())


def build_tiny_qwen_model(
    out_dir: Path,
    demonstrations: Sequence[Demonstration],
    spec: TinyQwenSpec | None = None,
    *,
    progress: ProgressFn | None = None,
    fingerprint: str | None = None,
) -> Path:
    """Train tiny-qwen on `demonstrations` and save it to `out_dir` (atomically). Returns `out_dir`."""
    import torch

    spec = spec or TinyQwenSpec()
    if not demonstrations:
        raise ValueError("build_tiny_qwen_model needs at least one demonstration")
    out_dir = Path(out_dir)
    fingerprint = fingerprint or build_fingerprint(spec)
    started = time.monotonic()
    previous_threads = torch.get_num_threads()
    # One thread: the ops of a width-64 model are too small to split (a second thread adds
    # barrier waits), and on a busy machine two OpenMP threads were measured ~50x slower.
    torch.set_num_threads(1)
    try:
        torch.manual_seed(spec.seed)
        tokenizer = qwen_vocab.build_hf_tokenizer()
        encoded = [
            segment
            for messages, tools in demonstrations
            for segment in sft_data.encode_conversation(tokenizer, messages, spec.max_seq_len, tools)
        ]
        encoded = [demo for demo in encoded if demo.num_trained > 0]
        if not encoded:
            raise ValueError("no demonstration has an assistant token within max_seq_len")
        # Train only the rows of the ids the demonstrations use (unused rows stay zero), then
        # widen to all 151,936 rows: each step skips a 152k-way softmax.
        used, compact_demos = compact_vocabulary(encoded)
        compact = new_model(spec, vocab_size=len(used))
        final_loss = tiny.train_sft(
            compact,
            compact_demos,
            spec,
            progress,
            pad_id=0,  # pads are masked out
            loss_fn=CompactVocabularyLoss(qwen_vocab.EMBEDDING_SIZE - len(used)),
        )
        model = widen_vocabulary(compact, used, spec)
        info = {
            "fingerprint": fingerprint,
            "spec": dataclasses.asdict(spec),
            "demonstrations_sha256": tiny.demonstrations_digest([list(demo) for demo in demonstrations]),
            "num_demonstrations": len(demonstrations),
            "num_sequences": len(encoded),
            "final_loss": final_loss,
            "build_seconds": round(time.monotonic() - started, 2),
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "num_used_ids": len(used),
        }
        tiny.save_model_atomically(
            model,
            out_dir,
            info,
            save_tokenizer=lambda path: qwen_vocab.save_tokenizer(path, tokenizer),
            eos_ids=[qwen_vocab.IM_END_ID, qwen_vocab.ENDOFTEXT_ID],
            pad_id=qwen_vocab.ENDOFTEXT_ID,
        )
    finally:
        torch.set_num_threads(previous_threads)
    return out_dir


def new_model(spec: TinyQwenSpec, vocab_size: int = qwen_vocab.EMBEDDING_SIZE) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    full = vocab_size == qwen_vocab.EMBEDDING_SIZE
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        tie_word_embeddings=True,  # as Qwen3-0.6B; here it also halves the size on disk
        # Qwen3's (no pad_token_id: it would freeze that embedding row; padding is in generation_config).
        # The compact training copy has other ids, so it names none (None is the default).
        bos_token_id=qwen_vocab.ENDOFTEXT_ID if full else None,
        eos_token_id=qwen_vocab.IM_END_ID if full else None,
    )
    # Also the pre-5 key: transformers 4.x (what many vLLM builds run on) reads `rope_theta` and
    # would otherwise take its default 10,000; transformers 5 reads either.
    config.rope_theta = spec.rope_theta
    return Qwen3ForCausalLM(config)


class CompactVocabularyLoss:
    """Next-token cross-entropy at the labelled positions, over the full vocabulary, for a compact
    model holding only the used rows: the `num_unused` other ids (zero rows, logit exactly 0)
    add `num_unused * exp(0)` to the softmax's denominator, one constant extra column."""

    def __init__(self, num_unused: int) -> None:
        import math

        self.log_unused = math.log(num_unused)

    def __call__(self, model: Any, batch: dict[str, Any]) -> Any:
        import torch
        import torch.nn.functional as F

        hidden = model.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        targets = batch["labels"][:, 1:]
        keep = targets != IGNORE_INDEX
        logits = model.lm_head(hidden[:, :-1][keep])  # only where a token is trained
        unused = torch.full((logits.shape[0], 1), self.log_unused, dtype=logits.dtype)
        return F.cross_entropy(torch.cat([logits, unused], dim=1), targets[keep])


def compact_vocabulary(
    encoded: Sequence[sft_data.EncodedDemo],
) -> tuple[list[int], list[sft_data.EncodedDemo]]:
    """The sorted ids the sequences use, and the sequences renumbered 0..len(used)-1."""
    used = sorted({token for demo in encoded for token in demo.input_ids})
    index = {token: position for position, token in enumerate(used)}
    renumbered = [
        sft_data.EncodedDemo(
            [index[t] for t in demo.input_ids],
            [IGNORE_INDEX if t == IGNORE_INDEX else index[t] for t in demo.labels],
        )
        for demo in encoded
    ]
    return used, renumbered


def widen_vocabulary(compact: Any, used: list[int], spec: TinyQwenSpec) -> Any:
    """The full-vocabulary model: the compact model's weights, its embedding rows at their real
    ids, every other row zero (logit exactly 0, as it was during training)."""
    import torch

    state = compact.state_dict()
    rows = state["model.embed_tokens.weight"]
    embedding = torch.zeros((qwen_vocab.EMBEDDING_SIZE, rows.shape[1]), dtype=rows.dtype)
    embedding[torch.tensor(used)] = rows
    state["model.embed_tokens.weight"] = embedding
    if "lm_head.weight" in state:  # tied: the same matrix
        state["lm_head.weight"] = embedding
    model = new_model(spec)
    model.load_state_dict(state)
    model.eval()
    return model
