"""vLLM's runtime LoRA API on a real `workbench serve --enable-lora` process (127.0.0.1):
load, list, generate with, reload in place, fail cleanly, unload."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from tests.servers import ServerProcess
from tests.weights import (
    chat,
    completion,
    make_adapter,
    post,
    reference_model,
    teacher_forced,
    workbench_servers,
)

LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


@pytest.fixture(scope="module")
def adapters(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    found = {
        "a": make_adapter(tiny_model, root / "a", seed=1),
        "b": make_adapter(tiny_model, root / "b", seed=2, r=8, targets=("q_proj", "k_proj", "o_proj")),
        "rank32": make_adapter(tiny_model, root / "rank32", seed=3, r=32),
    }
    # Broken ones: no config; a config naming modules the model lacks; another model's shapes.
    (root / "no_config").mkdir()
    shutil.copy(found["a"] / "adapter_model.safetensors", root / "no_config")
    shutil.copytree(found["a"], root / "bad_targets")
    config = json.loads((root / "bad_targets" / "adapter_config.json").read_text())
    config["target_modules"] = ["no_such_proj"]
    (root / "bad_targets" / "adapter_config.json").write_text(json.dumps(config))
    found["other_base"] = _other_base_adapter(root / "other_base")
    found["no_config"], found["bad_targets"] = root / "no_config", root / "bad_targets"
    return found


def _other_base_adapter(out: Path) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=259,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    get_peft_model(other, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def server(tiny_model: Path, adapters: dict[str, Path]) -> ServerProcess:
    with workbench_servers(tiny_model, 1, "--enable-lora", "--lora-modules", f"static={adapters['b']}") as [
        process
    ]:
        yield process


@pytest.fixture(scope="module")
def references(tiny_model: Path, adapters: dict[str, Path]) -> dict[str, object]:
    return {
        "tiny": reference_model(tiny_model),
        "a": reference_model(tiny_model, adapters["a"]),
        "b": reference_model(tiny_model, adapters["b"]),
    }


async def load(url: str, name: str, path: Path, **extra: object) -> tuple[int, object]:
    return await post(url, LOAD, {"lora_name": name, "lora_path": str(path), **extra})


def assert_generated_by(model: object, body: dict) -> None:
    """The server's greedy tokens and logprobs are what `model` computes for that text."""
    prompt_ids, ids, logprobs = completion(body)
    greedy, local = teacher_forced(model, prompt_ids, ids)
    assert ids == greedy
    assert logprobs == pytest.approx(local, abs=2e-4)


async def test_lora_modules_load_at_startup(
    server: ServerProcess, adapters: dict[str, Path], references: dict[str, object]
) -> None:
    _, models = await _get_json(server.base_url, "/v1/models")
    assert {"id": "static", "parent": "tiny", "root": str(adapters["b"])}.items() <= {
        card["id"]: card for card in models["data"]
    }["static"].items()
    assert_generated_by(references["b"], (await chat(server.base_url, "static"))[1])


def test_serve_flag_mistakes_are_one_line_errors(tiny_model: Path, tmp_path: Path) -> None:
    from tests.servers import REPO_ROOT
    from tests.test_cli_errors import assert_one_line_error
    from tests.test_cli_errors import workbench as run

    def workbench(*args: str):  # this checkout's workbench, whatever is installed
        return run(*args, cwd=tmp_path, env_extra={"PYTHONPATH": str(REPO_ROOT)})

    model = str(tiny_model)
    assert_one_line_error(workbench("serve", model, "--lora-modules", "a=/x"), "needs --enable-lora")
    assert_one_line_error(workbench("serve", model, "--enable-lora", "--lora-modules", "a"), "NAME=PATH")
    assert_one_line_error(workbench("serve", model, "--max-lora-rank", "12"), "one of 1, 8, 16")
    missing = tmp_path / "missing"
    assert_one_line_error(
        workbench("serve", model, "--enable-lora", "--lora-modules", f"a={missing}", "--port", "0"),
        f"--lora-modules a={missing}",
        "No adapter found",
    )


async def test_adapter_lifecycle_matches_vllm(
    server: ServerProcess, adapters: dict[str, Path], references: dict[str, object]
) -> None:
    url = server.base_url
    # Its own adapter name: the module's server is shared, and xdist may run the other tests first.
    status, body = await chat(url, "life")
    assert status == 404 and "does not exist" in body["error"]["message"]

    assert await load(url, "life", adapters["a"]) == (200, "Success: LoRA adapter 'life' added successfully.")
    status, models = await _get_json(url, "/v1/models")
    cards = {card["id"]: card for card in models["data"]}
    assert cards["tiny"]["parent"] is None
    assert cards["life"]["parent"] == "tiny" and cards["life"]["root"] == str(adapters["a"])

    (_, base_body), (_, lora_body) = await chat(url, "tiny"), await chat(url, "life")
    assert completion(base_body)[1] != completion(lora_body)[1]
    assert lora_body["model"] == "life"
    assert_generated_by(references["tiny"], base_body)
    assert_generated_by(references["a"], lora_body)

    status, body = await load(url, "life", adapters["b"])
    assert status == 400 and body["error"]["type"] == "InvalidUserInput"
    assert "has already been loaded" in body["error"]["message"] and body["error"]["code"] == 400

    assert (await load(url, "life", adapters["b"], load_inplace=True))[0] == 200
    assert_generated_by(references["b"], (await chat(url, "life"))[1])


