"""Every user mistake gets one clear line on stderr and exit code 1 — never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cli


def workbench(*args: str, cwd: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_WORKSPACE"}
    env.update(env_extra or {})
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 1, result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


CASES = {
    "bad -a json": (
        ["eval", "run", "reverse-text", "-a", "{max_turns: 3"],
        ["-a/--env-args is not valid JSON"],
    ),
    "-a not an object": (["eval", "run", "reverse-text", "-a", "[1]"], ["must be a JSON object"]),
    "bad -S json": (
        ["eval", "run", "reverse-text", "-S", "{'top_p': 1}"],
        ["-S/--sampling-args is not valid JSON"],
    ),
    "unknown env": (
        ["eval", "run", "no-such-env"],
        ["unknown environment 'no-such-env'", "reverse-text", "alphabet-sort"],
    ),
    "bad env arg": (
        ["eval", "run", "alphabet-sort", "-a", '{"turns": 3}'],
        ["has no argument 'turns'", "max_turns"],
    ),
    "unknown model path": (
        ["eval", "run", "reverse-text", "-m", "./models/missing"],
        ["no model folder at './models/missing'"],
    ),
    "tiny not built": (["eval", "run", "reverse-text", "-m", "tiny"], ["workbench setup"]),
    "unreachable base url": (
        ["eval", "run", "reverse-text", "-m", "x", "-b", "http://127.0.0.1:9/v1"],
        ["127.0.0.1:9"],
    ),
    "missing api key var": (
        [
            "eval",
            "run",
            "reverse-text",
            "-m",
            "x",
            "-b",
            "http://127.0.0.1:9/v1",
            "-k",
            "WB_TEST_MISSING_KEY",
        ],
        ["WB_TEST_MISSING_KEY", "not set"],
    ),
    "bad -n": (["eval", "run", "reverse-text", "-n", "0"], ["num_examples"]),
    "resume nothing": (["eval", "run", "reverse-text", "-m", "tiny", "-R", "latest"], ["no earlier run"]),
    "show no runs": (["eval", "show"], ["no eval runs"]),
    "serve tiny not built": (["serve", "tiny"], ["workbench setup"]),
    "serve bad reasoning parser": (
        ["serve", "tiny", "--reasoning-parser", "qwen"],
        ["--reasoning-parser", "qwen3, deepseek_r1"],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_one_line_exit_1(name: str, tmp_path: Path):
    args, needles = CASES[name]
    assert_one_line_error(workbench(*args, cwd=tmp_path), *needles)


def test_malformed_endpoints_toml_names_file_line_and_key(tmp_path: Path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "endpoints.toml").write_text(
        '[[endpoint]]\nendpoint_id = "a"\nmodel = "m"\nurll = "http://127.0.0.1:8000/v1"\n'
    )
    result = workbench("eval", "run", "reverse-text", "-m", "a", cwd=tmp_path)
    assert_one_line_error(result, "endpoints.toml:4", "urll", "url")


def test_invalid_toml_syntax_in_endpoints(tmp_path: Path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "endpoints.toml").write_text('[[endpoint]]\nendpoint_id = "a\n')
    assert_one_line_error(workbench("eval", "run", "reverse-text", "-m", "a", cwd=tmp_path), "endpoints.toml")


def test_eval_config_unknown_key_names_file_line_and_suggestion(tmp_path: Path):
    config = tmp_path / "eval.toml"
    config.write_text('env_id = "reverse-text"\nmodel = "tiny"\nnum_exmples = 3\n')
    result = workbench("eval", "run", str(config), cwd=tmp_path)
    assert_one_line_error(result, "eval.toml:3", "num_exmples", "did you mean 'num_examples'")


def test_help_teaches_and_is_fast(tmp_path: Path):
    result = workbench("eval", "run", "--help", cwd=tmp_path)
    assert result.returncode == 0
    for flag in (
        "-m",
        "-n",
        "-r",
        "-c",
        "-t",
        "-T",
        "-S",
        "-a",
        "-b",
        "-k",
        "-e",
        "-s",
        "-v",
        "-C",
        "-R",
        "--seed",
    ):
        assert f" {flag}" in result.stdout, flag
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, workbench.cli.main; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert probe.stdout.strip() == "False"  # --help never imports torch


def test_an_unexpected_exception_is_one_line_with_its_traceback_in_a_file(tmp_path: Path):
    """A bug (any exception that is not a user error) ends with one line naming a file that
    holds its traceback; WORKBENCH_TRACEBACK=1 lets the traceback through."""
    code = (
        "import sys; from workbench.cli import main as m\n"
        "def boom() -> None:\n    raise RuntimeError('disk on fire\\nsecond line')\n"
        "m.app.command('boom')(boom); sys.argv = ['workbench', 'boom']; m.main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert line.startswith("error: unexpected RuntimeError: disk on fire (a Workbench bug; traceback in ")
    report = Path(line.rsplit("traceback in ", 1)[1].rstrip(")"))
    try:
        text = report.read_text()
        assert "Traceback" in text and "in boom" in text and "RuntimeError: disk on fire" in text
    finally:
        report.unlink()
    debug = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "WORKBENCH_TRACEBACK": "1"},
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "disk on fire" in debug.stderr


def test_a_logged_bug_is_one_line_naming_its_traceback_file(capsys):
    """`workbench serve` survives a backend bug and logs it (`logger.exception`): the terminal
    gets one line, the traceback goes to a file (`cli.crash.one_line_logging`)."""
    import logging
    from pathlib import Path

    from workbench.cli.crash import OneLineHandler

    logger = logging.getLogger("workbench.tests.one_line")
    logger.addHandler(OneLineHandler())
    logger.propagate = False
    try:
        try:
            raise ValueError("bad shape\nsecond line")
        except ValueError:
            logger.exception("backend failed on /v1/chat/completions")
        logger.warning("a plain note")
    finally:
        logger.handlers.clear()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[1] == "a plain note"
    assert lines[0].startswith(
        "error: backend failed on /v1/chat/completions: ValueError: bad shape (traceback in "
    )
    report = Path(lines[0].rsplit("traceback in ", 1)[1].rstrip(")"))
    text = report.read_text()
    report.unlink()
    assert "Traceback (most recent call last)" in text and "second line" in text
