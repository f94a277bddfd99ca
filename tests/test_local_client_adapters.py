"""LocalClient with runtime LoRA adapters and in-place weight reloads, in-process: batches
never mix adapter versions, a request keeps the version it was accepted with, failures
change nothing."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from tests.weights import MESSAGES, make_adapter, make_perturbed_model
from workbench.inference.adapters import AdapterError
from workbench.inference.local_client import LocalClient
from workbench.inference.weight_reload import WeightReloadError
from workbench.types import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def folders(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("local_adapters")
    return {
        "a": make_adapter(tiny_model, root / "a", seed=1),
        "b": make_adapter(tiny_model, root / "b", seed=2),
        "full": make_perturbed_model(tiny_model, root / "full", seed=3),
    }


@pytest.fixture
def client(tiny_model: Path):
    client = LocalClient(tiny_model, model_name="tiny")
    yield client
    asyncio.run(client.close())


async def ids(client: LocalClient, adapter: str | None = None) -> list[int]:
    [completion] = await client.chat(MESSAGES, sampling=GREEDY, adapter=adapter)
    return completion.tokens.completion_ids


async def test_batches_hold_one_adapter_version(client: LocalClient, folders: dict[str, Path]) -> None:
    base = await ids(client)
    await asyncio.to_thread(client.load_adapter, "a", folders["a"])
    await asyncio.to_thread(client.load_adapter, "b", folders["b"])
    alone = {name: await ids(client, name) for name in ("a", "b")}
    assert len({tuple(base), *map(tuple, alone.values())}) == 3
    before = client.stats.batches
    names = [None, "a", "b", None, "a", "b"]
    mixed = await asyncio.gather(*(ids(client, name) for name in names))
    assert mixed == [base if n is None else alone[n] for n in names]
    assert client.stats.batches - before == 3  # one per model, all queued in the same loop turn
    assert client.adapters == {"a": str(folders["a"]), "b": str(folders["b"])}


async def test_accepted_request_keeps_its_adapter_version(
    client: LocalClient, folders: dict[str, Path]
) -> None:
    await asyncio.to_thread(client.load_adapter, "b", folders["b"])
    expected_b = await ids(client, "b")
    await asyncio.to_thread(client.load_adapter, "x", folders["a"])
    expected_a = await ids(client, "x")
    client.weights_lock.acquire()  # the worker cannot start a batch: the request waits in the queue
    try:
        accepted = asyncio.create_task(ids(client, "x"))
        await asyncio.sleep(0.05)
        reload = asyncio.create_task(asyncio.to_thread(client.load_adapter, "x", folders["b"]))
        await asyncio.sleep(0.05)
    finally:
        client.weights_lock.release()
    await reload  # the reload goes first (the worker yields to waiting updates) ...
    assert await accepted == expected_a  # ... yet the queued request runs on the version it was accepted with
    assert await ids(client, "x") == expected_b
    unload = asyncio.create_task(asyncio.to_thread(client.unload_adapter, "x"))
    await unload
    with pytest.raises(AdapterError, match="does not exist") as info:
        await ids(client, "x")
    assert info.value.status == 404
    assert set(client._adapters._peft.peft_config) == {client._adapters._current["b"]}  # old versions deleted


async def test_failed_load_changes_nothing(
    client: LocalClient, folders: dict[str, Path], tmp_path: Path
) -> None:
    await asyncio.to_thread(client.load_adapter, "a", folders["a"])
    expected = await ids(client, "a")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "adapter_config.json").write_text(
        (folders["a"] / "adapter_config.json").read_text()
    )
    with pytest.raises(AdapterError, match="Loading lora a failed"):
        await asyncio.to_thread(client.load_adapter, "a", tmp_path / "broken")  # no weights file
    assert await ids(client, "a") == expected
    assert client.adapters == {"a": str(folders["a"])}


async def test_update_weights_in_place(
    client: LocalClient, folders: dict[str, Path], tiny_model: Path
) -> None:
    base = await ids(client)
    await asyncio.to_thread(client.load_adapter, "a", folders["a"])
    with_adapter = await ids(client, "a")
    assert await asyncio.to_thread(client.update_weights, folders["full"]) > 0
    changed = await ids(client)
    assert changed != base
    reference = LocalClient(folders["full"], model_name="full")
    try:
        assert changed == await ids(reference)
    finally:
        await reference.close()
    for bad, status in ((folders["a"], 400), (tiny_model / "missing", 404)):
        with pytest.raises(WeightReloadError) as info:
            await asyncio.to_thread(client.update_weights, bad)
        assert info.value.status == status
    assert await ids(client) == changed  # failed reloads changed nothing
    await asyncio.to_thread(client.update_weights, tiny_model)
    assert await ids(client) == base
    assert await ids(client, "a") == with_adapter  # the adapter stayed attached throughout


async def test_waiting_update_is_not_starved(client: LocalClient, folders: dict[str, Path]) -> None:
    """A steady stream of requests cannot keep a weight update waiting for long."""
    stop = threading.Event()

    async def traffic() -> None:
        while not stop.is_set():
            await asyncio.gather(*(ids(client) for _ in range(4)))

    before = client.stats.batches
    runner = asyncio.create_task(traffic())
    async with asyncio.timeout(60):  # bounds a failure only
        while client.stats.batches < before + 2:  # the stream is flowing: batches keep the worker busy
            await asyncio.sleep(0.01)
    await asyncio.wait_for(asyncio.to_thread(client.load_adapter, "a", folders["a"]), timeout=30)
    stop.set()
    await runner
