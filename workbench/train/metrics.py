"""Step metrics: one JSON line per step in metrics.jsonl, and Weights & Biases (offline unless
WANDB_API_KEY is set). Names follow DESIGN §7 (`reward/mean`, `train/loss`, ...)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from workbench.errors import redact_values
from workbench.store.runs import METRICS
from workbench.train.schema import WandbConfig

# The names prime-rl's docs list for its W&B charts -> ours: a dashboard written for those docs
# finds its curves. Both names are logged, with the same value. (prime-rl's per-environment
# mismatch_kl/<env>/... has no counterpart: a step's tokens are not split by environment here.)
METRIC_ALIASES = {
    "train/reward": "reward/mean",
    "train/kl_divergence": "policy/kl",
    "mismatch_kl/all/mean": "policy/mismatch_kl",
    "mismatch_kl/all/std": "policy/mismatch_kl_std",
    "mismatch_kl/all/max": "policy/mismatch_kl_max",
    "masked_advantage_positive/mean": "policy/masked_advantage_positive",
    "masked_advantage_negative/mean": "policy/masked_advantage_negative",
}


def with_aliases(metrics: dict[str, Any]) -> dict[str, Any]:
    """`metrics` plus every alias whose source metric is present."""
    return {**metrics, **{alias: metrics[name] for alias, name in METRIC_ALIASES.items() if name in metrics}}


class MetricsLogger:
    def __init__(
        self,
        run_dir: Path,
        wandb_config: WandbConfig,
        run_name: str,
        config_dict: dict[str, Any],
        resume: bool,
    ) -> None:
        self.path = run_dir / METRICS
        self._wandb = None
        mode = wandb_config.mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        if mode != "disabled":
            import wandb

            self._wandb = wandb.init(
                project=wandb_config.project or "workbench",
                name=wandb_config.name or run_name,
                entity=wandb_config.entity,
                mode=mode,
                dir=str(run_dir),
                config=redact_values(config_dict),
                id=_wandb_id(run_dir),
                resume="allow" if resume else None,
                reinit="finish_previous",
                settings=wandb.Settings(silent=True, console="off"),
            )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        metrics = with_aliases(metrics)
        with self.path.open("ab") as f:
            f.write(orjson.dumps({"step": step, **metrics}) + b"\n")
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


class NullMetricsLogger:
    """What ranks other than 0 log with in a multi-process run: nothing."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def _wandb_id(run_dir: Path) -> str:
    """A stable W&B run id per run folder, so a resumed run continues the same W&B run."""
    marker = run_dir / ".wandb_id"
    if marker.exists():
        return marker.read_text().strip()
    run_id = os.urandom(6).hex()
    marker.write_text(run_id)
    return run_id


def truncate_metrics(run_dir: Path, last_step: int) -> None:
    """Drop metric lines after `last_step` (steps after the checkpoint we resume from are redone)."""
    path = run_dir / METRICS
    if not path.exists():
        return
    kept = [line for line in path.read_bytes().splitlines() if line.strip() and _step(line) <= last_step]
    path.write_bytes(b"".join(line + b"\n" for line in kept))


def _step(line: bytes) -> int:
    try:
        return int(orjson.loads(line)["step"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return 1 << 62


STEP_LINE_KEYS = (
    ("reward/mean", "reward"),
    ("eval/reward_mean", "eval"),
    ("train/loss", "loss"),
    ("policy/entropy", "entropy"),
    ("policy/kl", "kl"),
    ("filter/dropped_groups", "dropped"),
    ("time/step", "s/step"),
)


def step_line(step: int, metrics: dict[str, Any], total: int | None = None) -> str:
    """The one line per step shown on the console and written to run.log."""
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    parts += [f"{label} {metrics[key]:.4g}" for key, label in STEP_LINE_KEYS if key in metrics]
    if "time/weight_sync" in metrics and "policy/lag" in metrics:  # server mode: how off-policy it ran
        parts.insert(-1 if "time/step" in metrics else len(parts), f"lag {metrics['policy/lag']}")
    return "  ".join(parts)
