"""Several trainer ranks with inference replicas (issue 34.2): what the run records about its
ranks, the same update from 2 ranks as from 1, resume after kill -9 of a rank, a replica dying
mid-step. Real processes (gloo ranks, `workbench serve` replicas), real HTTP on 127.0.0.1, the
tiny model."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from workbench.store.runs import (
    RankProcess,
    TrainRun,
    effective_status,
    read_run_metadata,
    write_run_metadata,
)


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_running_training_run_missing_any_of_its_ranks_on_this_machine_has_died(tmp_path: Path) -> None:
    here, me, gone = socket.gethostname(), os.getpid(), _dead_pid()
    ranks = [RankProcess(rank=0, pid=me, host=here), RankProcess(rank=1, pid=gone, host=here)]
    run = TrainRun(run_id="r", status="running", pid=me, world_size=2, ranks=ranks)
    write_run_metadata(tmp_path, run)
    saved = read_run_metadata(tmp_path, "train")
    assert isinstance(saved, TrainRun) and saved.world_size == 2 and saved.ranks == ranks
    assert effective_status(saved) == "died"  # rank 1 is gone: the run cannot go on without it
    elsewhere = [ranks[0], RankProcess(rank=1, pid=gone, host=f"not-{here}")]
    assert effective_status(run.model_copy(update={"ranks": elsewhere})) == "running"  # not ours to check
    assert effective_status(run.model_copy(update={"ranks": ranks[:1]})) == "running"
    assert effective_status(run.model_copy(update={"status": "finished"})) == "finished"
