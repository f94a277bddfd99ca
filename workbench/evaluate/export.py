"""Find saved eval runs and export their rollouts as a flat table (csv, json, parquet)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.store.results import read_groups
from workbench.store.runs import RunMetadata, locate_run, read_run_metadata
from workbench.types import Group


def find_run(run_dir: str | None) -> Path:
    """An eval run folder: the one named (a path or run id), else the workspace's newest."""
    return locate_run(run_dir or "latest", "eval")


def load_run(path: Path) -> tuple[RunMetadata, list[Group]]:
    try:
        metadata = read_run_metadata(path, "eval")
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path / 'metadata.json'}: {exc}") from exc
    return metadata, read_groups(path)


def rollout_rows(groups: list[Group]) -> list[dict[str, Any]]:
    rows = []
    for group in groups:
        for r in group.rollouts:
            final = next((m for m in reversed(r.completion) if m.get("role") == "assistant"), {})
            last = final.get("content") or ""
            row: dict[str, Any] = {
                "example_id": r.example_id,
                "rollout_index": r.rollout_index,
                "task": r.task,
                "reward": r.reward,
                "group_mean": group.mean,
                "group_std": group.std,
                **{f"reward.{k}": v for k, v in r.rewards.items()},
                **{f"metric.{k}": v for k, v in r.metrics.items()},
                "num_turns": r.num_turns,
                "is_truncated": r.is_truncated,
                "stop_condition": r.stop_condition,
                "error": None if r.error is None else f"{r.error.where}:{r.error.type}: {r.error.message}",
                "prompt_tokens": r.usage.get("prompt_tokens", 0),
                "completion_tokens": r.usage.get("completion_tokens", 0),
                "answer": r.answer,
                "last_response": last,
            }
            if final.get("reasoning_content"):  # a thinking model: its answer and, apart, its thinking
                row["last_reasoning"] = final["reasoning_content"]
            row.update({f"state.{k}": str(v) for k, v in r.state_columns.items()})
            rows.append(row)
    return rows


def export_rollouts(groups: list[Group], fmt: str, output: Path | None, run_dir: Path) -> Path | None:
    """Write the table; returns the path written, or None when printed to stdout."""
    import pandas as pd

    frame = pd.DataFrame(rollout_rows(groups))
    if fmt == "parquet":
        target = output or run_dir / "results.parquet"
        frame.to_parquet(target, index=False)
        return target
    text = frame.to_csv(index=False) if fmt == "csv" else frame.to_json(orient="records", lines=True)
    if output is None:
        sys.stdout.write(text)
        return None
    output.write_text(text)
    return output
