"""`workbench env install` for a wheel and for a hub id (issue 13): real pip, a real wheel built from a
vendored verifiers environment, and a PEP 503 package index served on 127.0.0.1 in the hub's
layout (HUB/OWNER/simple/NAME/). pip installs into a folder of the test's own (PIP_TARGET, no
dependencies: they are installed already), which the evaluation then imports from."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import cli
from tests.test_cli_errors import assert_one_line_error

pytest.importorskip("verifiers", reason="the verifiers extra is not installed")

FIXTURE = Path(__file__).parent / "fixtures" / "verifiers_envs" / "reverse_text"


def workbench(
    *args: str, cwd: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_WORKSPACE"}
    env.update(extra_env or {})
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vendored reverse_text package built as a wheel, as the hub serves it."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "src"
    shutil.copytree(FIXTURE, source)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (built,) = out.glob("reverse_text-*.whl")
    return built


@contextmanager
def package_index(root: Path) -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def installed_then_evaluated(target: str, tmp_path: Path, tiny_model: Path, hub: str = "") -> None:
    site = tmp_path / "site"
    workspace = tmp_path / "workspace"
    (workspace / "outputs" / "models").mkdir(parents=True)
    (workspace / "outputs" / "models" / "tiny").symlink_to(tiny_model)
    pip_env = {"PIP_TARGET": str(site), "PIP_NO_DEPS": "1", "WORKBENCH_HUB_URL": hub}
    result = workbench("env", "install", target, cwd=workspace, extra_env=pip_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "installed" in result.stdout and (site / "reverse_text.py").is_file()

    path = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    listed = workbench("env", "list", "--json", cwd=workspace, extra_env=path)
    evaluated = workbench(
        "eval",
        "run",
        "reverse-text",
        "-m",
        "tiny",
        "-n",
        "2",
        "-r",
        "1",
        "-t",
        "8",
        cwd=workspace,
        extra_env=path,
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert listed.returncode == 0, listed.stderr
    assert '"origin": "installed"' in listed.stdout.split('"id": "reverse-text"')[1].split("}")[0]
    (run_dir,) = [
        Path(line.split("saved to ")[1].strip())
        for line in evaluated.stdout.splitlines()
        if "saved to " in line
    ]
    assert len((run_dir / "results.jsonl").read_text().splitlines()) == 2


def test_a_wheel_installs_and_evaluates(wheel: Path, tmp_path: Path, tiny_model: Path):
    installed_then_evaluated(str(wheel), tmp_path, tiny_model)


@pytest.mark.extended
def test_a_hub_id_installs_from_the_hubs_index(wheel: Path, tmp_path: Path, tiny_model: Path):
    index = tmp_path / "hub" / "primeintellect" / "simple" / "reverse-text"
    index.mkdir(parents=True)
    shutil.copy(wheel, index / wheel.name)
    (index / "index.html").write_text(f'<html><body><a href="{wheel.name}">{wheel.name}</a></body></html>')
    with package_index(tmp_path / "hub") as hub:
        dry = workbench(
            "env",
            "install",
            "primeintellect/reverse-text@0.1.4",
            "--dry-run",
            cwd=tmp_path,
            extra_env={"WORKBENCH_HUB_URL": hub},
        )
        assert dry.stdout.split()[-3:] == [
            "reverse-text==0.1.4",
            "--extra-index-url",
            f"{hub}/primeintellect/simple/",
        ]
        assert_one_line_error(
            workbench(
                "env",
                "install",
                "primeintellect/no-such-env",
                cwd=tmp_path,
                extra_env={"WORKBENCH_HUB_URL": hub},
            ),
            "is not on the Environments Hub",
        )
        installed_then_evaluated("primeintellect/reverse-text@0.1.4", tmp_path, tiny_model, hub)


def test_an_unreachable_hub_is_one_line(tmp_path: Path):
    result = workbench(
        "env",
        "install",
        "primeintellect/reverse-text",
        cwd=tmp_path,
        extra_env={"WORKBENCH_HUB_URL": f"http://127.0.0.1:{closed_port()}"},
    )
    assert_one_line_error(result, "cannot reach the Environments Hub", "workbench env install PATH")
    assert_one_line_error(workbench("env", "install", "missing.whl", cwd=tmp_path), "no wheel file")
