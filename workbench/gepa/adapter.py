"""`WorkbenchAdapter`: the `gepa` library's GEPAAdapter over the shared scorer (scoring.py).

- A candidate is `{"system_prompt": ...}`; a data instance is a `DataItem` (split + row index).
- `evaluate` scores the candidate prompt with `CandidateScorer` (one rollout per example through
  `run_rollouts`, errors recorded on the rollout, never raised); an example's score is its
  rollout's reward.
- `make_reflective_dataset` gives the reflection model, per example: the input, the output, the
  expected answer, each reward function's score, the error (if any) and the requested state
  columns.
- The scorer's `Budget` counts metric calls exactly as gepa does (one per example evaluated).
  A batch with server failures raises `ServerFailures` (gepa records the iteration as failed
  and goes on; its calls are not spent); a server that is gone stops the run, resumable, at the
  end of the iteration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gepa import EvaluationBatch
from gepa.core.adapter import ProposalFn

from workbench.errors import ServerGone
from workbench.gepa.prompted_env import SYSTEM_PROMPT_COMPONENT
from workbench.gepa.scoring import Budget, BudgetSpent, Candidate, CandidateScorer, DataItem, ServerFailures
from workbench.types import Message, Messages, Rollout

__all__ = [
    "Budget",
    "BudgetSpent",
    "DataItem",
    "ServerFailures",
    "WorkbenchAdapter",
]  # re-exported for callers

FIELD_CHARS = (
    3000  # per reflective-dataset field: enough to judge an answer, bounded for the reflection prompt
)


class WorkbenchAdapter:
    """GEPAAdapter[DataItem, Rollout, dict] over `CandidateScorer`. See module doc."""

    propose_new_texts: ProposalFn | None = (
        None  # reflection goes through the reflection strategy (reflection.py)
    )

    def __init__(self, scorer: CandidateScorer, perfect_score: float | None = 1.0) -> None:
        self.scorer = scorer
        self.perfect_score = perfect_score
        self._replay: tuple[str, dict[int, float]] | None = None

    @property
    def server_gone(self) -> ServerGone | None:
        return self.scorer.server_gone

    # ----- resume ---------------------------------------------------------------------------
    def replay_seed_scores(self, prompt: str, scores_by_index: dict[int, float]) -> None:
        """On resume, gepa re-scores the seed on the validation set before it loads its saved state
        (and then discards the result): answer that one call from the saved scores instead."""
        self._replay = (prompt, dict(scores_by_index))

    def _replayed(
        self, batch: list[DataItem], prompt: str, capture_traces: bool
    ) -> EvaluationBatch[Rollout, dict[str, Any]] | None:
        if self._replay is None or capture_traces or prompt != self._replay[0]:
            return None
        scores = self._replay[1]
        if not all(item.split == "eval" and item.index in scores for item in batch):
            return None
        self._replay = None
        return EvaluationBatch(
            outputs=[{"example_id": i.index, "replayed": True} for i in batch],
            scores=[float(scores[i.index]) for i in batch],
        )

    # ----- GEPAAdapter ----------------------------------------------------------------------
    def evaluate(
        self, batch: list[DataItem], candidate: dict[str, str], capture_traces: bool = False
    ) -> EvaluationBatch[Rollout, dict[str, Any]]:
        prompt = candidate[SYSTEM_PROMPT_COMPONENT]
        replayed = self._replayed(batch, prompt, capture_traces)
        if replayed is not None:
            return replayed
        rollouts = self.scorer.score(batch, Candidate(prompt))
        return EvaluationBatch(
            outputs=[output_record(r, item.split) for r, item in zip(rollouts, batch, strict=True)],
            scores=[float(r.reward) for r in rollouts],
            trajectories=rollouts if capture_traces else None,
        )

    def make_reflective_dataset(
        self,
        candidate: dict[str, str],
        eval_batch: EvaluationBatch[Rollout, dict[str, Any]],
        components_to_update: list[str],
    ) -> dict[str, list[dict[str, Any]]]:
        rollouts: list[Rollout] = eval_batch.trajectories or []
        records = [reflective_record(r, self.perfect_score) for r in rollouts]
        return {name: records for name in components_to_update}


# ----- what GEPA and the reflection model see ---------------------------------------------------
def output_record(rollout: Rollout, split: str) -> dict[str, Any]:
    """A small JSON-friendly summary of one rollout (gepa stores and writes outputs as it likes)."""
    return {
        "example_id": rollout.example_id,
        "split": split,
        "reward": rollout.reward,
        "completion": clip(render_messages(rollout.completion)),
        "error": None if rollout.error is None else f"{rollout.error.type}: {rollout.error.message}",
    }


def reflective_record(rollout: Rollout, perfect_score: float | None) -> dict[str, Any]:
    """One example for the reflection model: input, output, expected answer, scores, error, state."""
    inputs = [m for m in rollout.prompt if m.get("role") != "system"]  # the system prompt is shown separately
    record: dict[str, Any] = {
        "Inputs": clip(render_messages(inputs)),
        "Generated Outputs": clip(render_messages(rollout.completion)) or "(no output)",
    }
    if rollout.answer:
        record["Expected Answer"] = clip(rollout.answer)
    metrics = {k: v for k, v in rollout.metrics.items() if k not in rollout.rewards}
    scores = {"reward": rollout.reward, **rollout.rewards, **metrics}
    record["Scores"] = {
        name: f"{value:.3f}" if isinstance(value, float) else str(value) for name, value in scores.items()
    }
    if rollout.error is not None:
        record["Error"] = (
            f"{rollout.error.where} error {rollout.error.type}: {clip(rollout.error.message, 1000)}"
        )
    if rollout.state_columns:
        record["State"] = {k: clip(repr(v), 1000) for k, v in rollout.state_columns.items()}
    record["Feedback"] = feedback_text(rollout, perfect_score)
    return record


def feedback_text(rollout: Rollout, perfect_score: float | None) -> str:
    """A sentence or two that says how the answer was judged and what went wrong."""
    best = f" (a perfect answer scores {perfect_score:g})" if perfect_score is not None else ""
    parts = [f"This answer scored {rollout.reward:.3f}{best}."]
    if rollout.rewards:
        parts.append(
            "Reward functions: " + ", ".join(f"{k} = {v:.3f}" for k, v in rollout.rewards.items()) + "."
        )
    if metrics := {k: v for k, v in rollout.metrics.items() if k not in rollout.rewards}:
        parts.append(
            "Logged metrics (not part of the reward): "
            + ", ".join(
                f"{k} = {v:.3f}" if isinstance(v, float) else f"{k} = {v}" for k, v in metrics.items()
            )
            + "."
        )
    if rollout.answer:
        parts.append(f"The expected answer is: {clip(rollout.answer, 500)}")
    if rollout.error is not None:
        parts.append(f"The rollout failed with {rollout.error.type}: {clip(rollout.error.message, 500)}")
    if rollout.is_truncated:
        parts.append("The response was cut off (token or turn limit).")
    return " ".join(parts)


def render_messages(messages: Messages) -> str:
    """Messages as readable text: a lone message as its content, a conversation with role tags."""
    if len(messages) == 1 and not messages[0].get("tool_calls"):
        return message_text(messages[0])
    lines = []
    for message in messages:
        lines.append(f"[{message.get('role', '?')}] {message_text(message)}".rstrip())
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            lines.append(f"[tool call] {function.get('name', '?')}({function.get('arguments', '')})")
    return "\n".join(lines)


def message_text(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def clip(text: str, limit: int = FIELD_CHARS) -> str:
    """Head and tail of long text (the end of a long answer is often where it goes wrong)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


def scores_by_index(values: Mapping[Any, float]) -> dict[int, float]:
    """gepa's val ids are positions in the valset list, which are our eval row indices."""
    return {int(k): float(v) for k, v in values.items()}
