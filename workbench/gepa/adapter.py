"""`WorkbenchAdapter`: the `gepa` library's GEPAAdapter over the shared rollout engine.

- A candidate is `{"system_prompt": ...}`; a data instance is a `DataItem` (split + row index).
- `evaluate` loads the env with the candidate prompt and runs one rollout per example through
  `run_rollouts` (usual concurrency, retries, errors recorded on the rollout, never raised);
  an example's score is its rollout's reward.
- `make_reflective_dataset` gives the reflection model, per example: the input, the output, the
  expected answer, each reward function's score, the error (if any) and the requested state
  columns.
- `Budget` counts metric calls exactly as gepa does (one per example evaluated) and refuses an
  evaluation that would pass `max_calls`: gepa itself only checks its budget between
  iterations, so without this the last iteration could overshoot by a whole validation pass.
- A model server's failure is never a score: an evaluation in which any rollout failed on the
  server (after the retries) raises `ServerFailures` instead (gepa records the iteration as
  failed and goes on; its calls are not spent), and a server that is gone (`ServerGone`) is kept
  in `server_gone` so the run stops, resumable, at the end of the iteration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gepa import EvaluationBatch
from gepa.core.adapter import ProposalFn

from workbench.engine import RetryPolicy, run_rollouts
from workbench.engine.retry import Notify
from workbench.errors import ServerGone
from workbench.gepa.bridge import AsyncBridge
from workbench.gepa.prompted_env import SYSTEM_PROMPT_COMPONENT, PromptedEnvs
from workbench.inference.client import Client
from workbench.types import Group, Message, Messages, Rollout, RolloutError, SamplingParams

FIELD_CHARS = 3000  # per reflective-dataset field: enough to judge an answer, bounded for the reflection prompt


@dataclass(frozen=True)
class DataItem:
    """One example GEPA can ask for: row `index` of the env's `split` ('train' or 'eval')."""

    split: str
    index: int


class BudgetSpent(Exception):
    """An evaluation would pass the metric-call budget; gepa logs it and the run stops."""


class ServerFailures(Exception):
    """Rollouts of an evaluation failed on the model server: it has no score (see module doc)."""


class Budget:
    """Metric calls used of `max_calls` (one call = one example scored with one candidate)."""

    def __init__(self, max_calls: int, used: int = 0) -> None:
        self.max_calls = max_calls
        self.used = used
        self.exhausted = used >= max_calls

    @property
    def remaining(self) -> int:
        return max(0, self.max_calls - self.used)

    def spend(self, calls: int) -> None:
        if self.used + calls > self.max_calls:
            self.exhausted = True
            raise BudgetSpent(f"{calls} more metric calls would pass the budget ({self.used} of {self.max_calls} used)")
        self.used += calls

    def refund(self, calls: int) -> None:
        """Calls of an evaluation that produced no scores (gepa does not count those either)."""
        self.used -= calls


