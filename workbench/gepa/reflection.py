"""The reflection side of GEPA over any workbench `Client`.

- `ReflectionModel`: gepa's `LanguageModel` (prompt -> reply text) backed by a `Client` (an
  OpenAI-compatible endpoint or a local model), called through the async bridge with the
  engine's retries for transient faults.
- `Reflector`: the reflection strategy handed to `gepa.optimize`. It renders gepa's own
  instruction-proposal prompt and parses the reply with gepa's own extractor, but checks the
  result first: a reply without a usable prompt (empty, no ``` block, the same prompt again)
  or a failing endpoint becomes a recorded event and no proposal, so gepa skips the iteration
  without spending metric calls on a non-candidate — never a crash, never garbage evaluated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gepa.proposer.reflective_mutation.reflection_lm import ReflectionProposal
from gepa.strategies.instruction_proposal import InstructionProposalSignature

from workbench.engine import RetryingClient, RetryPolicy
from workbench.gepa.bridge import AsyncBridge
from workbench.inference.client import Client
from workbench.types import SamplingParams

REPLY_EXCERPT_CHARS = 300  # how much of a bad reply is kept in metadata.json and run.log


@dataclass
class ReflectionEvent:
    """What one reflection call produced: `proposed` (a new prompt), `unusable` or `error`."""

    status: str
    component: str
    detail: str  # the new prompt, why the reply was unusable, or the error
    reply: str = ""  # the start of an unusable reply, to see what the model did instead


class ReflectionModel:
    """`prompt (str or chat messages) -> reply text` over a workbench `Client`."""

    def __init__(
        self, client: Client, bridge: AsyncBridge, sampling: SamplingParams, retry: RetryPolicy | None = None
    ) -> None:
        self.client = RetryingClient(client, retry)
        self.bridge = bridge
        self.sampling = sampling
        self.calls = 0

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        self.calls += 1
        completions = self.bridge.run(self.client.chat(messages, sampling=self.sampling))
        content = completions[0].message.get("content") if completions else None
        return content if isinstance(content, str) else ""


def extract_prompt(reply: str, current: str) -> tuple[str | None, str]:
    """(new prompt, '') or (None, why the reply is unusable). Parsing is gepa's own."""
    if not reply.strip():
        return None, "empty reply"
    if "```" not in reply:
        return None, "no ``` block in the reply"  # gepa's prompt asks for the instruction inside one
    text = InstructionProposalSignature.output_extractor(reply.strip())["new_instruction"].strip()
    if not text:
        return None, "the ``` block is empty"
    if text == current.strip():
        return None, "the proposed prompt is the current one"
    return text, ""


class Reflector:
    """gepa `ReflectionLM` strategy: one reflection call per component, checked, every outcome recorded."""

    def __init__(
        self,
        lm: Callable[[str | list[dict[str, Any]]], str],
        on_event: Callable[[ReflectionEvent], None] | None = None,
        prompt_template: str | None = None,
    ) -> None:
        self.lm = lm
        self.on_event = on_event
        self.prompt_template = prompt_template
        self.events: list[ReflectionEvent] = []

    def _record(self, event: ReflectionEvent) -> None:
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def reflect(
        self,
        candidate: dict[str, str],
        reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
        components_to_update: list[str],
    ) -> tuple[ReflectionProposal, Reflector]:
        proposal = ReflectionProposal(new_texts={}, prompts={}, raw_lm_outputs={})
        for name in components_to_update:
            records = reflective_dataset.get(name)
            if not records:
                continue
            prompt = InstructionProposalSignature.prompt_renderer(
                {
                    "current_instruction_doc": candidate[name],
                    "dataset_with_feedback": [dict(r) for r in records],
                    "prompt_template": self.prompt_template,
                }
            )
            try:
                reply = self.lm(prompt)
            except Exception as exc:  # endpoint down, bad auth, timeout after retries: recorded, not fatal
                self._record(
                    ReflectionEvent("error", name, f"{type(exc).__name__}: {str(exc)[:REPLY_EXCERPT_CHARS]}")
                )
                continue
            text, problem = extract_prompt(reply, candidate[name])
            if text is None:
                self._record(ReflectionEvent("unusable", name, problem, reply.strip()[:REPLY_EXCERPT_CHARS]))
                continue
            proposal.new_texts[name] = text
            proposal.prompts[name] = prompt
            proposal.raw_lm_outputs[name] = reply
            self._record(ReflectionEvent("proposed", name, text))
        return proposal, self
