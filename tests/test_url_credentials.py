"""A key pasted into a server URL (`-b http://user:sk-...@host/v1`) is never printed or saved
(issue 33, item 7): not in the terminal, run.log, metadata.json, results.jsonl or a crash line;
a resume asks for the URL again instead of using a redacted one."""

from __future__ import annotations

from pathlib import Path

from tests.servers import EchoBackend, make_app, serve_in_thread
from tests.test_eval_run import start_cli
from tests.test_openai_client import free_port
from workbench.errors import redact_credentials

SECRET = "sk-do-not-leak-4242"


def _everything_written(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def test_redaction_keeps_the_user_and_hides_the_password():
    assert redact_credentials(f"http://me:{SECRET}@h:8000/v1") == "http://me:***@h:8000/v1"
    assert redact_credentials(f"see https://{SECRET}@h/v1 now") == "see https://***@h/v1 now"
    assert redact_credentials("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"


def test_a_key_in_the_url_never_reaches_the_terminal_or_the_run_folder(tmp_path: Path):
    with serve_in_thread(make_app(EchoBackend())) as url:
        host = url.removeprefix("http://")
        args = ["eval", "run", "reverse-text", "-m", "echo", "-b", f"http://me:{SECRET}@{host}/v1", "-n", "2"]
        proc = start_cli(*args, cwd=tmp_path)
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    assert SECRET not in out + err
    written = _everything_written(tmp_path / "environments")
    assert "me:***@" in written and SECRET not in written
    run_dir = next((tmp_path / "environments").rglob("metadata.json")).parent
    resume = start_cli("eval", "run", "-R", str(run_dir), cwd=tmp_path)
    _, err = resume.communicate(timeout=300)
    assert resume.returncode == 1 and "never saved" in err and "-b" in err, err


def test_a_failing_server_url_is_shown_without_its_key(tmp_path: Path):
    port = free_port()  # nothing listens on it
    args = [
        "eval",
        "run",
        "reverse-text",
        "-m",
        "echo",
        "-b",
        f"http://me:{SECRET}@127.0.0.1:{port}/v1",
        "-n",
        "1",
    ]
    proc = start_cli(*args, cwd=tmp_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "error: " in err, out + err
    assert SECRET not in out + err and SECRET not in _everything_written(tmp_path)
