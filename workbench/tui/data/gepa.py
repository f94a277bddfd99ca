"""GEPA run reader: candidates with scores, the Pareto frontier, the best prompt and its diff
against the seed prompt, from `metadata.json`, `pareto_frontier.jsonl` and `best_prompt.txt`.
Runs of DSPy optimizers (metadata `optimizer`: "miprov2", "bootstrap") have the same layout; their
candidates may carry few-shot turns (`few_shot`, and `best_few_shot.json` for the best one).

Read defensively: a key that is missing (an older or newer writer, a run still starting) shows
as '-' instead of failing, and a few spellings of each key are accepted.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.store.files import iter_jsonl, read_json
from workbench.types import is_number

OPTIMIZER_NAMES = {
    "gepa": "GEPA",
    "miprov2": "MIPROv2",
    "bootstrap": "BootstrapFewShot",
}  # how the header names them


def first(data: Any, *keys: str, default: Any = None) -> Any:
    """The value of the first key present (and not None) in a dict."""
    if not isinstance(data, dict):
        return default
    for key in keys:
        if data.get(key) is not None:
            return data[key]
    return default


def _num(value: Any) -> float | None:
    return float(value) if is_number(value) else None


def prompt_text(value: Any) -> str | None:
    """A candidate's prompt: a string, or {'system_prompt': ...} (GEPA's candidate dict)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        text = first(value, "system_prompt", "prompt", "text")
        if isinstance(text, str):
            return text
        if len(value) == 1 and isinstance(next(iter(value.values())), str):
            return next(iter(value.values()))
    return None


def few_shot_turns(value: Any) -> list[dict[str, Any]]:
    """Few-shot turns: the chat messages in `value` that have a role (anything else is dropped)."""
    if not isinstance(value, list):
        return []
    return [m for m in value if isinstance(m, dict) and isinstance(m.get("role"), str)]


def few_shot_lines(turns: list[dict[str, Any]]) -> list[str]:
    """The turns as text: a 'few-shot turns:' heading, then 'role: content' per message, the
    content's later lines indented under it. Empty when there are none."""
    if not turns:
        return []
    lines = [f"few-shot turns ({len(turns)} messages):"]
    for message in turns:
        content = message.get("content")
        text = content if isinstance(content, str) else "" if content is None else str(content)
        first_line, *rest = text.split("\n") or [""]
        lines.append(f"  {message['role']}: {first_line}")
        lines.extend(f"    {line}" for line in rest)
    return lines


def candidate_text(prompt: str | None, turns: list[dict[str, Any]]) -> str | None:
    """A candidate as text: its prompt, then its few-shot turns (if any) after a blank line."""
    if not turns:
        return prompt
    return "\n".join([prompt or "-", "", *few_shot_lines(turns)])


@dataclass
class Candidate:
    index: int
    score: float | None
    prompt: str | None
    parents: list[int] = field(default_factory=list)
    metric_calls: int | None = None
    few_shot: list[dict[str, Any]] = field(default_factory=list)  # DSPy candidates' demonstrations as turns


@dataclass
class FrontierRow:
    example: str
    best_score: float | None
    candidates: list[str]


@dataclass
class GepaRun:
    path: Path
    metadata: dict[str, Any]
    candidates: list[Candidate]
    frontier: list[FrontierRow]
    best_prompt: str | None
    seed_prompt: str | None
    best_few_shot: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.metadata.get("status") or "-")

    @property
    def optimizer(self) -> str:
        """Which optimizer wrote the run ("gepa" for runs from before DSPy optimizers existed)."""
        value = self.metadata.get("optimizer")
        return value if isinstance(value, str) and value else "gepa"

    @property
    def optimizer_name(self) -> str:
        return OPTIMIZER_NAMES.get(self.optimizer.lower(), self.optimizer)

    @property
    def seed_score(self) -> float | None:
        score = _num(first(self.metadata, "seed_score", "initial_score", "base_score"))
        if score is None and self.candidates:
            return self.candidates[0].score
        return score

    @property
    def best_score(self) -> float | None:
        score = _num(first(self.metadata, "best_score", "best_val_score"))
        if score is None:
            scores = [c.score for c in self.candidates if c.score is not None]
            return max(scores) if scores else None
        return score

    @property
    def best_index(self) -> int | None:
        index = first(self.metadata, "best_index", "best_idx", "best_candidate")
        if isinstance(index, int):
            return index
        scored = [(c.score, c.index) for c in self.candidates if c.score is not None]
        return max(scored, key=lambda pair: pair[0])[1] if scored else None  # the first of the best

    @property
    def metric_calls(self) -> int | None:
        value = first(self.metadata, "metric_calls_used", "metric_calls", "total_metric_calls")
        return int(value) if isinstance(value, int | float) else None

    def prompt_diff(self) -> list[str]:
        """Unified diff lines, seed prompt -> best prompt (empty when either is unknown). The best
        candidate's few-shot turns, when it has some, are part of its text (the seed has none)."""
        best = candidate_text(self.best_prompt, self.best_few_shot)
        if self.seed_prompt is None or best is None:
            return []
        return list(
            difflib.unified_diff(
                self.seed_prompt.splitlines(), best.splitlines(), "seed prompt", "best prompt", lineterm=""
            )
        )


