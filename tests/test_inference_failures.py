"""A model call that fails is never a result (issue 33, item 1): a server whose model list
answers but which rejects every completion (a bad key's 401, a 400, an HTML page, malformed JSON,
an empty `choices` list) makes `eval run` exit 1 with the run `failed`, the server's own message
in one line and no difficulty verdict; a partial failure names its count and `-R` redoes it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.servers import EchoBackend, last_user_text, make_app, serve_in_thread
from tests.test_eval_run import results_lines, start_cli
from workbench.inference.server import error_response

Handler = Callable[[web.Request], Any]


def _bad_key() -> web.StreamResponse:
    return error_response(401, "Incorrect API key provided: sk-wr***", type_="invalid_request_error")


def _bad_request() -> web.StreamResponse:
    return error_response(400, "unsupported parameter: 'logprobs'", type_="invalid_request_error")


def _html() -> web.StreamResponse:
    return web.Response(status=200, text="<html><body>Sign in</body></html>", content_type="text/html")


def _bad_json() -> web.StreamResponse:
    return web.Response(status=200, text='{"choices": [', content_type="application/json")


def _no_choices() -> web.StreamResponse:
    body = {"id": "x", "object": "chat.completion", "model": "echo", "choices": []}
    return web.json_response(body)


def _rejecting(answer: Callable[[], web.StreamResponse], *, only: set[str] | None = None) -> Any:
    """Middleware: completions get `answer` (for prompts in `only`, or all); /v1/models works."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.endswith("/chat/completions"):
            if only is None or last_user_text(await request.json()) in only:
                return answer()
        return await handler(request)

    return middleware


def _run_dir(tmp_path: Path) -> Path:
    evals = tmp_path / "environments" / "reverse_text" / "outputs" / "evals" / "reverse-text--echo"
    return next(evals.iterdir())


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (_bad_key, "HTTP 401"),
        (_bad_request, "unsupported parameter"),
        (_html, "is not JSON (HTTP 200): '<html>"),
        (_bad_json, "is not JSON"),
        (_no_choices, "no choices"),
    ],
    ids=["401", "400", "html", "bad-json", "empty-choices"],
)
def test_every_call_failing_is_a_failed_run_with_the_servers_message(
    tmp_path: Path, answer: Callable[[], web.StreamResponse], expected: str
):
    with serve_in_thread(make_app(EchoBackend(), middlewares=(_rejecting(answer),))) as url:
        args = ["eval", "run", "reverse-text", "-m", "echo", "-b", f"{url}/v1", "-n", "4", "-r", "2"]
        proc = start_cli(*args, cwd=tmp_path)
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    assert "8 of 8 rollouts failed on the model call" in errors[0] and expected in errors[0], errors[0]
    assert " -R " in errors[0] and "Traceback" not in err
    assert "difficulty" not in out and "too hard" not in out, out
    meta = json.loads((_run_dir(tmp_path) / "metadata.json").read_text())
    assert meta["status"] == "failed" and meta["summary"]["infrastructure_failures"] == 8
    assert expected in meta["summary"]["server_errors"][0]["message"]


def test_a_partial_failure_names_its_count_and_resume_redoes_it(tmp_path: Path):
    (tmp_path / "probe").mkdir()
    unlucky: set[str] = set()
    with serve_in_thread(make_app(EchoBackend())) as url:
        # Which prompts fail is decided by text: one prompt of a first eval, read back from its results.
        probe = ["eval", "run", "reverse-text", "-m", "echo", "-b", f"{url}/v1", "-n", "4", "-r", "1"]
        assert start_cli(*probe, cwd=tmp_path / "probe").wait(timeout=300) == 0
        first = results_lines(_run_dir(tmp_path / "probe"))[0]
        unlucky.add(next(m["content"] for m in reversed(first["prompt"]) if m["role"] == "user"))
    rejecting = _rejecting(_bad_key, only=unlucky)
    with serve_in_thread(make_app(EchoBackend(), middlewares=(rejecting,))) as url:
        args = ["eval", "run", "reverse-text", "-m", "echo", "-b", f"{url}/v1", "-n", "4", "-r", "2"]
        proc = start_cli(*args, cwd=tmp_path)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 1, out + err
        assert "2 of 8 rollouts failed on the model call" in err and "HTTP 401" in err, err
        run_dir = _run_dir(tmp_path)
        unlucky.clear()  # the key is fixed: every call answers
        resume = start_cli("eval", "run", "-R", str(run_dir), cwd=tmp_path)
        _, err = resume.communicate(timeout=300)
    assert resume.returncode == 0, err
    lines = results_lines(run_dir)
    assert len(lines) == 8 and not any(r["error"] for r in lines)
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "finished"
