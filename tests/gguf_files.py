"""Small GGUF files, written with `gguf.GGUFWriter`, for tests of the GGUF -> Hugging Face conversion.

Why: a real GGUF is hundreds of MB and would have to be downloaded. The conversion only cares
that a file is laid out the way llama.cpp's `convert_hf_to_gguf.py` lays one out, so these
helpers write that layout for a model a few hundred KB in size, in milliseconds, offline:

- `write_tiny_llama_gguf`: a random 2-layer Llama with a byte-level BPE ("gpt2") tokenizer and a
  ChatML template, like SmolLM2's GGUFs. It returns the source model, so a test can check that
  the converted model computes the same logits.
- `write_unsupported_arch_gguf`: a valid file of an architecture transformers cannot load.
- `write_truncated_gguf` / `write_garbage_gguf`: a file cut short, and a file that is no GGUF.

The keys and tensor names are the ones transformers' GGUF reader looks up (transformers 5:
`modeling_gguf_pytorch_utils.load_gguf_checkpoint` for the config and weights, and
`integrations/gguf/gguf_tokenizer_mapping.py` for the tokenizer).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

import gguf
import numpy as np

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

# The special tokens come first, as in SmolLM2's vocabulary, so their ids are fixed and small.
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2

# A few merges, spelled in the byte-level alphabet ("Ġ" is the space byte). Not needed for a round
# trip (every byte is a token), but without them the merge table would go untested. Each merge's
# result is added to the vocabulary, after the 256 byte tokens; a merge may only use tokens that
# an earlier merge (or the byte alphabet) made.
MERGES = ("Ġ t", "h e", "Ġt he", "l l", "o r", "Ġ w", "Ġw or", "l d")

# ChatML, as SmolLM2-Instruct's template writes it, minus its default system prompt (so a test's
# expected text stays short): `<|im_start|>{role}\n{content}<|im_end|>\n` per message.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# An architecture llama.cpp knows (it is in gguf-py's MODEL_ARCH_NAMES) and transformers does not
# load (it is not in `GGUF_SUPPORTED_ARCHITECTURES`): a realistic "not supported" file.
UNSUPPORTED_ARCH = "rwkv6"

# HF parameter name inside `model.layers.N.` -> GGUF tensor name inside `blk.N.` (llama.cpp's
# gguf-py `TensorNameMap` for MODEL_ARCH.LLAMA).
_LAYER_TENSORS = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which byte-level BPE vocabularies are spelled in.

    Printable bytes stand for themselves; the others (control characters, space, ...) are moved
    to code points from 256 up, in byte order, so that every token is a visible string.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {byte: chr(byte) for byte in printable}
    moved = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + moved)
            moved += 1
    return table


def vocabulary() -> list[str]:
    """The tokens, by id: the special tokens, the 256 byte tokens, then one token per merge."""
    byte_tokens = [bytes_to_unicode()[byte] for byte in range(256)]
    merged = ["".join(merge.split(" ")) for merge in MERGES]
    return [*SPECIAL_TOKENS, *byte_tokens, *merged]


def _add_tokenizer(writer: gguf.GGUFWriter) -> None:
    """The tokenizer keys llama.cpp writes for a byte-level BPE vocabulary (`_set_vocab_gpt2`)."""
    tokens = vocabulary()
    writer.add_tokenizer_model("gpt2")
    # llama.cpp names the pre-tokenizer by the hash of the HF tokenizer's output; SmolLM2's is
    # "smollm". transformers has no split regex for it and keeps GPT-2's, as for a real file.
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    # Control tokens are the ones transformers adds as special (whole, never split).
    writer.add_token_types(
        [gguf.TokenType.CONTROL if token in SPECIAL_TOKENS else gguf.TokenType.NORMAL for token in tokens]
    )
    writer.add_token_merges(list(MERGES))
    # SmolLM2-Instruct's ids: bos is <|im_start|>, eos and pad are <|im_end|>, unk is <|endoftext|>.
    writer.add_bos_token_id(IM_START_ID)
    writer.add_eos_token_id(IM_END_ID)
    writer.add_unk_token_id(ENDOFTEXT_ID)
    writer.add_pad_token_id(IM_END_ID)
    # Stated, not left to a reader's default (transformers defaults it per tokenizer type), so that
    # `encode` adds no BOS and a round trip gives back exactly the text.
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def _write(writer: gguf.GGUFWriter) -> None:
    """Header, metadata, then tensor data: the order a GGUF file has on disk."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder the rows of a q_proj/k_proj weight the way llama.cpp's converter does.

    HF Llama rotates the two halves of each head (`rotate_half`); llama.cpp's RoPE rotates
    adjacent pairs, so the converter interleaves each head's halves. transformers undoes it on
    load (`LlamaTensorProcessor._reverse_permute_weights`); without this step the loaded model
    would have scrambled attention and different logits. For k_proj, `n_head` is the kv head count.
    """
    head_dim = weights.shape[0] // n_head
    return weights.reshape(n_head, 2, head_dim // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def write_tiny_llama_gguf(path: Path, *, seed: int = 0) -> LlamaForCausalLM:
    """Write a random tiny Llama as llama.cpp's converter would (F32), and return it in eval mode.

    The weights are random but not default-initialised: larger than the usual 0.02 std, and
    norms away from 1.0, so that a tensor loaded into the wrong place (two norms swapped, a
    missing Q/K permutation) changes the logits well beyond float error. The embeddings are
    tied, so the file has no `output.weight`, which is how transformers infers tying.
    The caller's torch RNG state is left as it was.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokens = vocabulary()
    config = LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query: K is permuted with the kv head count, not 4
        max_position_embeddings=256,
        # Not the config class's defaults (1e-6, 10000), so a key the loader drops shows up.
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        initializer_range=0.1,
        tie_word_embeddings=True,
        bos_token_id=IM_START_ID,
        eos_token_id=IM_END_ID,
        pad_token_id=IM_END_ID,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "norm" in name:
                    parameter.normal_(mean=1.0, std=0.2)
    model.eval()

    weights = {name: tensor.detach().float().numpy() for name, tensor in model.state_dict().items()}
    head_dim = config.hidden_size // config.num_attention_heads

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_type("model")
    writer.add_name("Tiny Llama")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    # transformers maps this key to `head_dim` for llama
    writer.add_rope_dimension_count(head_dim)
    _add_tokenizer(writer)

    # numpy arrays go in in torch's (out, in) order; the writer stores the dims reversed, as
    # ggml wants, and gguf's reader (which transformers uses) hands them back in torch order.
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for layer in range(config.num_hidden_layers):
        for hf_suffix, gguf_suffix in _LAYER_TENSORS.items():
            tensor = weights[f"model.layers.{layer}.{hf_suffix}"]
            if gguf_suffix == "attn_q.weight":
                tensor = llama_cpp_permute(tensor, config.num_attention_heads)
            elif gguf_suffix == "attn_k.weight":
                tensor = llama_cpp_permute(tensor, config.num_key_value_heads)
            writer.add_tensor(f"blk.{layer}.{gguf_suffix}", tensor)
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    _write(writer)
    return model


