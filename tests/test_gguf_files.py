"""The GGUF test files (tests/gguf_files.py) are what transformers' own GGUF reader expects.

Why: the GGUF -> Hugging Face conversion is tested on these files instead of a downloaded model,
so they must be real: transformers itself has to load the tiny Llama back to the same model (same
logits, same tokenizer and chat template), and has to refuse the broken files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the gguf package is not installed")

from tests.gguf_files import (
    IM_END_ID,
    IM_START_ID,
    UNSUPPORTED_ARCH,
    write_garbage_gguf,
    write_tiny_llama_gguf,
    write_truncated_gguf,
    write_unsupported_arch_gguf,
)


def test_tiny_llama_gguf_loads_back_as_the_source_model(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = write_tiny_llama_gguf(tmp_path / "tiny.gguf")

    model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf").eval()
    # The hyperparameters the file states, not the config class's defaults.
    assert model.config.num_key_value_heads == 2
    assert model.config.rope_parameters["rope_theta"] == 100000.0
    assert model.config.rms_norm_eps == pytest.approx(1e-5)
    assert model.config.tie_word_embeddings
    # Specials, bytes and merged tokens, so every kind of embedding row is compared.
    ids = torch.tensor([[IM_START_ID, 40, 75, 104, 200, 261, 266, IM_END_ID]])
    with torch.no_grad():
        expected, actual = source(ids).logits, model(ids).logits
    # F32 all the way: anything above float error is a tensor in the wrong place.
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=0)

    tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == IM_END_ID
    text = "Hello, world! ünïcödé"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    # Special tokens stay whole rather than being spelled out byte by byte.
    ids = tokenizer.encode("<|im_start|>hi<|im_end|>")
    assert tokenizer.convert_ids_to_tokens(ids) == ["<|im_start|>", "h", "i", "<|im_end|>"]
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_broken_gguf_files_are_refused(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # If transformers learns this architecture, the helper must pick another one.
    assert UNSUPPORTED_ARCH not in GGUF_SUPPORTED_ARCHITECTURES
    write_unsupported_arch_gguf(tmp_path / "unsupported.gguf")
    with pytest.raises(ValueError, match=f"architecture {UNSUPPORTED_ARCH} is not supported"):
        AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="unsupported.gguf")

    write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    write_truncated_gguf(tmp_path / "tiny.gguf", tmp_path / "truncated.gguf")
    # gguf's reader maps every tensor when it opens the file, so even the config read fails.
    with pytest.raises(ValueError):
        AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="truncated.gguf")

    write_garbage_gguf(tmp_path / "garbage.gguf")
    with pytest.raises(ValueError, match="not a GGUF file"):
        AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="garbage.gguf")