class WorkbenchAdapter:
    """GEPAAdapter[DataItem, Rollout, dict] over `run_rollouts`. See module doc."""

    propose_new_texts: ProposalFn | None = None  # reflection goes through the reflection strategy (reflection.py)

    def __init__(self, envs: PromptedEnvs, client: Client, bridge: AsyncBridge, sampling: SamplingParams, *,
                 budget: Budget, max_concurrent: int = 32, state_columns: Sequence[str] = (),
                 perfect_score: float | None = 1.0, retry: RetryPolicy | None = None,
                 on_group: Callable[[Group], None] | None = None, notify: Notify | None = None) -> None:
        self.envs = envs
        self.client = client
        self.bridge = bridge
        self.sampling = sampling
        self.budget = budget
        self.max_concurrent = max_concurrent
        self.state_columns = list(state_columns)
        self.perfect_score = perfect_score
        self.retry = retry
        self.on_group = on_group
        self.notify = notify
        self.server_gone: ServerGone | None = None
        self.rollouts = 0
        self.rollout_errors = 0
        self._replay: tuple[str, dict[int, float]] | None = None

    # ----- resume ---------------------------------------------------------------------------
    def replay_seed_scores(self, prompt: str, scores_by_index: dict[int, float]) -> None:
        """On resume, gepa re-scores the seed on the validation set before it loads its saved state
        (and then discards the result): answer that one call from the saved scores instead."""
        self._replay = (prompt, dict(scores_by_index))

    def _replayed(self, batch: list[DataItem], prompt: str,
                  capture_traces: bool) -> EvaluationBatch[Rollout, dict[str, Any]] | None:
        if self._replay is None or capture_traces or prompt != self._replay[0]:
            return None
        scores = self._replay[1]
        if not all(item.split == "eval" and item.index in scores for item in batch):
            return None
        self._replay = None
        return EvaluationBatch(outputs=[{"example_id": i.index, "replayed": True} for i in batch],
                               scores=[float(scores[i.index]) for i in batch])

    # ----- GEPAAdapter ----------------------------------------------------------------------
    def evaluate(self, batch: list[DataItem], candidate: dict[str, str],
                 capture_traces: bool = False) -> EvaluationBatch[Rollout, dict[str, Any]]:
        prompt = candidate[SYSTEM_PROMPT_COMPONENT]
        replayed = self._replayed(batch, prompt, capture_traces)
        if replayed is not None:
            return replayed
        self.budget.spend(len(batch))
        try:
            rollouts = self._rollouts(batch, prompt)
        except ServerGone as exc:
            self.budget.refund(len(batch))
            self.server_gone = exc
            raise
        if lost := sum(r.error is not None and r.error.infrastructure for r in rollouts):
            self.budget.refund(len(batch))
            raise ServerFailures(f"{lost} of {len(rollouts)} rollouts failed on the model server (connection, "
                                 "timeout, 5xx after retries): this evaluation is not scored")
        return EvaluationBatch(
            outputs=[output_record(r, item.split) for r, item in zip(rollouts, batch, strict=True)],
            scores=[float(r.reward) for r in rollouts],
            trajectories=rollouts if capture_traces else None,
        )

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: EvaluationBatch[Rollout, dict[str, Any]],
                                components_to_update: list[str]) -> dict[str, list[dict[str, Any]]]:
        rollouts: list[Rollout] = eval_batch.trajectories or []
        records = [reflective_record(r, self.perfect_score) for r in rollouts]
        return {name: records for name in components_to_update}

    # ----- rollouts -------------------------------------------------------------------------
    def _rollouts(self, batch: list[DataItem], prompt: str) -> list[Rollout]:
        """One rollout per item, in batch order (a repeated item is run once and shared)."""
        done: dict[DataItem, Rollout] = {}
        for split in dict.fromkeys(item.split for item in batch):
            indices = list(dict.fromkeys(item.index for item in batch if item.split == split))
            for rollout in self._run_split(split, indices, prompt):
                done[DataItem(split, rollout.example_id)] = rollout
        return [done[item] for item in batch]

    def _run_split(self, split: str, indices: list[int], prompt: str) -> list[Rollout]:
        rows = self.envs.rows(split)
        collected: list[Rollout] = []

        def on_group(group: Group) -> None:
            collected.extend(group.rollouts)
            self.rollouts += len(group.rollouts)
            self.rollout_errors += sum(r.error is not None for r in group.rollouts)
            if self.on_group is not None:
                self.on_group(group)

        try:
            env, examples = self.envs.examples(prompt, split, indices)
            self.bridge.run(run_rollouts(env, self.client, examples, rollouts_per_example=1, sampling=self.sampling,
                                         max_concurrent=self.max_concurrent, on_group=on_group,
                                         state_columns=self.state_columns, retry=self.retry, notify=self.notify))
        except ServerGone:
            raise
        except Exception as exc:  # the env refuses this prompt (rollout errors are recorded by the engine itself)
            error = RolloutError.from_exception(exc, "env")
            seen = {r.example_id for r in collected}
            for i in indices:
                if i not in seen:  # every example left scores 0 with the error on it; the run goes on
                    on_group(Group(i, [failed_rollout(i, rows[i], error)]))
        return collected


def failed_rollout(index: int, row: dict[str, Any], error: RolloutError) -> Rollout:
    """A rollout that could not run (the env failed to load with the candidate prompt)."""
    prompt = [{"role": "user", "content": str(row.get("question", row.get("prompt", "")))}]
    return Rollout(example_id=index, rollout_index=0, prompt=prompt, answer=str(row.get("answer", "")),
                   reward=0.0, error=error, stop_condition="error")


# ----- what GEPA and the reflection model see ---------------------------------------------------
def output_record(rollout: Rollout, split: str) -> dict[str, Any]:
    """A small JSON-friendly summary of one rollout (gepa stores and writes outputs as it likes)."""
    return {"example_id": rollout.example_id, "split": split, "reward": rollout.reward,
            "completion": clip(render_messages(rollout.completion)),
            "error": None if rollout.error is None else f"{rollout.error.type}: {rollout.error.message}"}


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
    record["Scores"] = {name: f"{value:.3f}" if isinstance(value, float) else str(value) for name, value in scores.items()}
    if rollout.error is not None:
        record["Error"] = f"{rollout.error.where} error {rollout.error.type}: {clip(rollout.error.message, 1000)}"
    if rollout.state_columns:
        record["State"] = {k: clip(repr(v), 1000) for k, v in rollout.state_columns.items()}
    record["Feedback"] = feedback_text(rollout, perfect_score)
    return record


def feedback_text(rollout: Rollout, perfect_score: float | None) -> str:
    """A sentence or two that says how the answer was judged and what went wrong."""
    best = f" (a perfect answer scores {perfect_score:g})" if perfect_score is not None else ""
    parts = [f"This answer scored {rollout.reward:.3f}{best}."]
    if rollout.rewards:
        parts.append("Reward functions: " + ", ".join(f"{k} = {v:.3f}" for k, v in rollout.rewards.items()) + ".")
    if metrics := {k: v for k, v in rollout.metrics.items() if k not in rollout.rewards}:
        parts.append("Logged metrics (not part of the reward): "
                     + ", ".join(f"{k} = {v:.3f}" if isinstance(v, float) else f"{k} = {v}" for k, v in metrics.items()) + ".")
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
