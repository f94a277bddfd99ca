"""`workbench setup`: scaffolds a workspace, is idempotent, never overwrites edits without --force."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import cli


def setup(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return cli.run(
        [sys.executable, "-m", "workbench", "setup", *args, "--skip-model"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_setup_scaffolds_then_is_idempotent_and_keeps_edits(tmp_path: Path):
    first = setup("ws", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    ws = tmp_path / "ws"
    for path in (
        "configs/eval/reverse-text.toml",
        "configs/rl/reverse-text.toml",
        "configs/endpoints.toml",
        "configs/gepa",
        "environments/reverse_text/reverse_text.py",
        "environments/alphabet_sort/README.md",
        "environments/wordle/wordle.py",
        "outputs/models",
    ):
        assert (ws / path).exists(), path
    assert "workbench eval run reverse-text -m tiny" in first.stdout  # tells the user what to run next
    config = ws / "configs" / "eval" / "reverse-text.toml"
    config.write_text(config.read_text() + "\n# my edit\n")
    second = setup("ws", cwd=tmp_path)
    assert second.returncode == 0 and "created" not in second.stdout
    assert "kept your edited" in second.stdout and "# my edit" in config.read_text()
    forced = setup("ws", "--force", cwd=tmp_path)
    assert forced.returncode == 0 and "overwrote" in forced.stdout and "# my edit" not in config.read_text()
    listed = cli.run(
        [sys.executable, "-m", "workbench", "env", "list"], cwd=ws, capture_output=True, text=True
    )
    assert "reverse-text" in listed.stdout or "reverse_text" in listed.stdout