def write_unsupported_arch_gguf(path: Path) -> None:
    """Write a small, well-formed GGUF of `UNSUPPORTED_ARCH`, which transformers refuses to load.

    It has the same tokenizer metadata as the tiny Llama and a real tensor, so the architecture
    is the only thing wrong with it: a test sees the "not supported" error, not some other one.
    """
    tokens = vocabulary()
    writer = gguf.GGUFWriter(path, UNSUPPORTED_ARCH)
    writer.add_type("model")
    writer.add_name("Tiny RWKV")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(len(tokens))
    writer.add_context_length(256)
    writer.add_embedding_length(16)
    writer.add_block_count(1)
    _add_tokenizer(writer)
    embeddings = np.random.default_rng(0).standard_normal((len(tokens), 16), dtype=np.float32)
    writer.add_tensor("token_embd.weight", embeddings)
    _write(writer)


def write_truncated_gguf(source: Path, path: Path) -> None:
    """Copy `source` cut to half its size: a download or copy that stopped partway.

    For the tiny Llama (about 370 KB, under 10 KB of it metadata) the cut falls inside the tensor
    data, so the header and metadata still parse and only reading the weights can fail.
    """
    data = source.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def write_garbage_gguf(path: Path, *, size: int = 4096, seed: int = 0) -> None:
    """Write `size` seeded random bytes under a GGUF name: a file that is not GGUF at all."""
    data = random.Random(seed).randbytes(size)
    # Random bytes will not start with the magic; make sure rather than rely on the seed.
    if data.startswith(b"GGUF"):
        data = b"XXXX" + data[4:]
    path.write_bytes(data)


__all__ = [
    "CHAT_TEMPLATE",
    "ENDOFTEXT_ID",
    "IM_END_ID",
    "IM_START_ID",
    "MERGES",
    "SPECIAL_TOKENS",
    "UNSUPPORTED_ARCH",
    "bytes_to_unicode",
    "llama_cpp_permute",
    "vocabulary",
    "write_garbage_gguf",
    "write_tiny_llama_gguf",
    "write_truncated_gguf",
    "write_unsupported_arch_gguf",
]
