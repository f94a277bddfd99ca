"""`-m` accepts a training run folder (its newest complete checkpoint) and `outputs/runs/latest`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workbench.errors import UserError
from workbench.inference.resolve import resolve_model_path
from workbench.workspace import model_label


def make_run(runs: Path, name: str, steps: list[int], *, complete: bool = True, mtime: float = 0.0) -> Path:
    for step in steps:
        folder = runs / name / "checkpoints" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text("{}")
        if complete:
            (folder / "trainer_state.json").write_text("{}")
            os.utime(folder, (mtime + step, mtime + step))
    return runs / name


def test_run_folder_means_its_newest_complete_checkpoint(tmp_path: Path):
    runs = tmp_path / "outputs" / "runs"
    run = make_run(runs, "a", [10, 20])
    (run / "checkpoints" / "step_000030").mkdir()  # being written: no trainer_state.json yet
    assert resolve_model_path(str(run)) == (run / "checkpoints" / "step_000020").resolve()
    assert model_label(str(run)) == "a-checkpoints-step_000020"


def test_latest_is_the_newest_run_with_a_checkpoint(tmp_path: Path):
    runs = tmp_path / "outputs" / "runs"
    make_run(runs, "old", [5], mtime=1_000)
    make_run(runs, "new", [5], mtime=2_000)
    make_run(runs, "empty", [])
    assert (
        resolve_model_path(str(runs / "latest")) == (runs / "new" / "checkpoints" / "step_000005").resolve()
    )


def test_run_without_checkpoints_is_one_clear_error(tmp_path: Path):
    runs = tmp_path / "outputs" / "runs"
    (runs / "fresh" / "checkpoints").mkdir(parents=True)
    with pytest.raises(UserError, match="has no complete checkpoint yet"):
        resolve_model_path(str(runs / "fresh"))
    with pytest.raises(UserError, match="no training run with a checkpoint"):
        resolve_model_path(str(runs / "latest"))
