"""`workbench env list|init|install` through the real CLI: the listing, a template that passes its
own tests and evaluates end to end, install's pip command, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.servers import EchoBackend, make_app, serve_in_thread
from tests.test_cli_errors import assert_one_line_error, workbench

WIDE = {"COLUMNS": "200"}  # so rich does not wrap table cells


def test_env_list_table_and_json(tmp_path: Path):
    result = workbench("env", "list", cwd=tmp_path, env_extra=WIDE)
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 4}
    for env_id, kind in (
        ("reverse-text", "SingleTurnEnv"),
        ("alphabet-sort", "MultiTurnEnv"),
        ("wordle", "MultiTurnEnv"),
        ("wiki-search", "ToolEnv"),
    ):
        assert env_id in rows and kind in rows[env_id] and "bundled" in rows[env_id], env_id
    assert "max_turns=6" in result.stdout and "guess a secret 5-letter word" in result.stdout

    listing = json.loads(workbench("env", "list", "--json", cwd=tmp_path).stdout)
    wiki = next(e for e in listing if e["id"] == "wiki-search")
    assert (
        wiki["kind"] == "ToolEnv"
        and wiki["arguments"]["max_turns"] == 10
        and wiki["arguments"]["judge_model"] is None
    )
    assert wiki["description"].startswith("answer questions by searching")


def test_env_list_shows_a_broken_env_without_failing(tmp_path: Path):
    broken = tmp_path / "environments" / "broken_env"
    broken.mkdir(parents=True)
    (broken / "broken_env.py").write_text('"""broken-env: never imports."""\nimport no_such_module_xyz\n')
    result = workbench("env", "list", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    entry = next(e for e in json.loads(result.stdout) if e["id"] == "broken-env")
    assert entry["origin"] == "workspace" and "No module named 'no_such_module_xyz'" in entry["error"]


def test_env_init_makes_a_package_that_passes_its_tests_and_evaluates(tmp_path: Path):
    result = workbench("env", "init", "my-env", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "environments" / "my_env"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "README.md",
        "my_env.py",
        "pyproject.toml",
        "tests/test_my_env.py",
    ]
    assert 'name = "my-env"' in (folder / "pyproject.toml").read_text()
    assert "python -m pytest environments/my_env" in result.stdout

    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "environments/my_env"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tests.returncode == 0 and "5 passed" in tests.stdout, tests.stdout + tests.stderr

    listed = json.loads(workbench("env", "list", "--json", cwd=tmp_path).stdout)
    mine = next(e for e in listed if e["id"] == "my-env")
    assert (
        mine["kind"] == "SingleTurnEnv"
        and mine["origin"] == "workspace"
        and mine["arguments"]["max_value"] == 100
    )

    with serve_in_thread(make_app(EchoBackend())) as url:
        run = workbench(
            "eval", "run", "my-env", "-m", "echo", "-b", f"{url}/v1", "-n", "2", "-r", "2", cwd=tmp_path
        )
    assert run.returncode == 0, run.stderr
    results = next((folder / "outputs" / "evals" / "my-env--echo").iterdir()) / "results.jsonl"
    assert len(results.read_text().splitlines()) == 4 and "correct_answer" in run.stdout

    assert_one_line_error(workbench("env", "init", "my-env", cwd=tmp_path), "already exists")


def test_env_init_rejects_bad_names(tmp_path: Path):
    assert_one_line_error(workbench("env", "init", "My Env", cwd=tmp_path), "not a valid environment name")
    assert_one_line_error(workbench("env", "init", "json", cwd=tmp_path), "'json' is already the name")
    assert_one_line_error(workbench("env", "init", "class", cwd=tmp_path), "Python keyword")
    assert not (tmp_path / "environments").exists()


def test_env_install_dry_run_and_errors(tmp_path: Path):
    assert workbench("env", "init", "my_env", cwd=tmp_path).returncode == 0
    result = workbench("env", "install", "my-env", "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    folder = (tmp_path / "environments" / "my_env").resolve()
    assert result.stdout.split() == [sys.executable, "-m", "pip", "install", "-e", str(folder)]
    by_path = workbench("env", "install", str(folder), "--dry-run", cwd=tmp_path)
    assert by_path.stdout.split()[-1] == str(folder)

    assert_one_line_error(
        workbench("env", "install", "nope", cwd=tmp_path), "no environment folder", "env init nope"
    )
    (tmp_path / "environments" / "bare").mkdir()
    (tmp_path / "environments" / "bare" / "bare.py").write_text("")
    assert_one_line_error(workbench("env", "install", "bare", cwd=tmp_path), "has no pyproject.toml")


def test_env_help_teaches(tmp_path: Path):
    top = workbench("env", "--help", cwd=tmp_path)
    assert top.returncode == 0 and all(c in top.stdout for c in ("list", "init", "install"))
    assert "load_environment" in top.stdout
    assert "-a" in workbench("env", "list", "--help", cwd=tmp_path).stdout
    assert "python -m pytest environments/my_env" in workbench("env", "init", "--help", cwd=tmp_path).stdout
    assert "--dry-run" in workbench("env", "install", "--help", cwd=tmp_path).stdout
