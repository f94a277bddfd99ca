"""The same config and seed give the same run (issue 33, item 8): two uninterrupted CPU runs
have identical metrics and byte-identical checkpoints, and a run resumed from its checkpoint
ends with the same adapter bytes as one that never stopped — on a busy machine too (the suite
runs this beside other tests)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.test_train import train, write_config

pytestmark = pytest.mark.slow

TIMING = ("time/", "perf/", "rollout/generation_time")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _numbers(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(TIMING)} for m in metrics]


def test_same_seed_same_run_and_resume_is_bit_exact(tiny_workspace: Path):
    a = train(write_config(tiny_workspace, "same", 3), "output_dir='runs/a'")
    b = train(write_config(tiny_workspace, "same", 3), "output_dir='runs/b'")
    assert _numbers(a.metrics) == _numbers(b.metrics)
    final = Path("checkpoints") / "step_000003" / "adapter_model.safetensors"
    assert _sha(a.run_dir / final) == _sha(b.run_dir / final)

    first = train(write_config(tiny_workspace, "split", 2), "output_dir='runs/split'")
    resumed = train(write_config(tiny_workspace, "split", 3), "output_dir='runs/split'", resume=first.run_dir)
    assert resumed.last_step == 3
    assert _numbers(resumed.metrics)[-1] == _numbers(a.metrics)[-1]
    assert _sha(resumed.run_dir / final) == _sha(a.run_dir / final)
