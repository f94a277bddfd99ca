"""The environment as a DSPy program, so DSPy's optimizers can search its prompt.

DSPy only *searches*: its program holds the parameters — one `Predict` whose instructions are
the system prompt and whose demos are few-shot demonstrations — and every call of the program
is one rollout of one example through `CandidateScorer` (the engine, the env's own rubric). So
the model sees exactly the env's prompt (not DSPy's field-marker format), multi-turn and tool
envs work, and there is no second scoring path: the metric is the rollout's reward.

A demonstration is one of the model's own rollouts that scored well (BootstrapFewShot's idea):
its user/assistant turns become the few-shot turns of later candidates, either as earlier
turns (`few_shot`, when the env takes it) or rendered into the system prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from workbench.gepa.scoring import Candidate, CandidateScorer, DataItem
from workbench.types import Message, Rollout

EXAMPLES_HEADER = "Examples of good answers:"


def demo_turns(rollout: Rollout) -> list[Message]:
    """This example's own turns (its user message(s) after the system prompt and any few-shot
    turns, then the completion), as plain user/assistant/tool messages."""
    own_prompt = list(rollout.prompt)
    for i in range(len(own_prompt) - 1, -1, -1):  # the last user message opens this example's turns
        if own_prompt[i].get("role") == "user":
            own_prompt = own_prompt[i:]
            break
    return [
        {k: m[k] for k in ("role", "content", "tool_calls", "tool_call_id") if m.get(k) is not None}
        for m in [*own_prompt, *rollout.completion]
    ]


def render_into_prompt(system_prompt: str, few_shot: Sequence[Message]) -> str:
    """Demonstrations as text after the instruction, for envs that take no `few_shot` argument."""
    if not few_shot:
        return system_prompt
    lines = [system_prompt.rstrip(), "", EXAMPLES_HEADER]
    for message in few_shot:
        role = {"user": "Input", "assistant": "Output"}.get(
            str(message.get("role")), str(message.get("role"))
        )
        lines.append(f"{role}: {message.get('content') or ''}")
    return "\n".join(lines)


def candidate_from(instructions: str, demos: Sequence[Any], demos_as: str) -> Candidate:
    """The candidate a program's (instructions, demos) stands for."""
    turns = [m for demo in demos for m in (demo.get("turns") or [])]
    if demos_as == "system":
        return Candidate(render_into_prompt(instructions, turns))
    return Candidate(instructions, tuple(turns))


def make_program_class(dspy: ModuleType) -> type:
    """EnvProgram, defined once DSPy is imported (it subclasses dspy.Module)."""

    class EnvProgram(dspy.Module):  # type: ignore[name-defined]
        def __init__(self, scorer: CandidateScorer, seed_prompt: str, demos_as: str) -> None:
            super().__init__()
            self.scorer = _Shared(scorer)
            self.demos_as = demos_as
            self.prompt = dspy.Predict(dspy.Signature("question -> completion", instructions=seed_prompt))

        def candidate(self) -> Candidate:
            return candidate_from(self.prompt.signature.instructions, self.prompt.demos, self.demos_as)

        def forward(self, question: str, example_id: int, split: str) -> Any:
            rollout = self.scorer.target.score([DataItem(split, example_id)], self.candidate())[0]
            text = str(rollout.completion[-1].get("content") or "") if rollout.completion else ""
            prediction = dspy.Prediction(
                completion=text, turns=demo_turns(rollout), reward=float(rollout.reward)
            )
            if (
                dspy.settings.trace is not None
            ):  # what Predict.__call__ records: how bootstrapping finds demos
                inputs = {"question": question, "example_id": example_id, "split": split}
                dspy.settings.trace.append((self.prompt, inputs, prediction))
            return prediction

    return EnvProgram


class _Shared:
    """Holds the scorer so DSPy's many deep copies of a program all share the one scorer."""

    def __init__(self, target: CandidateScorer) -> None:
        self.target = target

    def __deepcopy__(self, memo: dict[int, Any]) -> _Shared:
        return self


def metric(example: Any, prediction: Any, trace: Any = None) -> float:
    """DSPy's metric: the env's reward, already computed by the engine for this rollout."""
    return float(prediction.reward)


def to_examples(dspy: ModuleType, rows: Sequence[dict[str, Any]], items: Sequence[DataItem]) -> list[Any]:
    """DataItems as dspy.Examples. `question` is only shown to DSPy's proposer; the rollout
    itself is built from the env's row (`example_id`, `split`)."""
    return [
        dspy.Example(
            question=_question(rows[item.index]), example_id=item.index, split=item.split
        ).with_inputs("question", "example_id", "split")
        for item in items
    ]


def _question(row: dict[str, Any]) -> str:
    value = row.get("question", row.get("prompt", ""))
    if isinstance(value, list):  # a chat prompt: its last user message
        users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        value = users[-1] if users else ""
    return str(value)
