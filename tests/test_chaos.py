"""Chaos (issue 12): an eval against two real `workbench serve` replicas, one of which is killed
(SIGKILL, requests in flight) and restarted on its port mid-run, finishes with every group
complete, none duplicated, and no server failure left in its results.

"Mid-run" is arranged, not hoped for: the eval runs `held-reverse` (tests/held_env.py), whose
first rollout waits for a file the test writes only after the replica is back, so the run
cannot end before the kill whatever the machine's load."""

from __future__ import annotations

import json
from pathlib import Path

from tests.held_env import ENV_ID, write_held_env
from tests.servers import start_process, wait_until
from tests.test_eval_run import results_lines, start_cli
from tests.weights import workbench_servers

EXAMPLES, ROLLOUTS = 16, 2


def test_an_eval_survives_a_replica_killed_and_restarted_mid_run(tmp_path: Path, tiny_model: Path):
    write_held_env(tmp_path)
    hold_after, held, release = tmp_path / "hold_after", tmp_path / "held", tmp_path / "release"
    hold_after.touch()  # the first rollout to start holds the run open
    env_args = json.dumps({"hold_after": str(hold_after), "held": str(held), "release": str(release)})
    with workbench_servers(tiny_model, 2) as (doomed, steady):
        registry = tmp_path / "endpoints.toml"
        registry.write_text(
            "".join(
                f'[[endpoint]]\nendpoint_id = "replicas"\nmodel = "tiny"\nurl = "{s.base_url}/v1"\n'
                for s in (doomed, steady)
            )
        )
        proc = start_cli(
            "eval",
            "run",
            ENV_ID,
            "-m",
            "replicas",
            "-e",
            str(registry),
            "-n",
            str(EXAMPLES),
            "-r",
            str(ROLLOUTS),
            "-c",
            "4",
            "-a",
            env_args,
            cwd=tmp_path,
        )
        try:
            wait_until(held.exists, what="the run to hold its first rollout")
            runs = tmp_path / "environments" / "held_reverse" / "outputs" / "evals" / f"{ENV_ID}--replicas"
            wait_until(
                lambda: any(
                    len(results_lines(d)) >= 2 * ROLLOUTS
                    for d in runs.glob("*")
                    if (d / "results.jsonl").is_file()
                ),
                what="two groups saved",
            )
            doomed.kill()  # SIGKILL: whatever it was answering is lost mid-request
            reborn = start_process(
                [
                    "-m",
                    "workbench",
                    "serve",
                    str(tiny_model),
                    "--served-model-name",
                    "tiny",
                    "--port",
                    str(doomed.port),
                ]
            )
            try:
                release.touch()  # the replica is back: let the run finish
                out, err = proc.communicate(timeout=600)
            finally:
                reborn.stop()
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, out + err
    (run_dir,) = runs.iterdir()
    lines = results_lines(run_dir)
    keys = [(r["example_id"], r["rollout_index"]) for r in lines]
    assert sorted(keys) == [(e, i) for e in range(EXAMPLES) for i in range(ROLLOUTS)]  # complete, none twice
    assert not [r["error"] for r in lines if r["error"]]  # no server failure (nor any error) left
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "finished" and "infrastructure_failures" not in meta["summary"]
    # The kill was felt (at most 3 rollouts were in flight, so round-robin tried the dead replica)
    # and the retries went to the live one.
    log = (run_dir / "run.log").read_text().splitlines()
    assert any(f"127.0.0.1:{doomed.port}" in line and "retrying 2/5" in line for line in log), log
