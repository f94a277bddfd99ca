"""The vLLM launcher: the exact `vllm serve` command and environment for train configs, the
missing-vLLM message, and process management (health wait, early exit, timeout, stop)
exercised for real on CPU with a stand-in executable (tests/fake_vllm.py)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from workbench.errors import UserError
from workbench.inference import vllm_launch
from workbench.inference.vllm_launch import (
    VLLM_EXECUTABLE,
    ManagedServer,
    ServerStartError,
    vllm_lora_rank,
    vllm_plan,
    vllm_unavailable_reason,
)
from workbench.train.schema import InferenceConfig, LoraConfig, TrainConfig
from workbench.train.vllm import launch_vllm

FAKE = [sys.executable, str(Path(__file__).with_name("fake_vllm.py"))]
V = list(VLLM_EXECUTABLE)


def plan(lora: LoraConfig | None = None, **inference: object):
    return vllm_plan(
        InferenceConfig(**inference),
        model="/models/qwen",
        served_model_name="qwen",
        port=8001,
        lora=lora,
        max_loras=2,
    )


def test_plain_command() -> None:
    p = plan()
    assert p.command == [
        *V,
        "serve",
        "/models/qwen",
        "--host",
        "127.0.0.1",
        "--port",
        "8001",
        "--served-model-name",
        "qwen",
        "--tensor-parallel-size",
        "1",
        "--data-parallel-size",
        "1",
    ]
    assert p.env == {}
    assert p.base_url == "http://127.0.0.1:8001/v1" and p.health_url == "http://127.0.0.1:8001/health"


def test_reasoning_parser() -> None:
    assert plan(reasoning_parser="qwen3").command[-2:] == ["--reasoning-parser", "qwen3"]
    assert "--reasoning-parser" not in plan().command


def test_dtype() -> None:
    p = plan(dtype="float16", max_model_len=4096)
    assert p.command[-4:] == ["--max-model-len", "4096", "--dtype", "float16"]
    assert "--dtype" not in plan().command and "--dtype" not in plan(dtype="auto").command  # vLLM's default


def test_prime_rl_inference_dtype_reaches_the_launch_command(tmp_path: Path) -> None:
    from workbench.train.config import load_train_config
    from workbench.train.plan import build_plan

    config = tmp_path / "p.toml"
    config.write_text(
        '[model]\nname = "Qwen/Qwen3-4B"\n[[orchestrator.env]]\nid = "reverse-text"\n'
        '[inference]\nmode = "server"\nlaunch = true\n[inference.model]\ndtype = "bfloat16"\n'
    )
    loaded, _ = load_train_config(config)
    rows = {
        label: value
        for section in build_plan(loaded, [], [], gpu_count=1).sections
        for label, value in section.rows
    }
    assert "--dtype bfloat16" in rows["vLLM command"] and "dtype bfloat16" in rows["inference settings"]


def test_parallel_gpus_memory_and_tools() -> None:
    p = plan(
        gpu_ids=[4, 5, 6, 7],
        tensor_parallel_size=2,
        data_parallel_size=2,
        gpu_memory_utilization=0.85,
        max_model_len=8192,
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
    )
    assert p.command[len(V) + 8 :] == [
        "--tensor-parallel-size",
        "2",
        "--data-parallel-size",
        "2",
        "--gpu-memory-utilization",
        "0.85",
        "--max-model-len",
        "8192",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    assert p.env == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}


@pytest.mark.parametrize(("r", "rank"), [(1, 1), (4, 8), (8, 8), (12, 16), (64, 64), (300, 320), (512, 512)])
def test_lora_flags_and_env(r: int, rank: int) -> None:
    p = plan(LoraConfig(r=r), gpu_ids=[1])
    assert p.command[-5:] == ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "2"]
    assert p.env == {"CUDA_VISIBLE_DEVICES": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    assert "--enable-lora" not in plan(LoraConfig(enabled=False)).command


def test_config_mistakes_are_one_line_user_errors() -> None:
    with pytest.raises(UserError, match=r"gpu_ids lists 3 GPU\(s\) but .* = 2 \* 1 = 2"):
        plan(gpu_ids=[0, 1, 2], tensor_parallel_size=2)
    with pytest.raises(UserError, match="needs inference.enable_auto_tool_choice"):
        plan(tool_call_parser="hermes")
    with pytest.raises(UserError, match="above vLLM's largest --max-lora-rank"):
        vllm_lora_rank(513)


def test_missing_vllm_or_gpu_is_a_clear_user_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = TrainConfig(env=[{"id": "reverse-text"}], inference={"mode": "server", "launch": True})
    monkeypatch.setattr(vllm_launch, "_vllm_installed", lambda: False)
    with pytest.raises(UserError) as info:
        launch_vllm(config, tmp_path)
    message = str(info.value)
    assert (
        message
        == "inference.launch needs vLLM on a machine with a GPU: pip install 'workbench[vllm]' (vLLM is not installed)"
    )
    monkeypatch.setattr(vllm_launch, "_vllm_installed", lambda: True)
    monkeypatch.setattr(vllm_launch, "_cuda_visible", lambda: False)
    assert vllm_unavailable_reason() == "no CUDA GPU is visible"


def train_config(model: Path, **inference: object) -> TrainConfig:
    return TrainConfig(
        model=str(model),
        env=[{"id": "reverse-text"}],
        max_async_level=2,
        lora={"r": 16},
        inference={"mode": "server", "launch": True, **inference},
    )


def test_launch_waits_for_health_then_stops_the_group(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(record))
    monkeypatch.setenv("FAKE_VLLM_DELAY", "1")  # not healthy at once: the wait must poll
    server, launched = launch_vllm(train_config(tiny_model, gpu_ids=[3]), tmp_path, executable=FAKE)
    with server:
        assert server._healthy()
        pid = server.process.pid
    assert server.process.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole group is gone
    seen = json.loads(record.read_text())
    assert seen["argv"] == launched.command[len(FAKE) :]
    assert seen["argv"][:2] == ["serve", str(tiny_model)]
    assert seen["argv"][-5:] == ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "3"]
    assert seen["cuda_visible_devices"] == "3" and seen["lora_updating"] == "True"
    log = (tmp_path / "vllm.log").read_text()
    assert log.startswith("$ ") and "Uvicorn running" in log


def test_early_exit_reports_code_and_log_tail(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_EXIT", "3")
    server, _ = launch_vllm(train_config(tiny_model), tmp_path, executable=FAKE)
    with pytest.raises(ServerStartError) as info, server:
        pass
    message = str(info.value)
    assert (
        message.splitlines()[0]
        == f"vLLM exited with code 3 before it was ready; last lines of {tmp_path / 'vllm.log'}:"
    )
    assert "CUDA out of memory" in message


def test_startup_timeout_stops_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_VLLM_DELAY", "60")
    port = vllm_launch.free_port()
    server = ManagedServer(
        [*FAKE, "serve", "m", "--port", str(port)],
        tmp_path / "vllm.log",
        f"http://127.0.0.1:{port}/health",
        startup_timeout_s=1.5,
        poll_s=0.1,
    )
    start = time.monotonic()
    with pytest.raises(ServerStartError, match=r"was not healthy at .* after 1.5s \(stopped it\)"), server:
        pass
    assert time.monotonic() - start < 20
    assert server.process.poll() is not None


def test_stop_escalates_to_sigkill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_VLLM_IGNORE_SIGTERM", "1")
    port = vllm_launch.free_port()
    server = ManagedServer(
        [*FAKE, "serve", "m", "--port", str(port)],
        tmp_path / "vllm.log",
        f"http://127.0.0.1:{port}/health",
        stop_timeout_s=0.5,
        poll_s=0.1,
    )
    with server:
        pass
    assert server.process.returncode == -9


def test_missing_executable_is_a_start_error(tmp_path: Path) -> None:
    server = ManagedServer(
        [str(tmp_path / "no-such-vllm"), "serve"], tmp_path / "vllm.log", "http://127.0.0.1:9/health"
    )
    with pytest.raises(ServerStartError, match="could not start vLLM"):
        server.start()


@pytest.mark.skipif(
    vllm_unavailable_reason() is not None, reason=f"needs a real vLLM launch: {vllm_unavailable_reason()}"
)
async def test_real_vllm_serves_and_takes_lora_updates(tiny_model: Path, tmp_path: Path) -> None:
    from tests.weights import make_adapter
    from workbench.inference.openai_client import OpenAIClient
    from workbench.inference.weight_sync import WeightSync
    from workbench.types import SamplingParams

    adapter = make_adapter(tiny_model, tmp_path / "adapter", seed=1)
    server, launched = launch_vllm(train_config(tiny_model, gpu_memory_utilization=0.3), tmp_path)
    async with server:
        client = OpenAIClient(launched.base_url, launched.served_model_name, return_tokens=True)
        try:
            await WeightSync([launched.base_url]).switch_lora("step_1", str(adapter), client=client)
            [completion] = await client.chat(
                [{"role": "user", "content": "hello"}], sampling=SamplingParams(temperature=0, max_tokens=8)
            )
            assert completion.tokens is not None and completion.tokens.completion_ids
        finally:
            await client.close()
