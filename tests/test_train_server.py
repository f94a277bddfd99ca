"""Server mode on this CPU: rollouts from two model servers on 127.0.0.1 (real processes, the
tiny model, LoRA runtime updates), async off-policy generation, and the faults of issue 7."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.servers import ServerProcess, start_processes
from workbench.events import NullReporter
from workbench.train.config import load_train_config

pytestmark = pytest.mark.slow

CONFIG = """
model = "tiny"
max_steps = {steps}
batch_size = 16
rollouts_per_example = 4
micro_batch_size = 16
learning_rate = 3e-3
seed = 5
max_async_level = {async_level}
max_off_policy_steps = {off_policy}
[sampling]
max_tokens = 48
[[env]]
id = "reverse-text"
[lora]
r = 4
alpha = 8
[checkpointing]
save_every_n_steps = 2
[wandb]
mode = "disabled"
[inference]
mode = "server"
base_urls = {urls}
"""


def model_servers(model: Path, count: int, *extra: str) -> list[ServerProcess]:
    """`count` LocalClient servers (LoRA enabled) for `model`, started concurrently."""
    return start_processes(
        ["-m", "tests.servers", "--backend", "model", "--model-path", str(model), "--model", "tiny", *extra],
        count,
    )


@pytest.fixture(scope="module")
def slow_servers(tiny_model: Path):
    """Two servers with 0.3 s of added latency per request, so generation is long next to a
    training step of 16 samples and the overlap shows in wall time."""
    servers = model_servers(tiny_model, 2, "--delay-s", "0.3")
    yield servers
    for server in servers:
        server.kill()


def write_config(
    folder: Path,
    name: str,
    servers: list[ServerProcess],
    *,
    steps: int = 4,
    async_level: int = 1,
    off_policy: int = 8,
) -> Path:
    urls = json.dumps([f"{s.base_url}/v1" for s in servers])
    path = folder / f"{name}.toml"
    path.write_text(CONFIG.format(steps=steps, async_level=async_level, off_policy=off_policy, urls=urls))
    return path


def train(path: Path, *overrides: str, reporter: Any = None, resume: Path | None = None):
    from workbench.train import run_train

    config, _ = load_train_config(path, list(overrides))
    return run_train(config, reporter, resume=resume)


def metrics_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


async def served_models(server: ServerProcess) -> list[str]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.base_url}/v1/models") as response:
            return [m["id"] for m in (await response.json())["data"]]


@pytest.mark.extended  # ~2 min; the server-mode path is also run by the two tests below
def test_async_server_mode_overlaps_generation_and_bounds_lag(tiny_workspace: Path, slow_servers):
    result = train(write_config(tiny_workspace, "async", slow_servers), "output_dir='runs/async'")
    assert result.status == "finished"
    steps = [m for m in metrics_of(result.run_dir) if "time/step" in m]
    assert len(steps) == 4
    assert all(m["policy/lag"] <= 1 for m in steps) and any(m["policy/lag"] == 1 for m in steps)
    assert all(m["rollout/trained_samples"] == 16 and m["rollout/errors"] == 0 for m in steps)
    # token ids and sampled logprobs came from the servers: the ratio is near 1, not garbage
    assert all(0.5 < m["policy/importance_ratio"] < 2.0 for m in steps)
    assert all(m["time/weight_sync"] > 0 for m in steps)
    assert "lag 1" in (result.run_dir / "run.log").read_text()  # the console/run.log step line shows it
    # the overlap: after the first step, wall time per step is below generation + training
    later = steps[1:]
    wall = sum(m["time/step"] for m in later)
    serial = sum(
        m["rollout/generation_time"] + m["time/forward_backward"] + m["time/optimizer"] for m in later
    )
    assert wall < serial, (wall, serial)
    # every server serves the newest adapter; only the newest two are kept on disk
    newest = f"{result.run_dir.name}-step-4"
    for server in slow_servers:
        assert newest in asyncio.run(served_models(server))
    assert sorted(p.name for p in (result.run_dir / "weights").iterdir()) == ["step_000003", "step_000004"]


def test_stale_rollouts_are_replaced_and_sync_mode_is_on_policy(tiny_workspace: Path, slow_servers):
    stale = train(
        write_config(tiny_workspace, "stale", slow_servers, steps=3, off_policy=0), "output_dir='runs/stale'"
    )
    steps = [m for m in metrics_of(stale.run_dir) if "time/step" in m]
    assert sum(m["policy/off_policy_dropped"] for m in steps) > 0
    assert all(m["policy/lag"] == 0 for m in steps)  # what trained was regenerated on-policy
    sync = train(
        write_config(tiny_workspace, "sync", slow_servers, steps=2, async_level=0), "output_dir='runs/sync'"
    )
    steps = [m for m in metrics_of(sync.run_dir) if "time/step" in m]
    assert all(m["policy/lag"] == 0 and m["policy/off_policy_dropped"] == 0 for m in steps)


class KillAfterStep(NullReporter):
    def __init__(self, step: int, server: ServerProcess) -> None:
        self.step, self.server = step, server

    def step_done(self, step: int, metrics: dict[str, Any]) -> None:
        if step == self.step:
            self.server.kill()


def test_a_server_that_dies_mid_run_is_dropped_and_training_goes_on(tiny_workspace: Path, tiny_model: Path):
    servers = model_servers(tiny_model, 2)
    try:
        path = write_config(tiny_workspace, "dies", servers, steps=4)
        result = train(path, "output_dir='runs/dies'", reporter=KillAfterStep(1, servers[1]))
    finally:
        for server in servers:
            server.kill()
    assert result.status == "finished" and result.last_step == 4
    steps = [m for m in metrics_of(result.run_dir) if "time/step" in m]
    assert all(m["rollout/errors"] == 0 and m["rollout/trained_samples"] == 16 for m in steps)
    log = (result.run_dir / "run.log").read_text()
    assert f"server {servers[1].base_url}/v1 dropped from the pool" in log


@pytest.mark.extended  # ~2 min
def test_weight_load_failures_are_retried_then_stop_cleanly_and_resume(
    tiny_workspace: Path, tiny_model: Path
):
    from workbench.train.loop import TrainingFailed

    flaky = model_servers(tiny_model, 1, "--fail-first", "2", "--fault-path", "/v1/load_lora_adapter")
    try:  # two 503s on the first load: retried, the run never notices
        result = train(write_config(tiny_workspace, "flaky", flaky, steps=2), "output_dir='runs/flaky'")
        assert result.status == "finished"
    finally:
        flaky[0].kill()
    broken = model_servers(
        tiny_model, 1, "--fail-rate", "1.0", "--fail-status", "500", "--fault-path", "/v1/load_lora_adapter"
    )
    try:  # every load fails: the step stops with one line, checkpoints intact
        with pytest.raises(TrainingFailed, match="no inference server took the new weights"):
            train(write_config(tiny_workspace, "broken", broken, steps=4), "output_dir='runs/broken'")
    finally:
        broken[0].kill()
    run_dir = tiny_workspace / "runs" / "broken"
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "failed"
    healthy = model_servers(tiny_model, 1)
    try:  # resume against a healthy server: it first gets the checkpoint's weights
        urls = json.dumps([f"{healthy[0].base_url}/v1"])
        resumed = train(run_dir / "config.toml", f"inference.base_urls={urls}", resume=run_dir)
        assert resumed.status == "finished" and resumed.last_step == 4
    finally:
        healthy[0].kill()


def test_full_fine_tuning_reloads_the_servers_weights(tiny_workspace: Path, tiny_model: Path):
    """lora.enabled = false: each step's whole model goes to the servers (`/update_weights`) and
    the next batch is generated by it — the on-policy importance ratio stays ~1."""
    servers = model_servers(tiny_model, 1)
    try:
        path = write_config(tiny_workspace, "full", servers, steps=3, async_level=0)
        path.write_text(
            path.read_text()
            .replace("[lora]\nr = 4", "[lora]\nenabled = false\nr = 4")
            .replace("learning_rate = 3e-3", "learning_rate = 1e-4")
        )
        result = train(path, "output_dir='runs/full'")
        models = asyncio.run(served_models(servers[0]))
    finally:
        servers[0].kill()
    assert result.status == "finished"
    steps = [m for m in metrics_of(result.run_dir) if "time/step" in m]
    assert all(abs(m["policy/importance_ratio"] - 1.0) < 0.05 for m in steps[1:]), steps
    assert models == ["tiny"]  # the base name, now serving the trained weights
    assert (result.run_dir / "weights" / "step_000003" / "config.json").is_file()
