"""Status is true everywhere (issue 33, item 5): a run whose process is gone is `died` in
`eval show` as in the TUI (one rule: store.runs.effective_status), a results file that lost lines
is shown as damaged rather than as the finished run it was, and a run folder whose metadata.json
cannot be read is listed as unreadable instead of vanishing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.servers import EchoBackend, make_app, serve_in_thread
from tests.test_bad_input import workbench
from workbench.tui.data.runs import RunCatalog


def _finished_eval(tmp_path: Path) -> Path:
    with serve_in_thread(make_app(EchoBackend())) as url:
        proc = workbench(
            "eval", "run", "reverse-text", "-m", "echo", "-b", f"{url}/v1", "-n", "4", "-r", "2", cwd=tmp_path
        )
    assert proc.returncode == 0, proc.stderr
    return next((tmp_path / "environments").rglob("metadata.json")).parent


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_eval_show_and_the_tui_agree_on_died_damaged_and_unreadable(tmp_path: Path):
    run = _finished_eval(tmp_path)
    lines = (run / "results.jsonl").read_text().splitlines(keepends=True)
    (run / "results.jsonl").write_text("".join(lines[:4]))  # 4 of 8 rollouts left
    shown = workbench("eval", "show", str(run), cwd=tmp_path)
    assert shown.returncode == 0 and "damaged: results.jsonl holds 4 of 8 rollouts" in shown.stdout, (
        shown.stdout
    )

    meta = json.loads((run / "metadata.json").read_text())
    meta |= {"status": "running", "pid": _dead_pid()}  # killed mid-run: nobody rewrote its status
    (run / "metadata.json").write_text(json.dumps(meta))
    (run / "results.jsonl").write_text("".join(lines))
    shown = workbench("eval", "show", str(run), cwd=tmp_path)
    assert shown.returncode == 0 and "· died" in shown.stdout, shown.stdout
    [row] = RunCatalog(tmp_path).scan()
    assert row.status == "died"

    (run / "metadata.json").write_bytes(b"\x00garbage")
    [row] = RunCatalog(tmp_path).scan()
    assert row.status == "unreadable" and row.path == run
