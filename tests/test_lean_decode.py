"""The lean decode path (`lean_model` + `decode_engine`) against the Hugging Face path
(`generation.generate_batch_hf`): same tokens for seeded rows, same logprobs, for mixed batches,
rows joining mid-decode, Qwen-family layouts, LoRA layers and in-place weight updates; plus the
fallback for unsupported models and LocalClient's continuous batching."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from workbench.inference.generation import GenerationRow, RowResult, generate_batch, generate_batch_hf
from workbench.models.synthetic import REVERSE_SYSTEM_PROMPT
from workbench.types import SamplingParams

STOPS = {258}  # the tiny vocabulary's EOS


@pytest.fixture(scope="module")
def tiny(tiny_model: Path) -> tuple[Any, Any]:
    """The session's tiny model (conftest), loaded once for this module; tests copy it before changing it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_model))


def prompt_ids(tokenizer: Any, text: str, system: str = REVERSE_SYSTEM_PROMPT) -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(rendered, add_special_tokens=False)


def mixed_rows(tokenizer: Any) -> list[GenerationRow]:
    """Different prompt lengths (most sharing the system prompt, one not, one repeated),
    greedy and sampled rows with top-p/top-k/min-p/repetition penalty, a stop string, and
    max_tokens from 3 to 40 so rows finish at different steps."""
    texts = ["green apple", "the lazy dog jumps", "fox", "silver river stone and more words", "winter"]
    prompts = [prompt_ids(tokenizer, t) for t in texts] + [
        prompt_ids(tokenizer, "fox", system="Say it backwards.")
    ]
    settings = [
        SamplingParams(temperature=0.0, max_tokens=40),
        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=20),
        SamplingParams(temperature=1.3, top_k=5, max_tokens=8),
        SamplingParams(temperature=1.0, max_tokens=30, stop=["e"]),
        SamplingParams(temperature=1.0, max_tokens=25, extra={"min_p": 0.1}),
        SamplingParams(temperature=0.9, max_tokens=3, extra={"repetition_penalty": 1.3}),
    ]
    rows = [
        GenerationRow(p, s, s.max_tokens, seed=100 + i) for i, (p, s) in enumerate(zip(prompts, settings))
    ]
    sampled = SamplingParams(temperature=1.0, max_tokens=12)
    rows += [
        GenerationRow(prompts[1], sampled, 12, seed=200 + i) for i in range(3)
    ]  # an RL group: one prompt, n=3
    return rows


def generate(model: Any, tokenizer: Any, rows: list[GenerationRow], *, lean: bool) -> list[RowResult]:
    return generate_batch(model, tokenizer, rows, stop_token_ids=STOPS, pad_token_id=256, lean=lean)


def assert_same(expected: list[RowResult], actual: list[RowResult]) -> None:
    import torch

    assert len(expected) == len(actual)
    for want, got in zip(expected, actual):
        assert got.completion_ids == want.completion_ids
        assert got.finish_reason == want.finish_reason and got.text == want.text
        assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-4)


