"""A model server that fails is never a finished result (issue 12): rollouts it failed after the
retries (connection, timeout, 5xx) are marked, left out of reward statistics, make the eval exit 1
with the resume command, and are redone by `-R` while every real result is kept."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.servers import EchoBackend, last_user_text, make_app, serve_in_thread
from tests.test_eval_run import results_lines, start_cli
from workbench.engine.summary import summarize
from workbench.inference.server import error_response
from workbench.types import Group, Rollout, RolloutError


class Outage:
    """Answers 503 to every request for the first `count` distinct prompts while `down`."""

    def __init__(self, count: int) -> None:
        self.count, self.down, self.unlucky, self.failed = count, True, set[str](), 0

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        if request.path.endswith("/chat/completions") and self.down:
            text = last_user_text(await request.json())
            if text in self.unlucky or len(self.unlucky) < self.count:
                self.unlucky.add(text)
                self.failed += 1
                return error_response(503, "injected outage", type_="server_error")
        return await handler(request)


def test_server_failures_are_not_results_and_resume_redoes_them(tmp_path: Path):
    outage = Outage(2)
    with serve_in_thread(make_app(EchoBackend(), middlewares=(outage.middleware,))) as url:
        args = ["eval", "run", "reverse-text", "-m", "echo", "-b", f"{url}/v1", "-n", "6", "-r", "2"]
        proc = start_cli(*args, cwd=tmp_path)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 1, out + err
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert (
            len(errors) == 1
            and "4 of 12 rollouts failed on the model call" in errors[0]
            and "injected outage" in errors[0]
            and " -R " in errors[0]
        ), err
        assert "Traceback" not in err and outage.failed >= 4 * 5  # every attempt of every retry failed
        run_dir = next(
            (
                tmp_path / "environments" / "reverse_text" / "outputs" / "evals" / "reverse-text--echo"
            ).iterdir()
        )
        meta = json.loads((run_dir / "metadata.json").read_text())
        assert meta["status"] == "failed" and meta["summary"]["infrastructure_failures"] == 4
        assert meta["summary"]["num_groups"] == 4 and meta["summary"]["incomplete_groups"] == 2
        marked = [r for r in results_lines(run_dir) if r["error"] and r["error"]["infrastructure"]]
        assert len(marked) == 4
        kept = {
            (r["example_id"], r["rollout_index"]): r["timing"]
            for r in results_lines(run_dir)
            if not r["error"]
        }

        outage.down = False  # the server is back
        resume = start_cli("eval", "run", "-R", str(run_dir), cwd=tmp_path)
        _, err = resume.communicate(timeout=300)
        assert resume.returncode == 0, err
    lines = results_lines(run_dir)
    assert sorted((r["example_id"], r["rollout_index"]) for r in lines) == [
        (e, i) for e in range(6) for i in range(2)
    ]
    assert not any(r["error"] for r in lines)  # no server failure left in the results
    assert all(
        kept[key] == r["timing"] for r in lines if (key := (r["example_id"], r["rollout_index"])) in kept
    )
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "finished" and "infrastructure_failures" not in meta["summary"]


def test_summary_leaves_server_failures_out_of_the_reward():
    def rollout(example: int, index: int, reward: float, error: RolloutError | None = None) -> Rollout:
        return Rollout(example_id=example, rollout_index=index, prompt=[], reward=reward, error=error)

    outage = RolloutError("InferenceError", "503", where="inference", infrastructure=True)
    env_bug = RolloutError("ValueError", "bad tool", where="env")
    groups = [
        Group(0, [rollout(0, 0, 1.0), rollout(0, 1, 0.0)]),
        Group(1, [rollout(1, 0, 0.0, outage), rollout(1, 1, 1.0)]),
        Group(2, [rollout(2, 0, 0.0, env_bug), rollout(2, 1, 0.0)]),
    ]
    summary = summarize(groups)
    assert (
        summary["reward_mean"] == 0.25 and summary["num_groups"] == 2
    )  # the env's error is data, the outage is not
    assert (
        summary["infrastructure_failures"] == 1
        and summary["incomplete_groups"] == 1
        and summary["errors"] == 1
    )
