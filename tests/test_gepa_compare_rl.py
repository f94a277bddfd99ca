"""`workbench gepa compare ENV --optimizers ...,rl`: RL on the prompt optimizers' rollout budget,
on the embedded tiny model, offline. The rl arm is a real training run (checkpoints, metrics,
one rollouts file per step) whose rollouts fit -B; its final checkpoint and the starting model
are evaluated on the same held-out rows, seed and rollouts as the prompt arm's seed and best;
the table's rates follow from its numbers. A model that cannot be trained here is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.comparisons import only_comparison
from tests.test_cli_errors import assert_one_line_error
from tests.test_gepa import finish, workbench
from workbench.store.checkpoints import list_checkpoints
from workbench.store.comparisons import training_rollouts
from workbench.store.runs import read_metrics

BUDGET = 32


@pytest.mark.slow
def test_compare_spends_one_budget_on_bootstrap_and_rl_and_checks_both_on_the_same_rows(
    tiny_workspace: Path,
):
    proc = workbench(
        "gepa",
        "compare",
        "reverse-text",
        "-m",
        "tiny",
        "--optimizers",
        "bootstrap,rl",
        "-B",
        str(BUDGET),
        "-n",
        "4",
        "-N",
        "4",
        "-H",
        "4",
        "-r",
        "2",
        "-t",
        "40",  # every arm's sampling: the prompt runs', the rl arm's training and all four checks
        "--set",
        "demo_threshold=0.3",
        "--set",
        "rl.batch_size=16",  # 4 prompts × 4 rollouts: two steps in the budget
        "--set",
        "rl.wandb.mode=disabled",
        cwd=tiny_workspace,
    )
    out, err = finish(proc)
    assert proc.returncode == 0, err
    comparison = only_comparison(tiny_workspace)
    folder, data, rows = comparison.folder, comparison.data, comparison.rows
    assert list(rows) == ["bootstrap", "rl"] and (data["heldout"], data["rollouts"]) == (4, 2)

    # the rl arm is an ordinary training run: two steps, a checkpoint, every rollout on disk
    rl = rows["rl"]
    run = Path(rl["run_dir"])
    assert run.parent == tiny_workspace / "outputs" / "runs" and rl["status"] == "finished"
    assert [m["step"] for m in read_metrics(run)] == [1, 2]
    assert list_checkpoints(run)[-1] == Path(rl["best"]) and Path(rl["best"]).name == "step_000002"
    assert rl["rollouts_spent"] == training_rollouts(run) == 2 * 16 <= BUDGET == rl["max_calls"]
    assert (folder / "rl.toml").is_file()

    # both arms: the budget, the same held-out rows, seed and rollouts
    assert rows["bootstrap"]["rollouts_spent"] == rows["bootstrap"]["metric_calls"] <= BUDGET
    assert {(r["heldout_start"], r["heldout_n"]) for r in rows.values()} == {(4, 4)}
    evals = [
        json.loads(p.read_text())["config"]
        for p in (tiny_workspace / "environments" / "reverse_text" / "outputs" / "evals").glob(
            "*/*/metadata.json"
        )
    ]
    assert len(evals) == 4  # seed and best of each arm
    assert {
        (c["example_offset"], c["num_examples"], c["rollouts_per_example"], c["seed"], c["max_tokens"])
        for c in evals
    } == {(4, 4, 2, 0, 40)}
    assert "max_tokens = 40" in (folder / "rl.toml").read_text()
    assert sorted(c["model"] for c in evals) == sorted(["tiny", "tiny", "tiny", rl["best"]])

    # the rates are the held-out gain over the rollouts and the minutes
    for row in rows.values():
        assert row["heldout_best"] - row["heldout_seed"] == pytest.approx(row["diff"])
        assert row["gain_per_100_rollouts"] == pytest.approx(
            row["diff"] / row["rollouts_spent"] * 100, abs=1e-6
        )
        assert row["gain_per_minute"] == pytest.approx(row["diff"] / (row["wall_s"] / 60), abs=1e-6)
    table = (folder / "comparison.md").read_text()
    for column in ("rollouts spent", "gain per 100 rollouts", "gain per minute"):
        assert column in table and column in out
    assert f"| rl | - → - | {rl['heldout_seed']:.3f} → {rl['heldout_best']:.3f} |" in out
    assert f"| {rl['rollouts_spent']} of {BUDGET} | {rl['gain_per_100_rollouts']:+.4f} |" in out


def test_rl_arm_refuses_what_it_cannot_train_or_fit(tmp_path: Path):
    compare = ["gepa", "compare", "reverse-text", "-m", "served", "--optimizers", "bootstrap,rl"]
    assert_one_line_error(
        workbench(*compare, "-b", "http://127.0.0.1:9/v1", cwd=tmp_path),
        "--optimizers rl: 'served' is served at http://127.0.0.1:9/v1 (-b)",
        "give a local model",
    )
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "endpoints.toml").write_text(
        '[[endpoint]]\nendpoint_id = "served"\nmodel = "m"\nurl = "http://127.0.0.1:9/v1"\n'
    )
    assert_one_line_error(
        workbench(*compare, cwd=tmp_path), "'served' is an endpoint in", "give a local model"
    )
    tiny = ["gepa", "compare", "reverse-text", "-m", "tiny", "--optimizers", "rl"]
    assert_one_line_error(
        workbench(*tiny, "-B", "3", cwd=tmp_path), "-B 3 is less than one RL step (4 rollouts)"
    )
    assert_one_line_error(
        workbench(*tiny, "-B", "64", "--set", "rl.max_steps=5", cwd=tmp_path),
        "rl.max_steps 5 × batch_size 32 is more than the budget -B 64",
    )
    assert_one_line_error(
        workbench(*tiny[:-2], "--optimizers", "bootstrap", "--set", "rl.max_steps=5", cwd=tmp_path),
        "add rl to --optimizers",
    )
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "environments").exists()  # nothing ran
