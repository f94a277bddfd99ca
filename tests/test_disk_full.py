"""A full disk (issue 33, item 4): an eval whose output folder fills up mid-run ends with one
line naming the cause and the resume command, exit code 1 — no traceback, no "Workbench bug",
no stray temporary file — and every row that was saved is kept.

The output folder is a 64 KB tmpfs mounted in a private mount namespace (`unshare -rm`, no root
needed); what the run left is listed inside that namespace before it goes away."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import EchoBackend, make_app, serve_in_thread

SCRIPT = """
set -u
mount -t tmpfs -o size=64k tmpfs "$WS" || exit 99
cd "$WS"
"$PY" -m workbench eval run reverse-text -m echo -b "$URL" -n 100 -r 4 >out.txt 2>err.txt
echo "rc=$?" >&2
cat err.txt >&2
run=$(dirname "$(find "$WS" -name results.jsonl | head -1)")
echo "files=$(ls -A "$run" | tr '\\n' ' ')" >&2
echo "lines=$(wc -l < "$run/results.jsonl")" >&2
echo "metadata=$(tr -d '\\n' < "$run/metadata.json")" >&2
"""


def _can_mount_privately() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_privately(), reason="needs unprivileged mount namespaces (unshare -rm)")
def test_a_full_disk_mid_eval_is_one_line_and_keeps_what_was_saved(tmp_path: Path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_WORKSPACE"}
    with serve_in_thread(make_app(EchoBackend())) as url:
        env |= {"WS": str(workspace), "PY": sys.executable, "URL": f"{url}/v1"}
        proc = subprocess.run(
            ["unshare", "-rm", "sh", "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
        )
    report = dict(
        line.split("=", 1)
        for line in proc.stderr.splitlines()
        if line.split("=", 1)[0] in {"rc", "files", "lines", "metadata"}
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert report.get("rc") == "1", proc.stderr
    assert len(errors) == 1 and "No space left on device" in errors[0] and " -R " in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and "Workbench bug" not in proc.stderr
    assert ".tmp" not in report["files"], report["files"]  # no stray temporary file
    assert int(report["lines"]) > 0  # what fit is kept (a torn last line is skipped on resume)
    if report["metadata"]:  # when even metadata.json could not be rewritten, readers call the run died
        meta = json.loads(report["metadata"])
        assert meta["status"] in {"failed", "running"}
