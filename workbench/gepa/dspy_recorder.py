"""`DspyRecorder`: the run folder of a DSPy optimizer run, in the same files a GEPA run writes
(best_prompt.txt, pareto_frontier.jsonl, metadata.json, run.log), so `gepa verify`, `gepa
apply` and the TUI's GEPA view read both alike. With demonstrations as turns it also writes
best_few_shot.json (the best candidate's few-shot turns, what `-a '{"few_shot": ...}'` takes).

DSPy does not report its candidates as it goes; the scorer does: every validation example a
candidate is scored on lands here. A candidate is listed once it has a validation score, in
the order first scored (the seed first); its score is the mean over the validation examples it
was scored on (`val_examples` says how many). Files are rewritten each time a candidate
completes the validation set.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

from workbench.events import Reporter
from workbench.gepa.recorder import RunRecorder, Snapshot
from workbench.gepa.reflection import ReflectionEvent
from workbench.gepa.scoring import Budget, Candidate, DataItem
from workbench.store.files import write_text_atomic
from workbench.store.runs import GepaRun, RunStatus
from workbench.types import Rollout

BEST_FEW_SHOT = "best_few_shot.json"


def candidate_key(candidate: Candidate) -> str:
    return json.dumps([candidate.system_prompt, list(candidate.few_shot)], sort_keys=True)


class DspyRecorder(RunRecorder):
    """Candidates and their validation scores from the scorer → the run folder (module doc)."""

    def __init__(
        self,
        run_dir: Path,
        metadata: GepaRun,
        reporter: Reporter,
        budget: Budget,
        seed: Candidate,
        num_val: int,
    ) -> None:
        super().__init__(run_dir, metadata, reporter, budget)
        self.num_val = num_val
        self._lock = threading.RLock()  # DSPy scores from several threads
        self._index: dict[str, int] = {}
        self._candidates: list[Candidate] = []
        self._scores: list[dict[int, float]] = []
        self._found_at: list[int] = []
        self._chosen: int | None = None
        self._add(seed)

    def _add(self, candidate: Candidate) -> int:
        key = candidate_key(candidate)
        if key not in self._index:
            self._index[key] = len(self._candidates)
            self._candidates.append(candidate)
            self._scores.append({})
            self._found_at.append(self.budget.used)
        return self._index[key]

    # ----- from the scorer and the optimizer ---------------------------------------------------
    def scored(self, candidate: Candidate, items: Sequence[DataItem], rollouts: list[Rollout]) -> None:
        val = [
            (item.index, float(r.reward))
            for item, r in zip(items, rollouts, strict=True)
            if item.split == "eval"
        ]
        if not val:  # bootstrap passes score train examples: demos, not candidates
            return
        with self._lock:
            index = self._add(candidate)
            was_complete = len(self._scores[index]) >= self.num_val
            self._scores[index].update(val)
            if not was_complete and len(self._scores[index]) >= self.num_val:
                self.log.write(
                    f"candidate {index}: validation score {_mean(self._scores[index]):.4f} "
                    f"({len(candidate.few_shot) // 2 or 'no'} demos as turns)"
                )
                self.refresh()
                self.write()

    def proposal(self, status: str, detail: str, reply: str) -> None:
        """An instruction proposal of MIPROv2's prompt model, counted as GEPA counts reflections."""
        detail = reply if status == "proposed" else " ".join(detail.split())  # DSPy's errors span lines
        self.reflection_event(
            ReflectionEvent(status, "system_prompt", detail, "" if status == "proposed" else reply[:300])
        )

    def dspy_line(self, line: str) -> None:
        self.log.write(f"dspy: {line}")

    def choose(self, best: Candidate) -> None:
        """The candidate the optimizer returned (DSPy breaks ties its own way)."""
        with self._lock:
            self._chosen = self._index.get(candidate_key(best))
            self.refresh()

    # ----- files -------------------------------------------------------------------------------
    def calls_used(self) -> int:
        """Calls that were scored: a stopped run's calls still in flight in DSPy's threads are not."""
        return self.scorer.scored_calls if self.scorer is not None else self.budget.used

    def refresh(self) -> None:
        with self._lock:
            self.snapshot = self._snapshot()
            best = self._candidates[self.snapshot.best_index]
            self.metadata.best_few_shot = [dict(m) for m in best.few_shot]

    def write(self, status: RunStatus | None = None) -> None:
        with self._lock:
            super().write(status)
            if self.metadata.demos_as == "turns" and self.snapshot is not None:
                write_text_atomic(
                    self.run_dir / BEST_FEW_SHOT, json.dumps(self.metadata.best_few_shot, indent=1) + "\n"
                )

    def _snapshot(self) -> Snapshot:
        scored = [i for i, scores in enumerate(self._scores) if scores]
        candidates = [
            {
                "index": i,
                "val_score": _mean(self._scores[i]) if self._scores[i] else None,
                "val_examples": len(self._scores[i]),
                "parents": [],
                "discovered_at_calls": self._found_at[i],
                "prompt": self._candidates[i].system_prompt,
                "few_shot": list(self._candidates[i].few_shot),
            }
            for i in range(len(self._candidates))
        ]
        complete = [i for i in scored if len(self._scores[i]) >= self.num_val] or scored or [0]
        best = (
            self._chosen
            if self._chosen is not None
            else max(complete, key=lambda i: (_mean(self._scores[i]), -i))
        )
        frontier = []
        for example in sorted({e for i in complete for e in self._scores[i]}):
            reached = {i: self._scores[i][example] for i in complete if example in self._scores[i]}
            top = max(reached.values())
            winners = [i for i, score in reached.items() if score == top]
            frontier.append(
                {
                    "example_id": example,
                    "best_score": top,
                    "candidates": winners,
                    "prompts": [self._candidates[i].system_prompt for i in winners],
                }
            )
        return Snapshot(
            iterations=len(scored),
            metric_calls=self.budget.used,
            candidates=candidates,
            best_index=best,
            frontier=frontier,
        )


def _mean(scores: dict[int, float]) -> float:
    return sum(scores.values()) / len(scores) if scores else 0.0
