"""`EchoClient`: a real, instant, deterministic `Client` with no model behind it.

It answers with the last user message reversed (or echoed), respects `max_tokens` and
`stop`, and reports byte-level token ids with fixed logprobs, so the whole stack (server,
HTTP client, engine, RL token plumbing) can be exercised and benchmarked without weights.
Given tools, it calls the first tool once, then answers with the tool's result.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from workbench.types import Completion, Messages, SamplingParams, TokenData

# Fixed per-token logprob: any constant works; deterministic output is what matters.
_LOGPROB = -0.25


def _text_of(content: Any) -> str:
    """Message content as text (OpenAI content may also be a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _byte_ids(text: str) -> list[int]:
    """Token ids of a byte-level "tokenizer": one id per UTF-8 byte."""
    return list(text.encode("utf-8"))


def _tool_arguments(tool: dict[str, Any], text: str) -> dict[str, Any]:
    """Arguments for `tool` that satisfy its schema's required parameters."""
    params = tool.get("function", {}).get("parameters") or {}
    properties = params.get("properties") or {}
    defaults = {"integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}
    return {
        name: defaults.get((properties.get(name) or {}).get("type", "string"), text)
        for name in params.get("required") or []
    }


class EchoClient:
    """Answers instantly: `mode="reverse"` reverses the last user message, `"echo"` repeats it."""

    def __init__(self, model: str = "echo", *, mode: Literal["reverse", "echo"] = "reverse") -> None:
        self.model = model
        self.mode = mode

    def __repr__(self) -> str:
        return f"EchoClient(model={self.model!r}, mode={self.mode!r})"

    def token_to_str(self, token_id: int) -> str:
        """Text of one token id (the server uses this for `logprobs.content[].token`)."""
        return bytes([token_id]).decode("utf-8", errors="replace") if 0 <= token_id < 256 else ""

    async def chat(
        self,
        messages: Messages,
        *,
        sampling: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[Completion]:
        return self.answer(messages, sampling=sampling, tools=tools)

    def answer(
        self,
        messages: Messages,
        *,
        sampling: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[Completion]:
        """`chat`, synchronously: nothing here waits."""
        prompt_text = "".join(f"{m.get('role', '')}: {_text_of(m.get('content'))}\n" for m in messages)
        prompt_ids = _byte_ids(prompt_text)
        last = messages[-1] if messages else {}

        if tools and last.get("role") != "tool":
            return [self._tool_call(tools[0], messages, prompt_ids, i) for i in range(sampling.n)]
        if last.get("role") == "tool":
            answer = _text_of(last.get("content"))
        else:
            user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
            answer = _text_of(user.get("content"))
            if self.mode == "reverse":
                answer = answer[::-1]

        answer, finish_reason = self._truncate(answer, sampling)
        completion_ids = _byte_ids(answer)
        # Every choice is identical: the client is deterministic by design.
        return [
            Completion(
                message={"role": "assistant", "content": answer},
                finish_reason=finish_reason,
                prompt_tokens=len(prompt_ids),
                completion_tokens=len(completion_ids),
                tokens=TokenData(prompt_ids, completion_ids, [_LOGPROB] * len(completion_ids)),
            )
            for _ in range(sampling.n)
        ]

    @staticmethod
    def _truncate(answer: str, sampling: SamplingParams) -> tuple[str, str]:
        """Apply stop strings, then the token budget (one token per UTF-8 byte)."""
        for stop in sampling.stop:
            at = answer.find(stop) if stop else -1
            if at >= 0:
                answer = answer[:at]
        encoded = answer.encode("utf-8")
        if len(encoded) > sampling.max_tokens:
            return encoded[: sampling.max_tokens].decode("utf-8", errors="ignore"), "length"
        return answer, "stop"

    @staticmethod
    def _tool_call(tool: dict[str, Any], messages: Messages, prompt_ids: list[int], index: int) -> Completion:
        user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        name = tool.get("function", {}).get("name", "tool")
        arguments = orjson.dumps(_tool_arguments(tool, _text_of(user.get("content")))).decode()
        call = {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": arguments}}
        completion_ids = _byte_ids(f"<tool_call>{name} {arguments}</tool_call>")
        return Completion(
            message={"role": "assistant", "content": "", "tool_calls": [call]},
            finish_reason="tool_calls",
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(completion_ids),
            tokens=TokenData(prompt_ids, completion_ids, [_LOGPROB] * len(completion_ids)),
        )

    async def close(self) -> None:
        return None