def _candidates(meta: dict[str, Any]) -> list[Candidate]:
    raw = first(meta, "candidates", default=[])
    out: list[Candidate] = []
    if not isinstance(raw, list):
        return out
    for position, item in enumerate(raw):
        if isinstance(item, dict):
            index = first(item, "index", "idx", "id", default=position)
            parents = first(item, "parents", "parent", default=[])
            if isinstance(parents, int):
                parents = [parents]
            parents = [p for p in parents if isinstance(p, int)] if isinstance(parents, list) else []
            calls = first(item, "discovered_at_calls", "metric_calls", "discovered_at")
            out.append(
                Candidate(
                    index=index if isinstance(index, int) else position,
                    score=_num(
                        first(item, "score", "val_score", "val_aggregate_score", "mean_score", "reward_mean")
                    ),
                    prompt=prompt_text(first(item, "system_prompt", "prompt", "candidate", "text")),
                    parents=parents,
                    metric_calls=int(calls) if isinstance(calls, int | float) else None,
                    few_shot=few_shot_turns(first(item, "few_shot", "demos")),
                )
            )
        else:
            out.append(Candidate(index=position, score=None, prompt=prompt_text(item)))
    return out


def _frontier(path: Path) -> list[FrontierRow]:
    rows = []
    for position, record in enumerate(iter_jsonl(path)):
        example = first(record, "example_id", "val_id", "example", "index", "id", default=position)
        raw = first(
            record, "candidates", "candidate_indices", "best_candidates", "programs", "prompts", default=[]
        )
        raw = raw if isinstance(raw, list) else [raw]
        names = [f"#{c}" if isinstance(c, int) else (prompt_text(c) or str(c)) for c in raw]
        rows.append(FrontierRow(str(example), _num(first(record, "best_score", "score")), names))
    return rows


def _best_few_shot(
    path: Path, meta: dict[str, Any], candidates: list[Candidate], best_index: int | None
) -> list[dict[str, Any]]:
    """The best candidate's few-shot turns: best_few_shot.json, else the metadata's, else the
    best candidate's own. Empty for a run that rendered them into best_prompt.txt (demos_as
    'system'): shown again under it, they would look like a second set."""
    if meta.get("demos_as") == "system":
        return []
    try:
        turns = few_shot_turns(read_json(path / "best_few_shot.json"))
    except (OSError, ValueError):
        turns = []
    turns = turns or few_shot_turns(meta.get("best_few_shot"))
    return turns or next((c.few_shot for c in candidates if c.index == best_index), [])


def load_gepa_run(path: Path) -> GepaRun:
    try:
        meta = read_json(path / "metadata.json")
    except (OSError, ValueError):
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    candidates = _candidates(meta)
    best_file = path / "best_prompt.txt"
    best = best_file.read_text(encoding="utf-8") if best_file.is_file() else None
    config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    seed = prompt_text(first(meta, "seed_prompt", "seed_candidate")) or prompt_text(
        first(config, "seed_prompt", "system_prompt")
    )
    if seed is None and candidates:
        seed = candidates[0].prompt
    index = GepaRun(path, meta, candidates, [], None, seed).best_index
    if best is None:
        best = next((c.prompt for c in candidates if c.index == index), None)
    return GepaRun(
        path,
        meta,
        candidates,
        _frontier(path / "pareto_frontier.jsonl"),
        best,
        seed,
        _best_few_shot(path, meta, candidates, index),
    )
