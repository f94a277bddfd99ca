"""Byte-level tokenizer and ChatML chat template of the embedded tiny model.

Why bytes: the tiny model is trained from scratch in about a minute, so its vocabulary must
be tiny (256 byte symbols + 3 special tokens) and every string must round-trip exactly —
spaces, newlines, tabs and any unicode. A `tokenizers` BPE with the 256 ByteLevel symbols
as vocabulary and *no merges* gives exactly one token per byte and is saved as a plain
`PreTrainedTokenizerFast`, so `AutoTokenizer.from_pretrained(dir)` loads it offline.

Pitfall (DESIGN §5): never let `AutoTokenizer` pick a model-specific tokenizer class (e.g.
`Qwen2Tokenizer` rebuilds the pipeline and drops spaces from a char vocab). The saved
`tokenizer_config.json` therefore pins `tokenizer_class = "PreTrainedTokenizerFast"`.

The chat template is ChatML with Hermes-style tools (the Qwen2.5 convention that vLLM's
`hermes` tool parser and `workbench.inference.tool_parsing` understand):
- tools are listed in the system turn inside `<tools></tools>`, one JSON schema a line;
- an assistant tool call is rendered as `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`;
- tool results (role "tool") are rendered inside a user turn as `<tool_response>...</tool_response>`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]

# Ids are fixed: 0..255 are the byte symbols, the special tokens follow in this order.
NUM_BYTE_TOKENS = 256
ENDOFTEXT_ID = 256
IM_START_ID = 257
IM_END_ID = 258
VOCAB_SIZE = NUM_BYTE_TOKENS + len(SPECIAL_TOKENS)

CHAT_TEMPLATE = (
    "{%- macro render_content(content) -%}"
    "{%- if content is none -%}"
    "{%- elif content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}{{- render_content(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- elif messages and messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + render_content(messages[0].content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' and loop.first -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + render_content(message.content) -}}"
    "{%- if message.tool_calls -%}"
    "{%- for tool_call in message.tool_calls -%}"
    "{%- set call = tool_call.function if tool_call.function is defined else tool_call -%}"
    "{%- if (loop.first and message.content) or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' -}}'
    "{%- if call.arguments is string -%}{{- call.arguments -}}{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + render_content(message.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def build_byte_tokenizer() -> Any:
    """A `tokenizers.Tokenizer`: one token per byte, no merges, ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = ByteLevel.alphabet()  # the 256 printable stand-ins GPT-2 uses for raw bytes
    byte_to_symbol = bytes_to_unicode()  # GPT-2's byte -> stand-in map (what ByteLevel emits)
    vocab = {byte_to_symbol[b]: b for b in range(NUM_BYTE_TOKENS)}
    assert set(vocab) == set(alphabet)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    # use_regex=False: without merges the GPT-2 word split changes nothing but costs time.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    assert tokenizer.token_to_id(ENDOFTEXT) == ENDOFTEXT_ID
    assert tokenizer.token_to_id(IM_END) == IM_END_ID
    return tokenizer


def build_hf_tokenizer() -> Any:
    """The byte tokenizer wrapped as a `PreTrainedTokenizerFast` with the chat template."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=build_byte_tokenizer(),
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        bos_token=None,
        unk_token=None,
        # Clean-up would turn "a ." into "a." and break the exact round trip.
        clean_up_tokenization_spaces=False,
        padding_side="left",  # generation pads on the left; training builds its own batches
        model_max_length=1 << 30,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def save_tokenizer(out_dir: Path) -> None:
    """Write tokenizer.json + tokenizer_config.json (pinned to PreTrainedTokenizerFast)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    build_hf_tokenizer().save_pretrained(str(out_dir))
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    # Pin the class so AutoTokenizer never swaps in the model type's own tokenizer.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    config["eos_token"] = IM_END
    config["pad_token"] = ENDOFTEXT
    config["clean_up_tokenization_spaces"] = False
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    # transformers may also write chat_template.jinja; keep one source of truth in the config.
    (out_dir / "chat_template.jinja").unlink(missing_ok=True)
