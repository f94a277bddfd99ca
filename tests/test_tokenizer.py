"""The tiny model's byte-level tokenizer: exact round trips, special tokens, chat template."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.models import tokenizer as byte_tokenizer
from workbench.models.sft_data import IGNORE_INDEX, encode_demonstration


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    directory: Path = tmp_path_factory.mktemp("tok")
    byte_tokenizer.save_tokenizer(directory)
    return AutoTokenizer.from_pretrained(str(directory))


@pytest.mark.parametrize(
    "text",
    [
        "hello world",
        "  leading and trailing  ",
        "line one\nline two\n\n\tindented\ttabs\r\n",
        "café é 日本語 😀🚀 naïve",
        "a . b , c ! ? don't",  # clean-up of tokenization spaces would break this
        "<reversed_text>\ndlrow olleh\n</reversed_text>",
    ],
)
def test_round_trip_is_exact(tok, text: str) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text.encode("utf-8"))  # one token per byte
    assert tok.decode(ids) == text


def test_loaded_class_is_pinned(tok) -> None:
    assert type(tok).__name__ in {"PreTrainedTokenizerFast", "TokenizersBackend"}
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|endoftext|>"
    assert len(tok) == byte_tokenizer.VOCAB_SIZE


def test_special_tokens_are_single_ids(tok) -> None:
    for token, expected in [
        ("<|endoftext|>", byte_tokenizer.ENDOFTEXT_ID),
        ("<|im_start|>", byte_tokenizer.IM_START_ID),
        ("<|im_end|>", byte_tokenizer.IM_END_ID),
    ]:
        assert tok.encode(token, add_special_tokens=False) == [expected]
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert ids[0] == byte_tokenizer.IM_START_ID and ids[-1] == byte_tokenizer.IM_END_ID
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_chat_template_renders_chatml(tok) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nhi there<|im_end|>\n"
        "<|im_start|>assistant\nhello<|im_end|>\n"
        "<|im_start|>user\nbye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tok.encode(text, add_special_tokens=False)
    assert ids.count(byte_tokenizer.IM_START_ID) == 5
    assert tok.decode(ids) == text
    without = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert not without.endswith("<|im_start|>assistant\n")


def test_chat_template_with_tools(tok) -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}},
        }
    ]
    messages = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "1+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nUse tools.\n\n# Tools")
    assert '<tools>\n{"type": "function", "function": {"name": "add"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>'
        in text
    )
    assert "<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text


def test_sft_mask_covers_assistant_turns_and_im_end(tok) -> None:
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"},
    ]
    demo = encode_demonstration(tok, messages, max_len=10_000)
    trained = [i for i, label in zip(demo.input_ids, demo.labels) if label != IGNORE_INDEX]
    assert tok.decode(trained) == "a1<|im_end|>a2<|im_end|>"
    full = tok.apply_chat_template(messages, tokenize=False)
    assert tok.decode(demo.input_ids) == full
