"""`RunRecorder`: turns gepa's callbacks into the run folder's files, run.log and progress events.

Files (DESIGN §9), rewritten at every iteration boundary so a watcher (the TUI) or an
interrupted run always has them current:
- `best_prompt.txt`: the candidate with the best mean validation score.
- `pareto_frontier.jsonl`: per validation example, the best score and the prompts reaching it.
- `metadata.json`: kind "gepa", status, config, seed and best score, every candidate with its
  score, metric calls used of the budget, reflection outcomes, errors, time.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from workbench.errors import ServerGone
from workbench.events import Reporter
from workbench.gepa.prompted_env import SYSTEM_PROMPT_COMPONENT
from workbench.gepa.reflection import ReflectionEvent
from workbench.gepa.scoring import Budget, BudgetSpent, CandidateScorer
from workbench.store.files import write_text_atomic
from workbench.store.runs import RUN_LOG, GepaRun, RunLog, RunStatus, now_iso, write_run_metadata
from workbench.types import Group

MAX_ERROR_STREAK = 5  # iterations failing in a row (a bug, not bad luck): stop instead of spinning
RECENT_EVENTS = 50  # reflection problems and errors kept in metadata.json (all of them go to run.log)


@dataclass
class Snapshot:
    """The optimization's standing at an iteration boundary (from gepa's state)."""

    iterations: int
    metric_calls: int
    candidates: list[dict[str, Any]]
    best_index: int
    frontier: list[dict[str, Any]] = field(default_factory=list)

    @property
    def seed_score(self) -> float | None:
        return self.candidates[0]["val_score"] if self.candidates else None

    @property
    def best_score(self) -> float | None:
        return self.candidates[self.best_index]["val_score"] if self.candidates else None

    @property
    def best_prompt(self) -> str:
        return self.candidates[self.best_index]["prompt"] if self.candidates else ""


def snapshot_of(state: Any) -> Snapshot:
    """Read what the run folder needs from a `gepa.core.state.GEPAState`."""
    from gepa.strategies.eval_policy import FullEvaluationPolicy

    candidates = []
    for i, program in enumerate(state.program_candidates):
        scores = state.prog_candidate_val_subscores[i]
        candidates.append(
            {
                "index": i,
                "val_score": sum(scores.values()) / len(scores) if scores else None,
                "val_examples": len(scores),
                "parents": [p for p in state.parent_program_for_candidate[i] if p is not None],
                "discovered_at_calls": state.num_metric_calls_by_discovery[i],
                "prompt": program[SYSTEM_PROMPT_COMPONENT],
            }
        )
    frontier = []
    for val_id in sorted(state.pareto_front_valset, key=lambda v: (str(type(v)), v)):
        programs = sorted(state.program_at_pareto_front_valset.get(val_id, ()))
        frontier.append(
            {
                "example_id": val_id,
                "best_score": state.pareto_front_valset[val_id],
                "candidates": programs,
                "prompts": [state.program_candidates[p][SYSTEM_PROMPT_COMPONENT] for p in programs],
            }
        )
    return Snapshot(
        iterations=state.i + 1,
        metric_calls=state.total_num_evals,
        candidates=candidates,
        best_index=max(FullEvaluationPolicy().get_best_program(state), 0),
        frontier=frontier,
    )


class GepaLog(RunLog):
    """run.log, also serving as gepa's logger (so the library never prints to the terminal).
    Prompts span lines; they are logged with escaped newlines so one entry stays one line."""

    def log(self, message: str) -> None:  # gepa's LoggerProtocol
        text = str(message)
        self.write(f"gepa: {text if text.startswith('Traceback') else one_line(text)}")


def one_line(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


class RunRecorder:
    """gepa callbacks (on_*) plus the adapter's and reflector's events → files, log, reporter."""

    def __init__(
        self,
        run_dir: Path,
        metadata: GepaRun,
        reporter: Reporter,
        budget: Budget,
        scorer: CandidateScorer | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.metadata = metadata
        self.reporter = reporter
        self.budget = budget
        self.scorer = scorer
        self.log = GepaLog(run_dir / RUN_LOG)
        self.snapshot: Snapshot | None = None
        self.iteration = 0
        self.error_streak = 0
        self.last_error: str | None = None
        self._errored = False
        self._started = time.monotonic()
        self._elapsed_before = metadata.elapsed_s or 0.0

    # ----- progress from the adapter and the reflector --------------------------------------
    def group_done(self, group: Group) -> None:
        best = self.snapshot.best_score if self.snapshot else None
        self.reporter.group_done(group, {"reward_mean": best if best is not None else group.mean})
        for rollout in group.rollouts:
            if rollout.error is not None:
                self.log.write(
                    f"example {group.example_id}: {rollout.error.where} error {rollout.error.type}: "
                    f"{one_line(rollout.error.message[:300])}"
                )

    def notice(self, line: str) -> None:
        """A retry worth knowing of (a stall, a server restarting): to the log and the user."""
        self.log.write(line)
        self.reporter.message(line)

    def reflection_event(self, event: ReflectionEvent) -> None:
        counts = self.metadata.reflections
        counts[event.status] = counts.get(event.status, 0) + 1
        reply = f"; reply: {event.reply!r}" if event.reply else ""
        self.log.write(
            f"iteration {self.iteration}: reflection {event.status}: {one_line(event.detail[:2000])}{reply}"
        )
        if event.status != "proposed":
            self._event("reflection_" + event.status, event.detail + reply)
            what = (
                "no usable prompt in the reflection reply"
                if event.status == "unusable"
                else "reflection call failed"
            )
            self.reporter.message(f"iteration {self.iteration}: {what} ({event.detail[:160]}); skipped")

    def _event(self, kind: str, detail: str) -> None:
        events = self.metadata.events
        events.append(
            {"iteration": self.iteration, "kind": kind, "detail": detail[:1000], "at_calls": self.budget.used}
        )
        del events[:-RECENT_EVENTS]

    # ----- gepa callbacks ---------------------------------------------------------------------
    def on_iteration_start(self, event: dict[str, Any]) -> None:
        self.iteration = event["iteration"]
        self._errored = False
        self.take_snapshot(event["state"])
        self.write()

    def on_iteration_end(self, event: dict[str, Any]) -> None:
        if not self._errored:
            self.error_streak = 0
        self.take_snapshot(event["state"])
        self.write()

    def on_valset_evaluated(self, event: dict[str, Any]) -> None:
        score = event["average_score"]
        if event["iteration"] == 0:
            self.log.write(
                f"seed prompt: validation score {score:.4f} over {event['num_examples_evaluated']} examples"
            )
            return
        best = " (new best)" if event["is_best_program"] else ""
        line = f"iteration {event['iteration']}: candidate {event['candidate_idx']} accepted, validation score {score:.4f}{best}"
        self.log.write(line)
        self.reporter.message(line)

    def on_candidate_rejected(self, event: dict[str, Any]) -> None:
        self.log.write(f"iteration {event['iteration']}: candidate rejected: {event['reason']}")

    def on_error(self, event: dict[str, Any]) -> None:
        exc = event["exception"]
        if isinstance(exc, BudgetSpent):
            self.log.write(f"iteration {event['iteration']}: budget spent: {exc}")
            return
        self._errored = True
        self.error_streak += 1
        self.metadata.iteration_errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        self._event("iteration_error", self.last_error)
        self.log.write(
            f"iteration {event['iteration']}: error {self.last_error}\n"
            + "".join(traceback.format_exception(exc))
        )
        going = "stopping" if isinstance(exc, ServerGone) else "recorded; going on"
        self.reporter.message(f"iteration {event['iteration']}: error {self.last_error[:200]} ({going})")

    def on_optimization_end(self, event: dict[str, Any]) -> None:
        self.take_snapshot(event["final_state"])

    # ----- gepa stop condition ----------------------------------------------------------------
    def should_stop(self, state: Any, minibatch_size: int, perfect_score: float | None) -> bool:
        """Stop before an iteration that cannot afford its first minibatch, once the best prompt is
        perfect on every validation example (nothing left to gain), or after repeated failures."""
        self.take_snapshot(state)
        if (
            self.budget.exhausted
            or self.budget.remaining < minibatch_size
            or self.error_streak >= MAX_ERROR_STREAK
        ):
            return True
        if self.scorer is not None and self.scorer.server_gone is not None:
            return True
        best = self.snapshot.best_score if self.snapshot else None
        if perfect_score is not None and best is not None and best >= perfect_score:
            if not self.metadata.stopped_early:
                self.metadata.stopped_early = (
                    "the best prompt reaches the perfect score on every validation example"
                )
                self.log.write(f"stopping early: {self.metadata.stopped_early}")
            return True
        return False

    # ----- files ------------------------------------------------------------------------------
    def take_snapshot(self, state: Any) -> None:
        self.snapshot = snapshot_of(state)

    def calls_used(self) -> int:
        return self.budget.used

    def close(self, status: RunStatus) -> None:
        """The run's last write, and its last log line."""
        self.write(status)
        snap = self.snapshot
        seed, best = (snap.seed_score, snap.best_score) if snap else (None, None)
        self.log.write(
            f"{status}: {self.calls_used()}/{self.budget.max_calls} metric calls, "
            f"seed {_fmt(seed)} -> best {_fmt(best)}"
        )

    def write(self, status: RunStatus | None = None) -> None:
        meta = self.metadata
        if status is not None:
            meta.status = status
        meta.updated_at = now_iso()
        meta.elapsed_s = round(self._elapsed_before + time.monotonic() - self._started, 3)
        meta.metric_calls_used = self.calls_used()
        meta.max_calls = self.budget.max_calls
        if self.scorer is not None:
            meta.rollouts = self.scorer.rollouts
            meta.rollout_errors = self.scorer.rollout_errors
        snap = self.snapshot
        if snap is not None:
            meta.iterations, meta.seed_score, meta.best_score = (
                snap.iterations,
                snap.seed_score,
                snap.best_score,
            )
            meta.best_candidate, meta.num_candidates, meta.candidates = (
                snap.best_index,
                len(snap.candidates),
                snap.candidates,
            )
            write_text_atomic(self.run_dir / "best_prompt.txt", snap.best_prompt + "\n")
            write_text_atomic(
                self.run_dir / "pareto_frontier.jsonl",
                "".join(orjson.dumps(row).decode() + "\n" for row in snap.frontier),
            )
        write_run_metadata(self.run_dir, meta)


def _fmt(score: float | None) -> str:
    return "-" if score is None else f"{score:.4f}"
