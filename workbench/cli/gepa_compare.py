"""`workbench gepa compare ENV`: GEPA, MIPROv2, bootstrap and RL on one environment and one
rollout budget, each checked on the same held-out examples, as one table.

Each prompt optimizer is an ordinary run (its own folder, shown in the TUI's GEPA view) with the
same config but the optimizer; then `verify` evaluates its seed and best candidate on the same
held-out rows with the same seed. The `rl` arm (gepa_compare_rl.py) is an ordinary training run
whose rollouts fit the same budget; its starting model and final checkpoint are checked on those
rows the same way. The table (held-out reward, gain with its 95% CI, rollouts spent, gain per 100
rollouts and per minute, prompt-model calls, wall time) is printed and saved as comparison.md and
comparison.json in environments/<env>/outputs/gepa/compare/<run_id>/.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.cli.gepa_compare_rl import RL_ARM, heldout_start, run_rl_arm
from workbench.cli.gepa_verify import verify_run
from workbench.events import Reporter
from workbench.gepa.config import GepaConfig
from workbench.store.comparisons import (
    COMPARE_FOLDER,
    ComparisonRow,
    with_rates,
    write_comparison_json,
)
from workbench.store.files import write_text_atomic
from workbench.store.runs import read_run_metadata
from workbench.workspace import gepa_runs_dir, new_run_id

if TYPE_CHECKING:
    from workbench.train.schema import TrainConfig


@dataclass(frozen=True)
class RlArm:
    """The RL arm's training config and the file it was read from (rl.toml or --rl-config)."""

    config: TrainConfig
    path: Path


@dataclass(frozen=True)
class Reporters:
    prompt: Reporter  # a prompt optimizer's run (metric calls)
    train: Reporter  # the RL arm's training (steps)
    eval: Reporter  # the held-out evaluations


def compare_folder(base: GepaConfig) -> Path:
    """environments/<env>/outputs/gepa/compare/<new run id>/ (made when first written)."""
    return gepa_runs_dir(base.env_id, base.model).parent / COMPARE_FOLDER / new_run_id()


def compare_optimizers(
    base: GepaConfig,
    optimizers: list[str],
    heldout: int,
    rollouts: int,
    reporters: Reporters,
    folder: Path,
    rl: RlArm | None = None,
) -> list[ComparisonRow]:
    """Run each arm with `base` (its output_dir ignored), verify each; the table's rows, also
    written to `folder` after each arm (a Ctrl-C keeps what is done)."""
    from workbench.gepa import run_gepa

    rows: list[ComparisonRow] = []
    start = heldout_start(base)  # the rows every arm is checked on (verify_run counts the same)
    for optimizer in optimizers:
        if optimizer == RL_ARM:
            if rl is None:
                raise ValueError("the rl arm needs its training config")
            rows.append(
                run_rl_arm(
                    base, rl.config, rl.path, start, heldout, rollouts, reporters.train, reporters.eval
                )
            )
            write_comparison(folder, base, heldout, rollouts, rows)
            continue
        config = base.model_copy(update={"optimizer": optimizer, "output_dir": None})
        started = time.perf_counter()
        result = run_gepa(config, reporters.prompt)
        wall = time.perf_counter() - started
        check = verify_run(str(result.run_dir), heldout, rollouts, reporter=reporters.eval)
        meta = read_run_metadata(result.run_dir, "gepa")
        d = check.check.difference
        rows.append(
            with_rates(
                ComparisonRow(
                    optimizer=optimizer,
                    run_dir=str(result.run_dir),
                    status=result.status,
                    val_seed=result.seed_score,
                    val_best=result.best_score,
                    heldout_start=check.start,
                    heldout_n=d.n,
                    heldout_seed=d.mean_a,
                    heldout_best=d.mean_b,
                    diff=d.diff,
                    ci_low=d.low,
                    ci_high=d.high,
                    verdict=d.verdict,
                    metric_calls=result.metric_calls_used,
                    max_calls=result.max_calls,
                    prompt_model_calls=sum(getattr(meta, "reflections", {}).values()),
                    wall_s=round(wall, 1),
                    rollouts_spent=result.metric_calls_used,  # a metric call is one rollout
                    best=str(result.run_dir / "best_prompt.txt"),
                )
            )
        )
        write_comparison(folder, base, heldout, rollouts, rows)
    return rows


def markdown(base: GepaConfig, heldout: int, rollouts: int, rows: list[ComparisonRow]) -> str:
    arms = "Prompt optimizers and RL" if any(r.optimizer == RL_ARM for r in rows) else "Prompt optimizers"
    starts = sorted({r.heldout_start for r in rows if r.heldout_start is not None})
    first = f" from row {starts[0]}" if len(starts) == 1 else ""
    lines = [
        f"# {arms} on {base.env_id} · {base.model} · budget {base.max_calls} rollouts (metric calls) each",
        "",
        f"train {base.num_train}, validation {base.num_val}, held-out {heldout} eval rows{first} × {rollouts} "
        f"rollouts (seed {base.seed}); reflection/prompt model: {base.reflection_model_name}",
        "",
        "| optimizer | validation seed → best | held-out seed → best | held-out gain [95% CI] | rollouts spent "
        "| gain per 100 rollouts | gain per minute | prompt-model calls | wall time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        val = f"{_fmt(r.val_seed)} → {_fmt(r.val_best)}"
        spent = "-" if r.rollouts_spent is None else f"{r.rollouts_spent} of {r.max_calls}"
        lines.append(
            f"| {r.optimizer} | {val} | {r.heldout_seed:.3f} → {r.heldout_best:.3f} | {r.diff:+.3f} "
            f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}] ({r.verdict}) | {spent} | {_signed(r.gain_per_100_rollouts)} "
            f"| {_signed(r.gain_per_minute)} | {r.prompt_model_calls} | {r.wall_s:.0f} s |"
        )
    if any(r.optimizer == RL_ARM for r in rows):
        lines += [
            "",
            "rl: seed = the starting model, best = the final checkpoint, both with the environment's own "
            "prompt; rollouts spent = every training rollout; wall time = training (prompt arms: "
            "the optimizer's run), verification not included.",
        ]
    return "\n".join(lines) + "\n"


def write_comparison(
    folder: Path, base: GepaConfig, heldout: int, rollouts: int, rows: list[ComparisonRow]
) -> None:
    write_comparison_json(folder, base.model_dump(mode="json"), heldout, rollouts, rows)
    write_text_atomic(folder / "comparison.md", markdown(base, heldout, rollouts, rows))


def _fmt(score: float | None) -> str:
    return "-" if score is None else f"{score:.3f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.4f}"
