"""Parse Hermes-style tool calls out of generated text.

Models trained on the Hermes/Qwen convention (and the tiny model's chat template) emit
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks. This turns them into
OpenAI `tool_calls` entries (arguments as a JSON *string*, as the OpenAI API returns them)
and keeps everything outside the blocks as the message content. A block whose JSON does not
parse, or lacks a name, stays in the content as text: a malformed call is the model's
mistake to be scored, not a crash. An unterminated `<tool_call>` at the end of the text
(a generation cut by max_tokens) is parsed if its JSON is complete, else left as text.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_hermes_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split `text` into (content outside valid blocks, OpenAI-format tool calls)."""
    tool_calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in _BLOCK.finditer(text):
        call = _parse_call(match.group(1))
        if call is None:
            continue  # malformed: the block stays in the content
        kept.append(text[position : match.start()])
        position = match.end()
        tool_calls.append(call)
    kept.append(text[position:])
    content = "".join(kept) if tool_calls else text
    return content.strip() if tool_calls else content, tool_calls


def _parse_call(payload: str) -> dict[str, Any] | None:
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        arguments_json = arguments  # already a JSON string (some models emit it that way)
    else:
        arguments_json = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": data["name"], "arguments": arguments_json},
    }
