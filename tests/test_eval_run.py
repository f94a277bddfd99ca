"""`workbench eval run` end to end over HTTP: saved layout, Ctrl-C keeps finished groups,
`--resume` finishes without redoing them, `eval show` exports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd

from tests import cli
from tests.servers import EchoBackend, Gate, first_prompts, make_app, serve_in_thread, wait_until


def cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "WORKBENCH_WORKSPACE"}


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return cli.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def start_cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    """A real process, for a test that signals it."""
    return subprocess.Popen(
        [sys.executable, "-m", "workbench", *args],
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def results_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines() if line.strip()]


def test_eval_saves_layout_and_show_exports(tmp_path: Path):
    with serve_in_thread(make_app(EchoBackend())) as url:
        done = run_cli(
            "eval",
            "run",
            "reverse-text",
            "-m",
            "echo",
            "-b",
            f"{url}/v1",
            "-n",
            "4",
            "-r",
            "3",
            "-C",
            "turn",
            "-s",
            "-v",
            cwd=tmp_path,
        )
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, err
    runs = list(
        (tmp_path / "environments" / "reverse_text" / "outputs" / "evals" / "reverse-text--echo").iterdir()
    )
    assert len(runs) == 1
    run_dir = runs[0]
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["status"] == "finished" and metadata["summary"]["num_rollouts"] == 12
    assert "zero_variance_frac" in metadata["summary"] and "verdict" in metadata["summary"]
    assert (run_dir / "run.log").read_text().count("finished") == 1
    lines = results_lines(run_dir)
    assert len(lines) == 12 and lines[0]["schema_version"] == 1 and lines[0]["state"] == {"turn": 1}
    for label in (
        "reward",
        "lcs_reward",
        "within-group std",
        "zero-variance groups",
        "difficulty",
        "errors",
        "time",
    ):
        assert label in out, label
    assert "#0.0" in err  # -v prints rollouts
    csv = run_cli("eval", "show", str(run_dir), "--format", "csv", cwd=tmp_path).stdout
    assert csv.splitlines()[0].startswith("example_id,rollout_index") and len(csv.splitlines()) == 13
    run_cli("eval", "show", "--format", "parquet", cwd=tmp_path)
    frame = pd.read_parquet(run_dir / "results.parquet")
    assert len(frame) == 12 and "reward.lcs_reward" in frame.columns
    table = run_cli("eval", "show", cwd=tmp_path).stdout
    assert "finished" in table and "reward" in table


def test_ctrl_c_keeps_finished_groups_and_resume_finishes(tmp_path: Path):
    # The server answers every rollout of the first 3 examples to arrive and holds the rest, so the
    # run is provably mid-flight (3 groups saved, the next ones waiting) when Ctrl-C lands.
    gate = Gate(first_prompts(3))
    with serve_in_thread(make_app(EchoBackend(), middlewares=(gate.middleware,))) as url, gate:
        args = [
            "eval",
            "run",
            "reverse-text",
            "-m",
            "echo",
            "-b",
            f"{url}/v1",
            "-n",
            "20",
            "-r",
            "2",
            "-c",
            "2",
        ]
        proc = start_cli(*args, cwd=tmp_path)
        evals = tmp_path / "environments" / "reverse_text" / "outputs" / "evals" / "reverse-text--echo"
        gate.wait_held(proc=proc)  # the run is stuck at the 4th group: it cannot finish before the signal
        wait_until(
            lambda: (done := list(evals.glob("*/results.jsonl"))) and len(results_lines(done[0].parent)) >= 6,
            what="3 groups saved",
        )
        assert proc.poll() is None, "the run should still be going"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 130, err
        run_dir = next(evals.iterdir())
        assert "Traceback" not in err and f"-R {run_dir.relative_to(tmp_path)}" in err  # the folder itself
        metadata = json.loads((run_dir / "metadata.json").read_text())
        assert metadata["status"] == "stopped"
        kept = {(r["example_id"], r["rollout_index"]): r["timing"] for r in results_lines(run_dir)}
        kept_groups = {e for e, _ in kept}
        assert 3 <= len(kept_groups) < 20
        assert len(kept_groups) == 3 and len(kept) == 6  # exactly the groups the server answered

        gate.open(drop_held=True)  # the stopped run's waiting requests are dropped; the resume runs freely
        resume = run_cli(*args, "-R", "latest", cwd=tmp_path)
        assert resume.returncode == 0, resume.stderr
    lines = results_lines(run_dir)
    assert len(lines) == 40  # every group exactly once
    assert sorted({(r["example_id"], r["rollout_index"]) for r in lines}) == [
        (e, i) for e in range(20) for i in range(2)
    ]
    for record in lines:  # groups finished before Ctrl-C were not redone
        key = (record["example_id"], record["rollout_index"])
        if record["example_id"] in kept_groups and key in kept:
            assert record["timing"] == kept[key]
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["status"] == "finished" and metadata["summary"]["num_groups"] == 20
