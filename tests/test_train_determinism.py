"""The same config and seed give the same run (issue 33, item 8), through the CLI: two
uninterrupted CPU runs have identical metrics and byte-identical checkpoints, and a run resumed
from its checkpoint ends with the same adapter bytes as one that never stopped — on a busy
machine too (the suite runs this beside other tests)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.test_eval_run import run_cli
from tests.test_train import write_config

pytestmark = pytest.mark.slow

TIMING = ("time/", "perf/", "rollout/generation_time")
FINAL = Path("checkpoints") / "step_000003" / "adapter_model.safetensors"


def _train(workspace: Path, config: Path, run: str) -> Path:
    done = run_cli("train", str(config), "--set", f"output_dir='runs/{run}'", cwd=workspace)
    assert done.returncode == 0, done.stderr
    return workspace / "runs" / run


def _numbers(run_dir: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in m.items() if not k.startswith(TIMING)} for m in lines]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_run_and_resume_is_bit_exact(tiny_workspace: Path):
    three = write_config(tiny_workspace, "three", 3)
    a, b = _train(tiny_workspace, three, "a"), _train(tiny_workspace, three, "b")
    assert _numbers(a) == _numbers(b) and len(_numbers(a)) == 3
    assert _sha(a / FINAL) == _sha(b / FINAL)

    split = _train(tiny_workspace, write_config(tiny_workspace, "two", 2), "split")
    resumed = run_cli("train", "--resume", str(split), "--set", "max_steps=3", cwd=tiny_workspace)
    assert resumed.returncode == 0, resumed.stderr
    assert _numbers(split) == _numbers(a)  # steps 1-2 from the first session, 3 from the resume
    assert _sha(split / FINAL) == _sha(a / FINAL)
