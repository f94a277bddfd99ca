"""`--dtype` for a model run in this process (`eval run`, an eval TOML's `dtype`, `serve`): the
weights load in that dtype and the run's config records it; a model on a server refuses it in one
line before anything is written; a CPU without native bf16 is told float32 is likely faster."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cli
from workbench.inference import cpu_features

EVALS = Path("environments") / "reverse_text" / "outputs" / "evals"


def workbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env={**os.environ, "WORKBENCH_WORKSPACE": str(cwd)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_eval_run_in_bfloat16_records_it_and_says_when_emulated(
    tiny_workspace: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(cpu_features, "native_bf16", lambda: False)  # a CPU without AMX/AVX512-BF16
    done = workbench(
        "eval",
        "run",
        "reverse-text",
        "-m",
        "tiny",
        "-n",
        "2",
        "-r",
        "1",
        "--dtype",
        "bfloat16",
        cwd=tiny_workspace,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stderr.count(cpu_features.BF16_EMULATED) == 1, done.stderr
    [metadata] = (tiny_workspace / EVALS).glob("*/*/metadata.json")
    assert json.loads(metadata.read_text())["config"]["dtype"] == "bfloat16"
    results = (metadata.parent / "results.jsonl").read_text().splitlines()
    rollouts = [json.loads(line) for line in results if line.strip()]  # one line a rollout
    assert len(rollouts) == 2 and all(r["completion"][0]["content"] for r in rollouts), rollouts


def test_a_server_refuses_dtype_before_anything_is_written(tmp_path: Path):
    for args in (
        ["-m", "tiny", "-b", "http://127.0.0.1:9/v1"],
        ["-m", "srv"],  # an endpoint id from the registry
    ):
        (tmp_path / "configs").mkdir(exist_ok=True)
        (tmp_path / "configs" / "endpoints.toml").write_text(
            '[[endpoint]]\nendpoint_id = "srv"\nmodel = "tiny"\nurl = "http://127.0.0.1:9/v1"\n'
        )
        result = workbench("eval", "run", "reverse-text", *args, "--dtype", "bfloat16", cwd=tmp_path)
        line = one_error_line(result)
        assert "--dtype applies to a model run in this process" in line and "vLLM: --dtype" in line, line
        assert not (tmp_path / "environments").exists()


def test_toml_dtype_out_of_choices_names_file_line_and_key(tmp_path: Path):
    config = tmp_path / "eval.toml"
    config.write_text('env_id = "reverse-text"\nmodel = "tiny"\ndtype = "float16"\n')
    line = one_error_line(workbench("eval", "run", str(config), cwd=tmp_path))
    assert "eval.toml:3" in line and "'dtype'" in line and "bfloat16" in line, line


def test_serve_refuses_an_unknown_dtype(tmp_path: Path):
    line = one_error_line(workbench("serve", "tiny", "--dtype", "float16", cwd=tmp_path))
    assert "--dtype must be one of auto, float32, bfloat16, got 'float16'" in line, line


def test_a_lora_checkpoint_loads_in_the_asked_dtype(tiny_model: Path, tmp_path: Path):
    import torch

    from tests.weights import MESSAGES, make_adapter
    from workbench.inference.resolve import local_client
    from workbench.types import SamplingParams

    adapter = make_adapter(tiny_model, tmp_path / "adapter", seed=1)
    client = local_client("ckpt", adapter, dtype="bfloat16")
    try:
        assert {p.dtype for p in client._hf_model.parameters()} == {torch.bfloat16}  # type: ignore[attr-defined]
        [completion] = asyncio.run(
            client.chat(MESSAGES, sampling=SamplingParams(temperature=0.0, max_tokens=4))
        )
        assert completion.completion_tokens > 0
    finally:
        asyncio.run(client.close())


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        ("fpu sse avx512f avx512_bf16", True),
        ("fpu sse amx_tile amx_bf16", True),
        ("fpu sse avx2 avx512f", False),
    ],
)
def test_native_bf16_reads_the_cpu_flags(tmp_path: Path, flags: str, native: bool):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    assert cpu_features.native_bf16(cpuinfo) is native


def test_unknown_cpu_says_nothing(tmp_path: Path):
    assert cpu_features.native_bf16(tmp_path / "missing") is None  # not Linux
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_features.native_bf16(tmp_path / "arm") is None


def test_a_sweep_reuses_a_point_only_when_it_was_evaluated_in_the_same_dtype():
    """`eval run -m RUN --checkpoints` skips points already evaluated with the same key: a bf16
    sweep must not stand in for a float32 one. Lines saved before dtype existed read as auto."""
    from workbench.evaluate.config import EvalConfig
    from workbench.evaluate.sweep import sweep_key
    from workbench.store.sweeps import SweepKey

    base = EvalConfig(env_id="reverse-text", model="tiny", num_examples=4)
    assert sweep_key(base) != sweep_key(base.model_copy(update={"dtype": "bfloat16"}))
    saved_before = {k: v for k, v in sweep_key(base).model_dump().items() if k != "dtype"}
    assert SweepKey.model_validate(saved_before) == sweep_key(base)
