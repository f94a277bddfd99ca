"""Validation at the door (issue 33, item 6): numbers out of range or not finite, sampling keys
and state columns one typo away from a real one, and env ids that are paths are refused with one
line naming the key (and the closest valid one), exit code 1, before any rollout — and a training
dry run says "valid" only when the real run would validate too."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.servers import EchoBackend, make_app, serve_in_thread
from tests.test_bad_input import workbench

REPO = Path(__file__).resolve().parent.parent
RL_CONFIG = REPO / "configs" / "rl" / "reverse-text.toml"


@pytest.fixture(scope="module")
def server() -> str:
    backend = EchoBackend("echo")
    with serve_in_thread(make_app(backend)) as url:
        yield f"{url}/v1"
    assert backend.calls == []  # no rollout ever started


def _one_error(proc) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["-r", "1000000000000"], "rollouts_per_example"),
        (["-T", "inf"], "temperature: Input should be a finite number"),
        (["--seed", "99999999999"], "seed"),
        (["-S", '{"top_pp": 0.9}'], "did you mean 'top_p'"),
        (["-S", '{"temperature": 1e400}'], "finite"),
    ],
    ids=["huge-r", "inf-T", "huge-seed", "typo-sampling-key", "inf-in-S"],
)
def test_eval_flags_out_of_range_are_one_line(tmp_path: Path, server: str, flags: list[str], expected: str):
    line = _one_error(
        workbench("eval", "run", "reverse-text", "-m", "echo", "-b", server, *flags, cwd=tmp_path)
    )
    assert expected in line, line
    assert not (tmp_path / "environments").exists()  # no run folder was left behind


@pytest.mark.parametrize("env_id", ["../../nonexist/reverse_text", "/abs/path/reverse_text"])
def test_a_path_is_not_an_env_id(tmp_path: Path, server: str, env_id: str):
    line = _one_error(workbench("eval", "run", env_id, "-m", "echo", "-b", server, cwd=tmp_path))
    assert "not an environment id" in line and "env install" in line, line


def test_a_folder_given_to_gepa_is_not_an_env_id(tmp_path: Path):
    line = _one_error(
        workbench("gepa", "run", str(REPO / "environments" / "reverse_text"), "--dry-run", cwd=tmp_path)
    )
    assert "is a folder, not an environment id" in line, line


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("max_steps=1e23", "max_steps"),
        ("max_steps=3000000000", "out of range"),
        ("learning_rate=1e400", "finite"),
        ("seed=99999999999", "out of range"),
    ],
)
def test_train_dry_run_refuses_what_the_run_would(tmp_path: Path, override: str, expected: str):
    line = _one_error(workbench("train", str(RL_CONFIG), "--set", override, "--dry-run", cwd=tmp_path))
    assert expected in line, line


def test_an_unknown_state_column_names_the_closest_key(tmp_path: Path):
    with serve_in_thread(make_app(EchoBackend("echo"))) as url:
        proc = workbench(
            "eval",
            "run",
            "reverse-text",
            "-m",
            "echo",
            "-b",
            f"{url}/v1",
            "-n",
            "2",
            "-C",
            "answr",
            cwd=tmp_path,
        )
    line = _one_error(proc)
    assert "has no 'answr' (did you mean 'answer'?)" in line, line
