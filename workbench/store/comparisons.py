"""Optimizer comparisons: `environments/<env>/outputs/gepa/compare/<run_id>/comparison.json`, the
table `workbench gepa compare` writes (beside it, comparison.md), one row per arm: a prompt
optimizer (gepa, miprov2, bootstrap) or RL on the same rollout budget.

Each row names the arm's own run folder (a GEPA/DSPy run, or a training run for `rl`) and its
held-out check: the seed (starting prompt, starting model) against the best (best candidate,
final RL checkpoint) on the same eval rows, with the same seed and rollouts per example. Rows
are written after each arm, so an interrupted comparison keeps the arms it finished. Read
defensively: a row that does not parse (a newer or older writer) is skipped.

What an arm spent is counted here too: for RL, every rollout its steps generated
(`rollouts/step_N.jsonl`, groups the difficulty filter dropped included).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from workbench.store.files import read_json, write_text_atomic

COMPARE_FOLDER = "compare"  # beside the <env>--<model>/ folders of GEPA runs
COMPARISON_FILE = "comparison.json"


class ComparisonRow(BaseModel):
    """One arm of a comparison, verified on the held-out rows."""

    model_config = ConfigDict(extra="ignore")

    optimizer: str  # gepa | miprov2 | bootstrap | rl
    run_dir: str  # the arm's run folder (GEPA/DSPy run, or training run)
    status: str
    val_seed: float | None = None  # the optimizer's own validation scores (None for rl)
    val_best: float | None = None
    heldout_start: int | None = None  # first held-out eval row
    heldout_n: int | None = None  # held-out examples both sides were scored on
    heldout_seed: float
    heldout_best: float
    diff: float
    ci_low: float
    ci_high: float
    verdict: str
    metric_calls: int  # prompt arms: metric calls; rl: training rollouts (= rollouts_spent)
    max_calls: int  # the budget
    prompt_model_calls: int = 0
    wall_s: float  # the arm's optimization (or training) time; verification not included
    rollouts_spent: int | None = None
    gain_per_100_rollouts: float | None = None
    gain_per_minute: float | None = None
    best: str | None = None  # what "best" is: the final checkpoint's folder for rl


def with_rates(row: ComparisonRow) -> ComparisonRow:
    """`row` with its rates derived from `diff`, `rollouts_spent` and `wall_s`: held-out gain per
    100 rollouts and per minute of the arm's own wall time (None when there was nothing to divide by)."""
    spent = row.rollouts_spent
    return row.model_copy(
        update={
            "gain_per_100_rollouts": round(row.diff / spent * 100, 6) if spent else None,
            "gain_per_minute": round(row.diff / (row.wall_s / 60), 6) if row.wall_s > 0 else None,
        }
    )


@dataclass(frozen=True)
class Comparison:
    folder: Path
    env_id: str
    model: str
    budget: int | None  # rollouts (metric calls) each arm may spend
    heldout: int
    rollouts: int  # rollouts per held-out example
    rows: list[ComparisonRow]


def write_comparison_json(
    folder: Path, config: dict[str, Any], heldout: int, rollouts: int, rows: list[ComparisonRow], **extra: Any
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "config": config,
        "heldout": heldout,
        "rollouts": rollouts,
        **extra,
        "rows": [row.model_dump(mode="json") for row in rows],
    }
    write_text_atomic(
        folder / COMPARISON_FILE, orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n"
    )


def read_comparison(folder: Path) -> Comparison | None:
    """The comparison in `folder`; None when there is none or it cannot be read."""
    try:
        data = read_json(folder / COMPARISON_FILE)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    config = data.get("config")
    if not isinstance(config, dict):
        config = {}
    rows = []
    for item in data.get("rows") or []:
        try:
            rows.append(ComparisonRow.model_validate(item))
        except ValidationError:
            continue
    budget = config.get("max_calls")
    return Comparison(
        folder,
        str(config.get("env_id", "")),
        str(config.get("model", "")),
        budget if isinstance(budget, int) else None,
        _int(data.get("heldout")),
        _int(data.get("rollouts")),
        rows,
    )


def comparison_of(gepa_run: Path) -> Comparison | None:
    """The newest comparison that has `gepa_run` (a run folder under outputs/gepa/<env>--<model>/)
    as one of its arms, or None."""
    parent = gepa_run.parent.parent / COMPARE_FOLDER
    try:
        folders = sorted((p for p in parent.iterdir() if p.is_dir()), reverse=True)
    except OSError:
        return None
    wanted = _tail(gepa_run)
    for folder in folders:
        found = read_comparison(folder)
        if found is not None and any(_tail(Path(row.run_dir)) == wanted for row in found.rows):
            return found
    return None


def training_rollouts(run_dir: Path) -> int:
    """Every rollout a training run generated: the lines of its rollouts/step_N.jsonl files."""
    total = 0
    for path in sorted((run_dir / "rollouts").glob("step_*.jsonl")):
        with path.open("rb") as f:
            total += sum(1 for line in f if line.strip())
    return total


def _tail(path: Path) -> tuple[str, ...]:
    """<env>--<model>/<run_id>: how a row's run folder is matched (absolute or not)."""
    return path.parts[-2:]


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0
