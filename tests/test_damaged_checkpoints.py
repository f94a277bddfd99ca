"""Damaged checkpoints (issue 33, item 3): a checkpoint is complete only if every file its
manifest lists is there as written. `--resume` takes the newest intact one and says which it
skipped and why; `eval -m` on a damaged one says what is damaged, in one line, exit code 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_eval_run import run_cli
from tests.test_train import train, write_config
from workbench.store.checkpoints import MANIFEST, checkpoint_problem, list_checkpoints

pytestmark = pytest.mark.slow

ADAPTER = "adapter_model.safetensors"


def eval_cli(model: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_WORKSPACE"}
    args = [
        sys.executable,
        "-m",
        "workbench",
        "eval",
        "run",
        "reverse-text",
        "-m",
        str(model),
        "-n",
        "2",
        "-r",
        "1",
    ]
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def run(tiny_workspace: Path) -> Path:
    first = train(write_config(tiny_workspace, "d", 3), "output_dir='runs/damaged'")
    assert first.status == "finished" and len(list_checkpoints(first.run_dir)) == 3
    manifest = json.loads((first.run_dir / "checkpoints" / "step_000003" / MANIFEST).read_text())
    assert ADAPTER in manifest["files"] and "trainer_state.pt" in manifest["files"]
    return first.run_dir


def test_resume_skips_damaged_checkpoints_saying_why(run: Path, tiny_workspace: Path):
    step3, step2 = run / "checkpoints" / "step_000003", run / "checkpoints" / "step_000002"
    (step3 / ADAPTER).unlink()  # deleted
    data = bytearray((step2 / ADAPTER).read_bytes())
    data[-8:] = b"garbage!"  # same size, other contents
    (step2 / ADAPTER).write_bytes(bytes(data))
    assert checkpoint_problem(step3) == f"{ADAPTER} is missing"
    assert checkpoint_problem(step2) is None and "sha256 differs" in (
        checkpoint_problem(step2, hashes=True) or ""
    )

    resumed = run_cli("train", "--resume", str(run), "--set", "max_steps=4", cwd=tiny_workspace)
    assert resumed.returncode == 0, resumed.stderr
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4], steps  # steps 2-3 redone from step 1's checkpoint, written once each
    said = " ".join(resumed.stderr.split())
    assert (
        f"skipping checkpoint step_000002: {ADAPTER} has changed since it was written (sha256 differs)"
        in said
    )
    assert f"skipping checkpoint step_000003: {ADAPTER} is missing" in said
    assert [c.name for c in list_checkpoints(run)] == [
        "step_000001",
        "step_000002",
        "step_000003",
        "step_000004",
    ]
    [aside] = (run / "checkpoints").glob("set-aside-*")  # the damaged ones are kept, out of the way
    assert sorted(p.name for p in aside.iterdir()) == ["step_000002", "step_000003"]


def test_eval_of_a_damaged_checkpoint_says_what_is_damaged(run: Path, tiny_workspace: Path):
    step3 = run / "checkpoints" / "step_000003"
    (step3 / ADAPTER).write_bytes(b"not a safetensors file")  # truncated / overwritten
    for model in (step3, run):
        proc = eval_cli(model, tiny_workspace)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        [line] = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert (
            f"checkpoint {step3} is damaged: {ADAPTER} has 22 bytes" in line and "Workbench bug" not in line
        ), line
    assert "name an older one" in line and "step_000002" in line
    proc = eval_cli(run / "checkpoints" / "step_000002", tiny_workspace)  # an intact one still loads
    assert proc.returncode == 0, proc.stderr
