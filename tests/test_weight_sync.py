"""`WeightSync` against two real `workbench serve --enable-lora` processes on 127.0.0.1:
LoRA switches and full-weight reloads reach every server, clients follow the new name,
failures name the server, transient faults are retried."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.servers import FaultInjector, ServerProcess, serve_in_thread
from tests.weights import (
    chat,
    completion,
    make_adapter,
    make_perturbed_model,
    reference_model,
    teacher_forced,
    workbench_servers,
)
from workbench.inference.openai_client import OpenAIClient, RoundRobinClient
from workbench.inference.server import create_app
from workbench.inference.weight_sync import SyncReport, WeightSync, WeightSyncError, server_root
from workbench.types import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


@pytest.fixture(scope="module")
def servers(tiny_model: Path) -> list[ServerProcess]:
    with workbench_servers(tiny_model, 2, "--enable-lora") as processes:
        yield processes


@pytest.fixture(scope="module")
def folders(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sync")
    return {
        "step_1": make_adapter(tiny_model, root / "step_1", seed=11),
        "step_2": make_adapter(tiny_model, root / "step_2", seed=12),
        "full": make_perturbed_model(tiny_model, root / "full", seed=13),
    }


def urls(servers: list[ServerProcess]) -> list[str]:
    return [f"{s.base_url}/v1" for s in servers]  # as a config lists them; WeightSync strips /v1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def first_ids(client: OpenAIClient | RoundRobinClient) -> list[int]:
    [completion_] = await client.chat([{"role": "user", "content": "hello world"}], sampling=GREEDY)
    return completion_.tokens.completion_ids


async def test_switch_lora_reaches_every_server_and_moves_the_client(
    servers: list[ServerProcess], folders: dict[str, Path], tiny_model: Path
) -> None:
    sync = WeightSync(urls(servers))
    replicas = [OpenAIClient(u, "tiny", return_tokens=True) for u in urls(servers)]
    client = RoundRobinClient(replicas)
    try:
        base = [await first_ids(client) for _ in servers]
        report = await sync.switch_lora("step_1", str(folders["step_1"]), client=client)
        assert isinstance(report, SyncReport) and report.seconds > 0
        assert sorted(s.base_url for s in report.servers) == sorted(s.base_url for s in servers)
        assert all(s.attempts == 1 and 0 < s.seconds <= report.seconds for s in report.servers)
        assert report.metrics()["time/weight_sync"] == report.seconds
        assert client.model == "step_1" and all(r.model == "step_1" for r in replicas)
        assert replicas[0].request_body([], GREEDY, None)["model"] == "step_1"

        step_1 = [await first_ids(client) for _ in servers]  # round-robin: one reply per server
        assert step_1[0] == step_1[1] != base[0]
        reference = reference_model(tiny_model, folders["step_1"])
        _, body = await chat(servers[0].base_url, "step_1")
        prompt_ids, ids, _ = completion(body)
        assert ids == step_1[0] and teacher_forced(reference, prompt_ids, ids)[0] == ids

        await sync.switch_lora("step_2", str(folders["step_2"]), client=client, previous="step_1")
        for server in servers:
            assert (await chat(server.base_url, "step_1"))[0] == 404  # unloaded everywhere
        step_2 = [await first_ids(client) for _ in servers]
        assert step_2[0] == step_2[1] != step_1[0]

        # One fixed name reloaded in place each step: the other way a trainer can run it.
        await sync.load_lora("policy", str(folders["step_1"]), load_inplace=True)
        await sync.load_lora("policy", str(folders["step_2"]), load_inplace=True)
        client.use_model("policy")
        assert await first_ids(client) == step_2[0]
        await sync.unload_lora("policy")
        await sync.unload_lora("never_loaded")  # missing_ok: a restarted server forgot it
    finally:
        await client.close()


async def test_update_weights_reaches_every_server(
    servers: list[ServerProcess], folders: dict[str, Path], tiny_model: Path
) -> None:
    sync = WeightSync(urls(servers))
    client = RoundRobinClient([OpenAIClient(u, "tiny", return_tokens=True) for u in urls(servers)])
    try:
        base = await first_ids(client)
        report = await sync.update_weights(str(folders["full"]))
        assert len(report.servers) == 2
        changed = [await first_ids(client) for _ in servers]
        assert changed[0] == changed[1] != base
        _, body = await chat(servers[1].base_url, "tiny")
        prompt_ids, ids, logprobs = completion(body)
        greedy, local = teacher_forced(reference_model(folders["full"]), prompt_ids, ids)
        assert ids == greedy and logprobs == pytest.approx(local, abs=2e-4)

        with pytest.raises(WeightSyncError) as info:
            await sync.update_weights(str(folders["step_1"]))  # an adapter is not full weights
        assert len(info.value.failures) == 2 and "LoRA adapter, not full weights" in str(info.value)
        assert await first_ids(client) == changed[0]  # the failed reload changed nothing
    finally:
        await sync.update_weights(str(tiny_model))  # leave the servers as the other tests expect
        await client.close()
    assert await _fresh_ids(servers) == base


async def _fresh_ids(servers: list[ServerProcess]) -> list[int]:
    client = OpenAIClient(servers[0].base_url, "tiny", return_tokens=True)
    try:
        return await first_ids(client)
    finally:
        await client.close()


async def test_error_names_the_failed_server_after_retries(
    servers: list[ServerProcess], folders: dict[str, Path]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    sync = WeightSync([servers[0].base_url, dead], retries=2, backoff_s=0.01)
    with pytest.raises(WeightSyncError) as info:
        await sync.load_lora("step_1", str(folders["step_1"]), load_inplace=True)
    error = info.value
    assert list(error.failures) == [dead] and "after 3 attempts" in error.failures[dead]
    assert dead in str(error) and "1 of 2 server(s)" in str(error)
    assert [s.base_url for s in error.report.servers] == [servers[0].base_url]  # the good one did load


async def test_permanent_errors_are_not_retried(servers: list[ServerProcess], tmp_path: Path) -> None:
    sync = WeightSync([servers[0].base_url], retries=3, backoff_s=0.01)
    with pytest.raises(WeightSyncError) as info:
        await sync.load_lora("x", str(tmp_path / "missing"))
    reason = info.value.failures[servers[0].base_url]
    assert "HTTP 404" in reason and "No adapter found" in reason and "after 1 attempt)" in reason


async def test_transient_failures_are_retried(tiny_model: Path, folders: dict[str, Path]) -> None:
    from workbench.inference.local_client import LocalClient

    backend = LocalClient(tiny_model, model_name="tiny")
    faults = FaultInjector(fail_first=2, status=503, path="/update_weights")
    app = create_app(backend, served_model_name="tiny", middlewares=(faults.middleware,))
    try:
        with serve_in_thread(app) as url:
            report = await WeightSync([url], retries=3, backoff_s=0.01).update_weights(str(tiny_model))
    finally:
        await backend.close()
    assert report.servers[0].attempts == 3 and faults.failed == 2


def test_server_root() -> None:
    assert server_root("http://h:8000/v1/") == server_root("http://h:8000") == "http://h:8000"
    assert server_root("https://h/proxy/v1") == "https://h/proxy"
