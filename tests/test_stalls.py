"""A stalled or vanished model server (issue 12): request timeouts and tries are settings (flags
and the endpoint registry); a stall is reported while the run waits, and a server that answers
nothing gives up the run with one line that says how to resume it, keeping every finished result.
A server that is merely busy never times a request out.

The stalls here are servers the test holds (a `Gate` that never answers); the short timeouts
only make the test quick, they are not what it waits on."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.servers import EchoBackend, Gate, last_user_text, make_app, serve_in_thread
from tests.test_cli_errors import assert_one_line_error
from tests.test_eval_run import results_lines, start_cli
from workbench.errors import InferenceError, UserError
from workbench.inference.endpoints import load_endpoints
from workbench.inference.openai_client import DEFAULT_TIMEOUT_S, DEFAULT_TRIES, OpenAIClient, RoundRobinClient
from workbench.inference.resolve import make_client
from workbench.types import SamplingParams


def eval_runs(workspace: Path) -> list[Path]:
    root = workspace / "environments" / "reverse_text" / "outputs" / "evals" / "reverse-text--echo"
    return sorted(root.iterdir()) if root.is_dir() else []


def test_a_stalled_server_is_reported_then_the_eval_gives_up_and_resumes(tmp_path: Path):
    gate = Gate(0)  # /v1/models answers; every chat request waits, unanswered, until the test opens it
    with gate, serve_in_thread(make_app(EchoBackend(), middlewares=(gate.middleware,))) as url:
        args = [
            "eval",
            "run",
            "reverse-text",
            "-m",
            "echo",
            "-b",
            f"{url}/v1",
            "-n",
            "3",
            "-r",
            "2",
            "--timeout",
            "1",
            "--tries",
            "2",
        ]
        proc = start_cli(*args, cwd=tmp_path)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 1, out + err
        assert f"no response from {url}/v1/chat/completions for 1 s, retrying 2/2" in err, err
        final_error(
            err, "gave up: no response from", "2 tries", "0 of 6 rollouts are saved", "workbench eval run -R "
        )
        assert gate.held >= 2 * 2  # every try of the first requests reached the server and waited
        (run_dir,) = eval_runs(tmp_path)
        meta = json.loads((run_dir / "metadata.json").read_text())
        assert meta["status"] == "failed" and meta["error"].startswith("gave up: no response from")
        assert "retrying 2/2" in (run_dir / "run.log").read_text()
        assert results_lines(run_dir) == []  # nothing the server never answered is saved as a result

        gate.open()  # the server answers again
        resume = start_cli("eval", "run", "-R", str(run_dir), cwd=tmp_path)
        _, err = resume.communicate(timeout=300)
        assert resume.returncode == 0, err
    lines = results_lines(run_dir)
    assert sorted((r["example_id"], r["rollout_index"]) for r in lines) == [
        (e, i) for e in range(3) for i in range(2)
    ]
    assert not any(r["error"] for r in lines)
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "finished"


def proc_result(proc: Any, err: str) -> Any:
    import subprocess

    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


def final_error(err: str, *needles: str) -> None:
    """The run ends with one `error:` line (after the notices it printed while it waited)."""
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in err, err
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_a_busy_server_never_times_a_request_out():
    """One request is held for longer than the timeout while the server keeps answering others:
    it is not a stall, so that request is neither timed out nor retried."""
    timeout = 3.0
    gate = Gate(lambda body: last_user_text(body) != "held")
    backend = EchoBackend()

    async def scenario(url: str) -> str:
        client = OpenAIClient(f"{url}/v1", "echo", timeout_s=timeout)
        sampling = SamplingParams(max_tokens=16)
        try:
            held = asyncio.ensure_future(
                client.chat([{"role": "user", "content": "held"}], sampling=sampling)
            )
            started = time.monotonic()
            while gate.held < 1:
                await asyncio.sleep(0.01)
            while time.monotonic() - started < 2.5 * timeout:  # the server answers others all along
                await client.chat([{"role": "user", "content": "busy"}], sampling=sampling)
            assert not held.done()
            gate.allow(1)
            return (await held)[0].message["content"]
        finally:
            await client.close()

    with gate, serve_in_thread(make_app(backend, middlewares=(gate.middleware,))) as url:
        answer = asyncio.run(scenario(url))
    assert answer == "dleh" and gate.held == 1  # answered, and never sent twice


def test_a_silent_server_times_a_request_out_with_the_url_and_seconds():
    gate = Gate(0)

    async def scenario(url: str) -> InferenceError:
        client = OpenAIClient(f"{url}/v1", "echo", timeout_s=0.5)
        try:
            with pytest.raises(InferenceError) as caught:
                await client.chat([{"role": "user", "content": "hi"}], sampling=SamplingParams())
            return caught.value
        finally:
            await client.close()

    with gate, serve_in_thread(make_app(EchoBackend(), middlewares=(gate.middleware,))) as url:
        error = asyncio.run(scenario(url))
    assert error.transient and str(error) == f"no response from {url}/v1/chat/completions for 0.5 s"


def test_timeout_and_tries_come_from_flags_then_the_registry_then_defaults(tmp_path: Path):
    registry = tmp_path / "endpoints.toml"
    registry.write_text(
        '[[endpoint]]\nendpoint_id = "slow"\nmodel = "m"\nurl = "http://127.0.0.1:9/v1"\n'
        "timeout = 600\ntries = 2\n"
        '[[endpoint]]\nendpoint_id = "plain"\nmodel = "m"\nurl = "http://127.0.0.1:9/v1"\n'
        '[[endpoint]]\nendpoint_id = "pair"\nmodel = "m"\nurl = "http://127.0.0.1:9/v1"\ntries = 7\n'
        '[[endpoint]]\nendpoint_id = "pair"\nmodel = "m"\nurl = "http://127.0.0.1:10/v1"\n'
    )

    def limits(name: str, **flags: Any) -> tuple[float, int]:
        client = make_client(name, endpoints_file=str(registry), **flags)
        return client.timeout_s, client.tries  # type: ignore[attr-defined]

    assert limits("slow") == (600, 2)
    assert limits("slow", timeout_s=5, tries=9) == (5, 9)  # the command line wins
    assert limits("plain") == (DEFAULT_TIMEOUT_S, DEFAULT_TRIES) == (60, 5)
    assert limits("pair") == (60, 7)  # a retry may land on either replica: the most tries of the two
    assert isinstance(make_client("pair", endpoints_file=str(registry)), RoundRobinClient)
    assert limits("m", base_url="http://127.0.0.1:9/v1", timeout_s=2) == (2, DEFAULT_TRIES)

    registry.write_text('[[endpoint]]\nendpoint_id = "x"\nmodel = "m"\nurl = "http://h/v1"\ntimeout = 0\n')
    with pytest.raises(UserError, match=r"endpoints.toml:5: bad value for 'timeout'"):
        load_endpoints(registry)


def test_eval_flags_are_checked_and_saved_with_the_run(tmp_path: Path):
    result = start_cli(
        "eval",
        "run",
        "reverse-text",
        "-m",
        "echo",
        "-b",
        "http://127.0.0.1:9/v1",
        "--tries",
        "0",
        cwd=tmp_path,
    )
    _, err = result.communicate(timeout=120)
    assert_one_line_error(proc_result(result, err), "request_tries", "greater than or equal to 1")
    with serve_in_thread(make_app(EchoBackend())) as url:
        proc = start_cli(
            "eval",
            "run",
            "reverse-text",
            "-m",
            "echo",
            "-b",
            f"{url}/v1",
            "-n",
            "2",
            "-r",
            "1",
            "--timeout",
            "30",
            "--tries",
            "3",
            cwd=tmp_path,
        )
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    (run_dir,) = eval_runs(tmp_path)
    config = json.loads((run_dir / "metadata.json").read_text())["config"]
    assert (config["request_timeout"], config["request_tries"]) == (30, 3)  # a resume keeps them


def test_gepa_gives_up_with_one_line_when_the_policy_server_stalls(tmp_path: Path):
    from tests.test_gepa import finish, workbench

    gate = Gate(0)
    with gate, serve_in_thread(make_app(EchoBackend(), middlewares=(gate.middleware,))) as url:
        proc = workbench(
            "gepa",
            "run",
            "reverse-text",
            "-m",
            "echo",
            "-b",
            f"{url}/v1",
            "-B",
            "40",
            "-n",
            "4",
            "-N",
            "4",
            "--timeout",
            "0.5",
            "--tries",
            "2",
            cwd=tmp_path,
        )
        out, err = finish(proc)
    assert proc.returncode == 1, out + err
    final_error(
        err, "gave up: no response from", "every finished iteration is saved", "workbench gepa run -R "
    )
    (run_dir,) = (
        tmp_path / "environments" / "reverse_text" / "outputs" / "gepa" / "reverse-text--echo"
    ).iterdir()
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "failed" and meta["error"].startswith("gave up: no response from")


def test_a_gepa_evaluation_that_lost_rollouts_to_the_server_is_not_scored():
    """GEPA is never handed a server failure as a score of 0: the evaluation raises (gepa drops
    the iteration and goes on) and its metric calls are given back to the budget."""
    from tests.servers import ScriptedBackend
    from workbench.engine import RetryPolicy
    from workbench.gepa.adapter import WorkbenchAdapter
    from workbench.gepa.bridge import AsyncBridge
    from workbench.gepa.prompted_env import SYSTEM_PROMPT_COMPONENT, PromptedEnvs
    from workbench.gepa.scoring import Budget, CandidateScorer, DataItem, ServerFailures
    from workbench.types import Completion

    envs = PromptedEnvs("reverse-text", {})
    calls: list[str] = []

    def script(messages: Any, sampling: Any, tools: Any) -> list[Completion]:
        text = messages[-1]["content"]
        calls.append(text)
        if len(set(calls)) > 1 and text == calls[1]:  # the second prompt seen: the server always fails it
            raise InferenceError("HTTP 503 from server: overloaded", transient=True, status=503)
        return [
            Completion(
                message={"role": "assistant", "content": f"<reversed_text>{text[::-1]}</reversed_text>"},
                finish_reason="stop",
            )
        ]

    budget = Budget(20)
    with AsyncBridge() as bridge:
        adapter = WorkbenchAdapter(
            CandidateScorer(
                envs,
                ScriptedBackend(script),
                bridge,
                SamplingParams(),
                budget=budget,
                max_concurrent=1,
                retry=RetryPolicy(max_attempts=2, base_delay_s=0.001),
            )
        )
        batch = [DataItem("train", i) for i in range(3)]
        with pytest.raises(ServerFailures, match="1 of 3 rollouts failed on the model call \\(HTTP 503"):
            adapter.evaluate(batch, {SYSTEM_PROMPT_COMPONENT: envs.seed_prompt})
        assert budget.used == 0 and adapter.server_gone is None  # not spent; the server still answers others
        calls.clear()
        scored = adapter.evaluate(batch[:1], {SYSTEM_PROMPT_COMPONENT: envs.seed_prompt})
    assert budget.used == 1 and scored.scores == [1.0]
