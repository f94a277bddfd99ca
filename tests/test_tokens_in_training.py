"""Server-mode multi-turn RL with tokens in (issue 34.1 and 34.3), through `workbench train`:
against `workbench serve` (which offers vLLM's tokens-in route) a 3-turn rollout is one sample
and the trainer's logprobs match the sampler's; against a server without the route the run says
so once and goes through the chat API, where the server re-renders each conversation (the
tiny-qwen template drops earlier turns' thinking) and a rollout becomes several samples.

Real processes: a `workbench serve tiny-qwen --enable-lora` server, and for the fallback an
aiohttp proxy in front of it that forwards every route but the tokens-in one."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests import cli
from tests.servers import ServerProcess, serve_in_thread, start_process

pytestmark = pytest.mark.slow

CONFIG = """
model = "tiny-qwen"
max_steps = 2
batch_size = 4
rollouts_per_example = 2
micro_batch_size = 4
learning_rate = 1e-3
seed = 1
max_async_level = 0   # strictly on-policy: the mismatch is the servers' numerics alone
[sampling]
max_tokens = 48
[[env]]
id = "alphabet-sort"
args = {{ min_turns = 3, max_turns = 3 }}
[eval]
interval = 0
[wandb]
mode = "disabled"
[inference]
mode = "server"
base_urls = ["{url}"]
"""


@pytest.fixture(scope="module")
def qwen_server(tiny_qwen_model: Path) -> Iterator[ServerProcess]:
    server = start_process(
        ["-m", "workbench", "serve", str(tiny_qwen_model), "--served-model-name", "tiny-qwen"]
        + ["--enable-lora", "--port", "0"]
    )
    yield server
    server.stop()


def without_tokens_route(upstream: str) -> web.Application:
    """Every route of `upstream` except `/inference/v1/generate` (a server that lacks it: 404)."""

    async def forward(request: web.Request) -> web.Response:
        if request.path.startswith("/inference/"):
            return web.json_response({"error": {"message": "Not Found"}}, status=404)
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                f"{upstream}{request.path_qs}",
                data=await request.read(),
                headers=request.headers,
            ) as response,
        ):
            body = await response.read()
            return web.Response(body=body, status=response.status, content_type=response.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def train(workspace: Path, url: str, name: str) -> tuple[str, list[dict[str, Any]]]:
    config = workspace / f"{name}.toml"
    config.write_text(CONFIG.format(url=url))
    result = cli.run(
        [sys.executable, "-m", "workbench", "train", str(config), "--set", f"output_dir='runs/{name}'"],
        cwd=workspace,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [
        json.loads(line) for line in (workspace / "runs" / name / "metrics.jsonl").read_text().splitlines()
    ]
    return result.stdout + result.stderr, rows


def test_tokens_in_gives_one_exact_sample_per_rollout(
    tiny_qwen_workspace: Path, qwen_server: ServerProcess
) -> None:
    output, rows = train(tiny_qwen_workspace, f"{qwen_server.base_url}/v1", "tokens-in")
    assert "tokens-in route" not in output
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["rollout/samples_per_rollout"] == 1.0  # 3 turns, one sample
        assert row["mismatch_kl/all/mean"] < 1e-3 and row["mismatch_kl/all/max"] < 1e-3


@pytest.mark.extended  # the fallback itself is proven fast in test_tokens_in_http; -m '' runs this
def test_a_server_without_the_route_trains_through_chat_and_says_so_once(
    tiny_qwen_workspace: Path, qwen_server: ServerProcess
) -> None:
    with serve_in_thread(without_tokens_route(qwen_server.base_url)) as url:
        output, rows = train(tiny_qwen_workspace, f"{url}/v1", "chat-path")
    assert output.count("has no tokens-in route (/inference/v1/generate)") == 1
    assert [r["step"] for r in rows] == [1, 2]
    # The chat path re-renders: earlier turns lose their thinking, the prefix breaks, and a
    # 3-turn rollout becomes several samples (each still exactly what that turn's sampler saw).
    assert all(r["rollout/samples_per_rollout"] > 1 for r in rows)
    assert all(r["mismatch_kl/all/max"] < 1e-3 for r in rows)
