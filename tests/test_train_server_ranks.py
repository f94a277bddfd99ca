"""Server mode with several trainer ranks (workbench.train.shared_source): rank 0 launches the
replicas, rolls out and publishes; every rank trains on its share of rank 0's batch. Real
processes (two gloo ranks, a `workbench serve` replica), real HTTP on 127.0.0.1, the tiny model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.test_train_launch_replicas import alive, replica_record, train_command, workbench_env
from workbench.train.batches import StepBatch
from workbench.train.distributed import DistInfo
from workbench.train.shared_source import rank_share
from workbench.types import Group


def test_each_rank_keeps_its_slice_and_rank_0_keeps_the_counts() -> None:
    groups = [Group(example_id=i, rollouts=[]) for i in range(5)]
    batch = StepBatch(groups=groups[:4], dropped=1, all_groups=groups, policy_version=3, server_failed=2)
    main, other = (
        rank_share(batch, DistInfo(rank=0, world_size=2)),
        rank_share(batch, DistInfo(rank=1, world_size=2)),
    )
    assert [g.example_id for g in main.groups] == [0, 2] and [g.example_id for g in other.groups] == [1, 3]
    # all_groups is split the same way: gathering the ranks' shares rebuilds the batch for the metrics
    assert sorted(g.example_id for g in main.all_groups + other.all_groups) == [0, 1, 2, 3, 4]
    assert (main.dropped, main.server_failed) == (1, 2) and (other.dropped, other.server_failed) == (
        0,
        0,
    )  # summed once
    assert main.policy_version == other.policy_version == 3
    assert batch.groups == groups[:4]  # the whole batch is left as it was


# Covered by default by test_train_ranks_replicas (2 ranks + launched replicas: the same update as
# 1 rank, kill -9 of a rank leaves nothing behind); this one runs with -m ''.
@pytest.mark.extended
def test_two_trainer_ranks_train_on_launched_replicas_and_leave_nothing_behind(tiny_workspace: Path) -> None:
    result = subprocess.run(  # trainer ranks: real processes
        [
            *train_command(
                "--set",
                "max_steps=2",
                "--set",
                "output_dir='runs/ranks'",
                "--set",
                "inference.data_parallel_size=1",
                "--set",
                "eval.interval=2",
                "--set",
                "eval.num_examples=4",
                "--set",
                "eval.rollouts_per_example=1",
            ),
            "--nproc",
            "2",
        ],
        cwd=tiny_workspace,
        env=workbench_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = tiny_workspace / "runs" / "ranks"
    record = replica_record(run_dir)
    assert len(record["replicas"]) == 1  # rank 0 alone launched
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "time/step" in m]
    assert len(steps) == 2
    assert all(
        m["rollout/trained_samples"] == 8 and m["rollout/errors"] == 0 for m in steps
    )  # both ranks' shares
    assert all(m["time/weight_sync"] > 0 for m in steps)  # rank 0 published every step's adapter
    assert all(m["policy/lag"] <= 1 for m in steps)  # max_async_level = 1
    assert "eval/reward_mean" in steps[-1]  # evaluated on rank 0, known to every rank
    assert (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())
    assert [p for p in (r["pid"] for r in record["replicas"]) if alive(p)] == []
    metadata = json.loads((run_dir / "metadata.json").read_text())  # every rank, for the TUI and --resume
    assert metadata["world_size"] == 2 and [r["rank"] for r in metadata["ranks"]] == [0, 1]
    assert metadata["ranks"][0]["pid"] == metadata["pid"] != metadata["ranks"][1]["pid"]
    assert "FutureWarning" not in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_trainer_gpu_ids_become_the_ranks_visible_devices(tmp_path: Path) -> None:
    from workbench.train.launch import child_env
    from workbench.train.placement import trainer_visible_devices
    from workbench.train.schema import TrainConfig

    placed = TrainConfig(env=[{"id": "reverse-text"}], trainer_gpu_ids=[2, 3], inference={"gpu_ids": [0, 1]})
    assert (
        trainer_visible_devices(placed) == "2,3"
    )  # rank r (LOCAL_RANK r) runs on the r-th: never an inference GPU
    assert child_env(1, 2, 29500, tmp_path, trainer_visible_devices(placed))["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert trainer_visible_devices(TrainConfig(env=[{"id": "reverse-text"}])) is None


def test_the_plan_says_how_many_ranks_where_they_run_and_how_a_step_is_split() -> None:
    from workbench.train.plan import build_plan
    from workbench.train.schema import TrainConfig

    def placement(config: TrainConfig, gpu_count: int, nproc: int) -> dict[str, str]:
        built = build_plan(config, [], [], gpu_count=gpu_count, nproc=nproc)
        return dict(next(s for s in built.sections if s.title.startswith("Placement")).rows)

    server = TrainConfig(
        env=[{"id": "reverse-text"}],
        batch_size=128,
        rollouts_per_example=8,
        micro_batch_size=32,
        inference={"mode": "server", "launch": True, "data_parallel_size": 2},
    )
    rows = placement(server, 0, 2)
    assert (
        rows["trainer"].startswith("2 trainer ranks (--nproc 2)") and "on the CPU (gloo)" in rows["trainer"]
    )
    assert "rank 0 rolls out for every rank and publishes the weights to 2 replicas" in rows["trainer"]
    assert rows["per rank"].startswith("each step's 16 groups split by group") and (
        "8 groups (64 rollouts) per rank, in micro-batches of 32" in rows["per rank"]
    )
    uneven = placement(server.model_copy(update={"batch_size": 40}), 0, 3)["per rank"]
    assert "1 group (8 rollouts) per rank (ranks 0-1: 2)" in uneven  # 5 groups over 3 ranks
    on_gpus = placement(server.model_copy(update={"trainer_gpu_ids": [2, 3]}), 4, 2)["trainer"]
    assert "rank r on the r-th GPU of trainer_gpu_ids [2, 3] (CUDA_VISIBLE_DEVICES=2,3, NCCL)" in on_gpus
    single = placement(server, 0, 1)
    assert "per rank" not in single and single["trainer"].startswith(
        "rank 0 = this `workbench train` process"
    )


def test_ranks_that_cannot_each_have_a_gpu_are_refused_before_the_dry_run_says_fine() -> None:
    from workbench.train.placement import rank_gpu_blockers
    from workbench.train.schema import TrainConfig

    config = TrainConfig(env=[{"id": "reverse-text"}])
    assert rank_gpu_blockers(config, 2, 1) == [
        "--nproc 2: this machine has 1 GPU(s) and each process needs its own"
    ]
    placed = config.model_copy(update={"trainer_gpu_ids": [3]})
    assert rank_gpu_blockers(placed, 2, 4) == [
        "--nproc 2: trainer_gpu_ids lists 1 GPU(s) and each process needs its own"
    ]
    assert (
        rank_gpu_blockers(config, 2, 0) == [] and rank_gpu_blockers(config, 2, None) == []
    )  # CPU: processes
    assert rank_gpu_blockers(config, 1, 1) == [] and rank_gpu_blockers(placed, 1, 4) == []
