"""A real Hugging Face causal LM whose greedy output is scripted: each token's successor is fixed.

Why: LocalClient's reasoning split must be tested on what the real generation path produces
(decode, stop tokens, token ids), but the tiny model has no `<think>` token and a trained
model's output cannot be asserted. This one is a 1-layer Llama whose attention and MLP are
zeroed (the residual stream carries the token's one-hot embedding straight through) and whose
lm_head maps token i to `CHAIN[i]`: a bigram chain, built in milliseconds, no training.

The vocabulary has `<think>` and `</think>` as single, non-special added tokens, as Qwen3's has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Word-level pieces (the decoder concatenates them as they are).
WORDS = [
    "[UNK]",
    "<|im_start|>",
    "<|im_end|>",
    "<|assistant|>",
    "<think>",
    "</think>",
    "I",
    " think",
    " 42",
    "\n\n",
    "<answer>",
    "7",
    "</answer>",
    "Hi",
    "user",
    "system",
    "\n",
]
# Greedy successor of each token; anything not listed ends the reply (<|im_end|>).
CHAIN = {
    "<|assistant|>": "<think>",
    "<think>": "I",
    "I": " think",
    " think": " 42",
    " 42": "</think>",
    "</think>": "\n\n",
    "\n\n": "<answer>",
    "<answer>": "7",
    "7": "</answer>",
    "Hi": "<answer>",
}
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# What the chain writes after the generation prompt.
SCRIPTED_REPLY = "<think>I think 42</think>\n\n<answer>7</answer>"


def build_tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.decoder = decoders.Fuse()
    core.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t in ("<|im_start|>", "<|im_end|>", "<|assistant|>")
        ]
    )
    core.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>", "\n\n", "\n")]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="[UNK]",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def build_model() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    size = len(WORDS)
    hidden = size + size % 2  # RoPE wants an even head size
    config = LlamaConfig(
        vocab_size=size,
        hidden_size=hidden,
        intermediate_size=4,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=WORDS.index("<|im_end|>"),
        pad_token_id=WORDS.index("<|im_end|>"),
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(size, hidden))
        model.model.norm.weight.fill_(1.0)
        end = WORDS.index("<|im_end|>")
        for i, word in enumerate(WORDS):
            model.lm_head.weight[WORDS.index(CHAIN[word]) if word in CHAIN else end, i] = 10.0
    return model.eval()


def save_scripted_model(path: Path) -> Path:
    """Both, saved with `save_pretrained` (loads like any Hugging Face model folder)."""
    build_model().save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path
