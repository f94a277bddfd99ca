"""`workbench gepa compare ENV`: GEPA, MIPROv2 and bootstrap on one environment and one budget,
each checked on the same held-out examples, as one table.

Each optimizer is an ordinary run (its own folder, shown in the TUI's GEPA view) with the same
config but the optimizer; then `verify` evaluates its seed and best candidate on the same
held-out rows with the same seed. The table (held-out reward, gain with its 95% CI, metric calls,
prompt-model calls, wall time) is printed and saved as comparison.md and comparison.json in
environments/<env>/outputs/gepa/compare/<run_id>/.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from workbench.cli.gepa_verify import verify_run
from workbench.events import Reporter
from workbench.gepa.config import GepaConfig
from workbench.store.files import write_text_atomic
from workbench.store.runs import read_run_metadata
from workbench.workspace import gepa_runs_dir, new_run_id


@dataclass(frozen=True)
class Row:
    optimizer: str
    run_dir: str
    status: str
    val_seed: float | None
    val_best: float | None
    heldout_seed: float
    heldout_best: float
    diff: float
    ci_low: float
    ci_high: float
    verdict: str
    metric_calls: int
    max_calls: int
    prompt_model_calls: int
    wall_s: float


def compare_optimizers(
    base: GepaConfig,
    optimizers: list[str],
    heldout: int,
    rollouts: int,
    run_reporter: Reporter,
    eval_reporter: Reporter,
) -> tuple[Path, list[Row]]:
    """Run each optimizer with `base` (its output_dir ignored), verify each; the table's folder and rows."""
    from workbench.gepa import run_gepa

    rows: list[Row] = []
    compare_dir = gepa_runs_dir(base.env_id, base.model).parent / "compare" / new_run_id()
    for optimizer in optimizers:
        config = base.model_copy(update={"optimizer": optimizer, "output_dir": None})
        started = time.perf_counter()
        result = run_gepa(config, run_reporter)
        wall = time.perf_counter() - started
        check = verify_run(str(result.run_dir), heldout, rollouts, reporter=eval_reporter)
        meta = read_run_metadata(result.run_dir, "gepa")
        d = check.check.difference
        rows.append(
            Row(
                optimizer,
                str(result.run_dir),
                result.status,
                result.seed_score,
                result.best_score,
                d.mean_a,
                d.mean_b,
                d.diff,
                d.low,
                d.high,
                d.verdict,
                result.metric_calls_used,
                result.max_calls,
                sum(getattr(meta, "reflections", {}).values()),
                round(wall, 1),
            )
        )
        write_comparison(
            compare_dir, base, heldout, rollouts, rows
        )  # after each: a Ctrl-C keeps what is done
    return compare_dir, rows


def markdown(base: GepaConfig, heldout: int, rollouts: int, rows: list[Row]) -> str:
    lines = [
        f"# Prompt optimizers on {base.env_id} · {base.model} · budget {base.max_calls} metric calls",
        "",
        f"train {base.num_train}, validation {base.num_val}, held-out {heldout} eval rows × {rollouts} rollouts "
        f"(seed {base.seed}); reflection/prompt model: {base.reflection_model_name}",
        "",
        "| optimizer | validation seed → best | held-out seed → best | held-out gain [95% CI] | metric calls "
        "| prompt-model calls | wall time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        val = f"{_fmt(r.val_seed)} → {_fmt(r.val_best)}"
        lines.append(
            f"| {r.optimizer} | {val} | {r.heldout_seed:.3f} → {r.heldout_best:.3f} | {r.diff:+.3f} "
            f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}] ({r.verdict}) | {r.metric_calls} of {r.max_calls} "
            f"| {r.prompt_model_calls} | {r.wall_s:.0f} s |"
        )
    return "\n".join(lines) + "\n"


def write_comparison(folder: Path, base: GepaConfig, heldout: int, rollouts: int, rows: list[Row]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / "comparison.md", markdown(base, heldout, rollouts, rows))
    data = {
        "config": base.model_dump(mode="json"),
        "heldout": heldout,
        "rollouts": rollouts,
        "rows": [asdict(r) for r in rows],
    }
    write_text_atomic(folder / "comparison.json", json.dumps(data, indent=1) + "\n")


def _fmt(score: float | None) -> str:
    return "-" if score is None else f"{score:.3f}"