def test_lean_path_matches_the_hf_path_for_a_mixed_batch(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    rows = mixed_rows(tokenizer)
    hf = generate(model, tokenizer, rows, lean=False)
    assert_same(hf, generate(model, tokenizer, rows, lean=True))
    # The batch did exercise what it claims: a stop string, rows of different lengths, a group.
    assert hf[3].finish_reason == "stop" and "e" not in (hf[3].text or "")
    assert len({len(r.completion_ids) for r in hf}) > 3
    assert len({tuple(r.completion_ids) for r in hf[-3:]}) > 1  # the group's rows are independent draws


def test_unseeded_rows_draw_from_the_global_generator_in_row_order(tiny: tuple[Any, Any]) -> None:
    import torch

    model, tokenizer = tiny
    rows = [GenerationRow(r.prompt_ids, r.sampling, r.max_new_tokens) for r in mixed_rows(tokenizer)]
    torch.manual_seed(7)
    hf = generate(model, tokenizer, rows, lean=False)
    torch.manual_seed(7)
    assert [r.completion_ids for r in generate(model, tokenizer, rows, lean=True)] == [
        r.completion_ids for r in hf
    ]


def test_rows_joining_mid_decode_match_running_alone(tiny: tuple[Any, Any]) -> None:
    """Continuous batching: rows added while others decode (into grown buffers, reusing the
    live rows' prompt prefixes) give what each gives alone."""
    from workbench.inference.decode_engine import DecodeEngine
    from workbench.inference.lean_model import LeanModel

    model, tokenizer = tiny
    rows = mixed_rows(tokenizer)
    engine = DecodeEngine(LeanModel.build(model), tokenizer, stop_token_ids=STOPS, max_rows=len(rows))
    results: dict[int, RowResult] = {}
    engine.add(rows[:1], [0])
    for _ in range(3):
        results.update(engine.step())
    assert engine.prefix is None  # a lone prompt shares nothing yet
    engine.add(rows[1:2], [1])
    assert engine.prefix is not None  # the system prompt, copied from the live row, is now shared
    results.update(engine.step())
    engine.add(rows[2:6], [2, 3, 4, 5])
    results.update(engine.step())
    engine.add(rows[6:], list(range(6, len(rows))))
    while engine.live_rows:
        results.update(engine.step())
    alone = [
        generate_batch_hf(model, tokenizer, [row], stop_token_ids=STOPS, pad_token_id=256)[0] for row in rows
    ]
    assert_same(alone, [results[i] for i in range(len(rows))])


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_qwen_layouts_match_the_hf_path(tiny: tuple[Any, Any], family: str) -> None:
    """q/k norms (qwen3), attention biases (qwen2), grouped-query attention: random weights."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

    _, tokenizer = tiny
    shape = dict(
        vocab_size=259,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        eos_token_id=258,
        tie_word_embeddings=True,
    )
    config = (
        Qwen3Config(**shape)
        if family == "qwen3"
        else Qwen2Config(**{k: v for k, v in shape.items() if k != "head_dim"})
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    rows = mixed_rows(tokenizer)
    assert_same(generate(model, tokenizer, rows, lean=False), generate(model, tokenizer, rows, lean=True))


def test_lora_layers_and_in_place_updates_are_seen(tiny: tuple[Any, Any]) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    from workbench.inference.lean_model import LeanModel

    model, tokenizer = tiny
    torch.manual_seed(0)
    lora = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    wrapped = get_peft_model(copy.deepcopy(model), lora).eval()
    assert LeanModel.build(wrapped) is not None  # peft layers are called as modules
    rows = mixed_rows(tokenizer)[:4]
    before = generate(wrapped, tokenizer, rows, lean=True)
    assert_same(generate(wrapped, tokenizer, rows, lean=False), before)
    with torch.no_grad():
        wrapped.get_base_model().model.layers[0].mlp.up_proj.weight.mul_(3.0)
    after = generate(wrapped, tokenizer, rows, lean=True)
    assert_same(generate(wrapped, tokenizer, rows, lean=False), after)
    assert [r.completion_ids for r in after] != [r.completion_ids for r in before]


def test_unsupported_models_use_the_hf_path(tiny: tuple[Any, Any]) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from workbench.inference.lean_model import LeanModel

    _, tokenizer = tiny
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=259, n_embd=32, n_layer=1, n_head=2, n_positions=256)
    ).eval()
    assert LeanModel.build(model) is None
    rows = mixed_rows(tokenizer)[:2]
    assert_same(
        generate_batch_hf(model, tokenizer, rows, stop_token_ids=STOPS, pad_token_id=256),
        generate_batch(model, tokenizer, rows, stop_token_ids=STOPS, pad_token_id=256),
    )
    with pytest.raises(ValueError):
        generate(model, tokenizer, rows, lean=True)


async def test_local_client_requests_join_a_running_batch(tiny: tuple[Any, Any]) -> None:
    from workbench.inference.local_client import LocalClient

    model, tokenizer = tiny
    client = LocalClient.from_model(model, tokenizer, model_name="tiny")
    client._stop_token_ids = set()  # no EOS: the long request runs all its tokens
    long_ids, short_ids = prompt_ids(tokenizer, "green apple"), prompt_ids(tokenizer, "fox")
    try:
        long = asyncio.create_task(
            client.complete_ids(long_ids, sampling=SamplingParams(max_tokens=150, seed=1))
        )
        async with asyncio.timeout(60):
            while client.stats.forward_passes < 5:  # the long request is decoding
                await asyncio.sleep(0.005)
        [short] = await client.complete_ids(short_ids, sampling=SamplingParams(max_tokens=2, seed=2))
        assert not long.done()  # it joined the running batch and left before it ended
        [completion] = await long
    finally:
        await client.close()
    assert (client.stats.batches, client.stats.max_batch_rows) == (2, 2)
    assert short.completion_tokens == 2 and completion.completion_tokens == 150
    alone = generate_batch_hf(
        model,
        tokenizer,
        [GenerationRow(long_ids, SamplingParams(max_tokens=150), 150, seed=1 * 1_000_003)],
        stop_token_ids=set(),
        pad_token_id=256,
    )[0]
    assert completion.tokens.completion_ids == alone.completion_ids
