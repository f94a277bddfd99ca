"""Hub ids (`-m owner/name`) load through transformers' real hub code: from a server in the
Hugging Face hub's file layout on 127.0.0.1 (HF_ENDPOINT), then from the cache with the hub
gone, and, never cached and unreachable, fail with one line that says what to do."""

from __future__ import annotations

import hashlib
import http.server
import os
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

REPO_ID = "wb-test/tiny-chat"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@contextmanager
def hub_serving(model_dir: Path) -> Iterator[str]:
    """`/OWNER/NAME/resolve/REV/FILE` answered from `model_dir` with the headers huggingface_hub
    reads (commit, etag, size); anything else is the hub's 404 for a missing entry."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self, with_body: bool) -> None:
            parts = self.path.split("?")[0].strip("/").split("/")
            path = model_dir / "/".join(parts[4:]) if len(parts) >= 5 and parts[2] == "resolve" else None
            if path is None or "/".join(parts[:2]) != REPO_ID or not path.is_file():
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if with_body:
                self.wfile.write(data)

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
            self.answer(False)

        def do_GET(self) -> None:  # noqa: N802
            self.answer(True)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def workbench(*args: str, cwd: Path, hub: str, hf_home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub, HF_HOME=str(hf_home), WORKBENCH_WORKSPACE=str(cwd))
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.extended
def test_a_hub_id_loads_from_the_hub_then_from_the_cache_without_it(tiny_model: Path, tmp_path: Path) -> None:
    hf_home = tmp_path / "hf"
    with hub_serving(tiny_model) as hub:
        first = workbench(
            "eval",
            "run",
            "reverse-text",
            "-m",
            REPO_ID,
            "-n",
            "2",
            "-r",
            "1",
            cwd=tmp_path,
            hub=hub,
            hf_home=hf_home,
        )
    assert first.returncode == 0, first.stderr + first.stdout
    # The hub is gone now: the cached copy serves, without a minute of retries or their noise.
    again = workbench(
        "eval",
        "run",
        "reverse-text",
        "-m",
        REPO_ID,
        "-n",
        "2",
        "-r",
        "1",
        cwd=tmp_path,
        hub=closed_port_url(),
        hf_home=hf_home,
    )
    assert again.returncode == 0, again.stderr + again.stdout
    assert "Retrying" not in again.stderr
    runs = list((tmp_path / "environments" / "reverse_text" / "outputs" / "evals").glob("*/*/results.jsonl"))
    assert len(runs) == 2


def test_an_unreachable_hub_is_one_line_that_says_how_to_use_a_folder(tmp_path: Path) -> None:
    result = workbench(
        "eval",
        "run",
        "reverse-text",
        "-m",
        "someone/not-cached",
        "-n",
        "1",
        cwd=tmp_path,
        hub=closed_port_url(),
        hf_home=tmp_path / "hf",
    )
    assert_one_line_error(result, "someone/not-cached", "unreachable", "--local-dir DIR", "-m DIR")
