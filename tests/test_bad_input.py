"""Ordinary mistakes get one line and exit code 1, before any rollout, and nothing is left
behind: wrongly typed env or sampling arguments, output folders that cannot exist, bad ports, a
huge env name, an API key pasted where its variable's name belongs (never echoed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cli
from tests.servers import EchoBackend, make_app, serve_in_thread
from tests.test_train_config import one_line_error

KEY = "sk-live-0123456789abcdefghijklmnopqrstuv"


def workbench(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBENCH_WORKSPACE", "WANDB_API_KEY")}
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def server() -> str:
    """An OpenAI-compatible server that every bad input here must fail before using for a rollout."""
    backend = EchoBackend("echo")
    with serve_in_thread(make_app(backend)) as url:
        yield f"{url}/v1"
    assert backend.calls == []  # no rollout ever started


def no_runs(workspace: Path) -> bool:
    """Nothing was written: no eval, GEPA or training run folder."""
    return not list(workspace.glob("environments/*/outputs/*/*/*")) and not list(
        workspace.glob("outputs/runs/*")
    )


def test_wrongly_typed_env_arg_is_one_line(tmp_path: Path, server: str):
    line = one_line_error(
        workbench(
            "eval",
            "run",
            "reverse-text",
            "-m",
            "echo",
            "-b",
            server,
            "-a",
            '{"num_eval_examples": "many"}',
            cwd=tmp_path,
        ),
        "reverse-text",
        "num_eval_examples",
        "'many'",
        "integer",
    )
    assert "Traceback" not in line and no_runs(tmp_path)


def test_gepa_wrongly_typed_env_arg_is_one_line(tmp_path: Path, server: str):
    one_line_error(
        workbench(
            "gepa",
            "run",
            "reverse-text",
            "-m",
            "echo",
            "-b",
            server,
            "-B",
            "100",
            "-n",
            "5",
            "-N",
            "5",
            "-a",
            '{"max_words": "three"}',
            cwd=tmp_path,
        ),
        "max_words",
        "'three'",
    )
    assert no_runs(tmp_path)


def test_bad_sampling_value_fails_before_any_rollout(tmp_path: Path, server: str):
    one_line_error(
        workbench(
            "eval", "run", "reverse-text", "-m", "echo", "-b", server, "-S", '{"top_p": "x"}', cwd=tmp_path
        ),
        "top_p",
        "number",
    )
    one_line_error(
        workbench(
            "eval",
            "run",
            "reverse-text",
            "-m",
            "echo",
            "-b",
            server,
            "-T",
            "0",
            "-S",
            '{"max_tokens": 0}',
            cwd=tmp_path,
        ),
        "max_tokens",
        "out of range",
    )
    assert no_runs(tmp_path)


def test_a_pasted_key_is_refused_and_never_echoed(tmp_path: Path, server: str):
    result = workbench("eval", "run", "reverse-text", "-m", "echo", "-b", server, "-k", KEY, cwd=tmp_path)
    one_line_error(result, "NAME of an environment variable")
    assert KEY not in result.stdout + result.stderr and no_runs(tmp_path)
    config = tmp_path / "server.toml"
    config.write_text(
        f'[[env]]\nid = "reverse-text"\n[inference]\nmode = "server"\nbase_urls = ["{server}"]\n'
        f'api_key_var = "{KEY}"\n'
    )
    result = workbench("train", str(config), "--dry-run", cwd=tmp_path)
    one_line_error(result, "api_key_var", "NAME of an environment variable")
    assert KEY not in result.stdout + result.stderr


def test_a_huge_env_name_is_one_short_line(tmp_path: Path):
    line = one_line_error(
        workbench("eval", "run", "x" * 5000, "-m", "tiny", cwd=tmp_path), "unknown environment"
    )
    assert len(line) < 600


def test_output_folder_that_cannot_exist(tmp_path: Path, server: str):
    one_line_error(
        workbench(
            "gepa",
            "run",
            "reverse-text",
            "-m",
            "echo",
            "-b",
            server,
            "-B",
            "100",
            "-n",
            "5",
            "-N",
            "5",
            "-o",
            "/dev/null/run",
            cwd=tmp_path,
        ),
        "cannot create the run folder",
        "/dev/null/run",
    )


def test_training_output_dir_that_cannot_exist_and_unknown_env_leave_nothing(
    tmp_path: Path, tiny_model: Path
):
    base = f'model = "{tiny_model}"\nmax_steps = 1\nbatch_size = 4\nrollouts_per_example = 2\n'
    bad_dir = tmp_path / "a.toml"
    bad_dir.write_text(base + 'output_dir = "/proc/nope"\n[[env]]\nid = "reverse-text"\n')
    one_line_error(
        workbench("train", str(bad_dir), cwd=tmp_path), "cannot create the run folder", "/proc/nope"
    )
    unknown = tmp_path / "b.toml"
    unknown.write_text(base + '[[env]]\nid = "no-such-env"\n')
    one_line_error(workbench("train", str(unknown), cwd=tmp_path), "unknown environment 'no-such-env'")
    dry = workbench("train", str(unknown), "--dry-run", cwd=tmp_path)  # the plan, then what a real run lacks
    one_line_error(dry, "a real run cannot start", "unknown environment 'no-such-env'", "available: ")
    assert "no-such-env" in dry.stdout
    assert no_runs(tmp_path)


def test_serve_port_out_of_range_and_in_use(tmp_path: Path, tiny_model: Path):
    one_line_error(workbench("serve", str(tiny_model), "--port", "99999", cwd=tmp_path), "--port", "99999")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        one_line_error(
            workbench("serve", str(tiny_model), "--port", str(port), cwd=tmp_path),
            f"cannot listen on 127.0.0.1:{port}",
        )