async def test_requests_for_base_and_adapters_interleave(
    server: ServerProcess, adapters: dict[str, Path], references: dict[str, object]
) -> None:
    url = server.base_url
    await load(url, "a", adapters["a"], load_inplace=True)  # each test loads what it uses: any order works
    await load(url, "b", adapters["b"], load_inplace=True)
    names = ["tiny", "a", "b"] * 3
    replies = await asyncio.gather(*(chat(url, name) for name in names))  # batched per adapter on the server
    for name, (status, body) in zip(names, replies):
        assert status == 200
        assert_generated_by(references[name], body)


async def test_failed_loads_leave_served_adapters_working(
    server: ServerProcess, adapters: dict[str, Path], references: dict[str, object]
) -> None:
    url = server.base_url
    await load(url, "a", adapters["a"], load_inplace=True)
    cases = {
        "missing": (adapters["a"].parent / "missing", 404, "No adapter found"),
        "no_config": (adapters["no_config"], 404, "No adapter found"),
        "bad_targets": (adapters["bad_targets"], 400, "no_such_proj"),
        "other_base": (adapters["other_base"], 400, "different base model"),
        "rank32": (adapters["rank32"], 400, "LoRA rank 32 is greater than max_lora_rank 16"),
    }
    for case, (path, expected_status, needle) in cases.items():
        for name in ("new", "a"):  # a new name, and an in-place reload of a working one
            status, body = await load(url, name, path, load_inplace=True)
            assert status == expected_status, (case, body)
            assert needle in body["error"]["message"], (case, body)
            assert body["error"]["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    status, models = await _get_json(url, "/v1/models")
    assert "new" not in {card["id"] for card in models["data"]}
    assert_generated_by(references["a"], (await chat(url, "a"))[1])
    assert_generated_by(references["tiny"], (await chat(url, "tiny"))[1])


async def test_unload(server: ServerProcess, adapters: dict[str, Path]) -> None:
    url = server.base_url
    await load(url, "gone", adapters["a"])
    assert await post(url, UNLOAD, {"lora_name": "gone"}) == (
        200,
        "Success: LoRA adapter 'gone' removed successfully.",
    )
    status, body = await post(url, UNLOAD, {"lora_name": "gone"})
    assert status == 404 and body["error"]["message"] == "The lora adapter 'gone' cannot be found."
    assert (await chat(url, "gone"))[0] == 404
    status, body = await post(url, LOAD, {"lora_name": "x"})
    assert status == 400 and "Both 'lora_name' and 'lora_path'" in body["error"]["message"]


async def test_reload_while_requests_are_in_flight(
    server: ServerProcess, adapters: dict[str, Path], references: dict[str, object]
) -> None:
    """In-place reloads while earlier requests are still running: every reply comes wholly
    from one adapter version, and requests sent after a reload returned use the new one."""
    url = server.base_url
    await load(url, "a", adapters["a"], load_inplace=True)
    waves: list[tuple[str | None, list[asyncio.Task]]] = [
        (None, [asyncio.create_task(chat(url, "a")) for _ in range(4)])
    ]
    for version in ("b", "a", "b", "a"):
        assert (await load(url, "a", adapters[version], load_inplace=True))[
            0
        ] == 200  # earlier waves still running
        waves.append((version, [asyncio.create_task(chat(url, "a")) for _ in range(4)]))
    for version, tasks in waves:
        for status, body in await asyncio.gather(*tasks):
            assert status == 200
            prompt_ids, ids, _ = completion(body)
            fits = {n for n in ("a", "b") if teacher_forced(references[n], prompt_ids, ids)[0] == ids}
            assert fits == {version} if version else fits, (
                version,
                fits,
            )  # the first wave raced the first reload


async def test_lora_endpoints_need_enable_lora(url: str) -> None:
    status, body = await post(url, LOAD, {"lora_name": "a", "lora_path": "/nowhere"})
    assert (
        status == 400 and body["error"]["message"] == "LoRA is not enabled. Use --enable-lora to enable LoRA."
    )


async def _get_json(url: str, path: str) -> tuple[int, dict]:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(f"{url}{path}") as response:
        return response.status, await response.json()
