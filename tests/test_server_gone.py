"""After the model server dies mid-eval (issue 33, item 10): connections refused on every try
mean the server is gone — the run gives up within the retries' backoff instead of waiting out
the 60 s stall timeout — and the progress line counts only the rollouts that were saved."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from tests.servers import EchoBackend, Gate, first_prompts, make_app, serve_in_thread
from tests.test_eval_run import results_lines, start_cli
from tests.test_openai_client import free_port
from workbench.engine.retry import RetryingClient, RetryPolicy
from workbench.errors import ServerGone
from workbench.inference.openai_client import OpenAIClient
from workbench.types import SamplingParams


def test_refused_on_every_try_is_gone_without_waiting_for_the_stall_timeout():
    async def main() -> None:
        client = OpenAIClient(f"http://127.0.0.1:{free_port()}/v1", model="echo")
        policy = RetryPolicy(max_attempts=3, base_delay_s=0.01, gone_after_s=3600.0)  # an hour of silence
        retrying = RetryingClient(client, policy)
        try:
            with pytest.raises(ServerGone, match="cannot connect"):
                await retrying.chat(
                    [{"role": "user", "content": "hi"}], sampling=SamplingParams(max_tokens=4)
                )
        finally:
            await client.close()

    asyncio.run(main())


def test_a_server_that_dies_mid_eval_gives_up_counting_only_saved_rollouts(tmp_path: Path):
    gate = Gate(first_prompts(4))  # 4 prompts answered (8 rollouts), the rest wait
    args = ["eval", "run", "reverse-text", "-m", "echo", "-n", "24", "-r", "2", "-c", "4"]
    # The server stops before the gate lets go of what it holds (the `with` exits innermost
    # first): no retry can reach the backend after the 4 prompts, however loaded the machine.
    with gate, serve_in_thread(make_app(EchoBackend(), middlewares=(gate.middleware,))) as url:
        proc = start_cli(*args, "-b", f"{url}/v1", cwd=tmp_path)
        gate.wait_held(proc=proc)
    # the server is gone: what it held is dropped and every retry is refused
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    [line] = [line for line in err.splitlines() if line.startswith("error: ")]
    assert "gave up: cannot connect" in line and "8 of 48 rollouts are saved" in line, line
    run_dir = next((tmp_path / "environments").rglob("metadata.json")).parent
    by_example: dict[int, list[dict]] = {}
    for record in results_lines(run_dir):
        by_example.setdefault(record["example_id"], []).append(record)
    saved = [g for g in by_example.values() if len(g) == 2 and not any(r["error"] for r in g)]
    assert len(saved) == 4  # the 4 answered prompts; a group the server failed part of is no result
    counts = [int(m) for m in re.findall(r"(\d+)/48 rollouts", err)]
    assert counts and max(counts) == 8, counts  # never more than what was saved
