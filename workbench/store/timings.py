"""How long this workspace's runs took on this machine: `outputs/timings.jsonl`.

One JSON line per run, appended when a training run or an eval ends: what ran (model, envs,
sizes) and where its seconds went (start-up, the median step, held-out evaluation, rollouts per
second). `workbench train --dry-run` and the TUI launcher estimate the next run from it
(`workbench/train/estimate.py`), so the estimate gets better as the workspace is used.

Records name the machine (`this_machine`): a workspace copied to another computer, or shared
over a network folder, keeps its history but estimates use only this machine's lines. A line
that does not parse (a hand edit, a newer writer's shape) is skipped, never an error: this file
only ever makes an estimate better. Appends are one `write` of one line to a file opened for
appending, so two runs ending at once do not interleave their lines.

Torch-free and small on purpose: the TUI reads it while you pick a config.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from workbench.store.files import iter_jsonl
from workbench.workspace import workspace_root

TIMINGS = "timings.jsonl"
TIMINGS_VERSION = 1


def timings_path(root: Path | None = None) -> Path:
    return (root or workspace_root()) / "outputs" / TIMINGS


def this_machine() -> str:
    """Which computer measured a timing: host name, CPU count and CUDA GPUs (the same host with a
    GPU added is another machine for timing purposes). Read without torch."""
    gpus = Path("/proc/driver/nvidia/gpus")
    count = len(list(gpus.iterdir())) if gpus.is_dir() else 0
    return f"{socket.gethostname()} · {os.cpu_count() or 0} CPUs · {count} GPUs"


def machine_load() -> float | None:
    """How many other tasks want the CPUs now, besides this process: the 1-minute load average, or
    fewer where fewer tasks are runnable this instant (Linux: /proc/loadavg's fourth field counts
    them, less this process's own running threads, e.g. its OpenMP workers). The average alone
    lags: a minute after a burst of other work ends it still says busy while a run would have the
    machine to itself. None without a load average (Windows)."""
    try:
        average = os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
    try:
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return average
    return max(0.0, min(average, running - _own_running_threads()))


def _own_running_threads() -> int:
    """This process's threads that are running or runnable (at least the caller's)."""
    count = 0
    for task in Path("/proc/self/task").glob("*/stat"):
        try:
            state = task.read_text().rsplit(")", 1)[1].split()[0]  # the field after "(name)"
        except (OSError, IndexError):
            continue
        count += state == "R"
    return max(count, 1)


class _Timing(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: int = TIMINGS_VERSION
    run_id: str
    recorded_at: str
    machine: str = Field(description="this_machine() where it ran.")
    model: str = Field(description="The model as the user named it.")
    model_key: str = Field(description="What decides its speed: the base model's folder, or a hub id.")
    model_label: str = Field(description="A short name for messages ('tiny').")
    params: int | None = Field(None, description="The base model's parameters, when known.")
    load: float | None = Field(None, description="Other tasks wanting the CPUs while it ran (machine_load).")


class TrainTiming(_Timing):
    """A training run's session (a resumed run adds a line for each session)."""

    kind: Literal["train"] = "train"
    env_ids: list[str]
    mode: str = Field(description="rl | sft | distill.")
    lora: bool
    world_size: int = 1
    inference: str = Field(description="colocated | server.")
    steps: int = Field(description="Steps this session ran.")
    batch_size: int = Field(description="Rollouts (RL) or demonstrations (SFT) per step.")
    completion_tokens: float = Field(description="Mean completion tokens per rollout over the steps.")
    sample_tokens: float = Field(description="Mean tokens (prompt + completion) per trained sample.")
    step_s: float = Field(description="Median seconds per step, after the first.")
    first_step_s: float
    wait_s: float = Field(
        description="Median seconds a step waited for its rollouts (colocated: generated them)."
    )
    startup_s: float = Field(description="From the run's start to its first step, less the baseline eval.")
    held_out_evals: int = 0
    held_out_rollouts: int = Field(0, description="Rollouts per held-out evaluation.")
    held_out_s: float | None = Field(None, description="Mean seconds per held-out evaluation.")
    between_steps_s: float = Field(0.0, description="Checkpoints and bookkeeping, per step.")
    total_s: float = Field(description="The whole session, start to end.")


class EvalTiming(_Timing):
    """A finished eval run (`workbench eval run`)."""

    kind: Literal["eval"] = "eval"
    env_id: str
    local: bool = Field(description="Generated in this process (False: by a server, whose speed is its own).")
    rollouts: int
    max_concurrent: int
    prompt_tokens: float = Field(description="Mean prompt tokens per rollout.")
    completion_tokens: float = Field(description="Mean completion tokens per rollout.")
    rollouts_s: float = Field(description="Seconds the rollouts took (model loading not included).")

    @property
    def seconds_per_token(self) -> float:
        """Seconds per generated token, at this eval's concurrency."""
        return self.rollouts_s / max(self.rollouts * self.completion_tokens, 1.0)


Timing = Annotated[TrainTiming | EvalTiming, Field(discriminator="kind")]
_TIMING: TypeAdapter[TrainTiming | EvalTiming] = TypeAdapter(Timing)


class RunEstimate(BaseModel):
    """A run's duration as estimated at its start, and as it turned out (`TrainRun.estimate`)."""

    model_config = ConfigDict(extra="ignore")

    seconds: float = Field(description="Estimated seconds from the run's start to its end.")
    tokens: int = Field(description="Estimated completion tokens its training steps sample.")
    basis: str = Field(description="What the estimate came from, in words.")
    rough: bool = Field(False, description="No measurement of this model on this machine: a prior.")
    steps: int = Field(description="Steps the estimate covers (a resumed run: the remaining ones).")
    actual_s: float | None = Field(None, description="How long it took (set when the run ends).")
    actual_tokens: int | None = None

    @property
    def error(self) -> float | None:
        """(estimate - actual) / actual, once the run has ended."""
        return (self.seconds - self.actual_s) / self.actual_s if self.actual_s else None


def append_timing(record: TrainTiming | EvalTiming, root: Path | None = None) -> None:
    """Add one line to the workspace's timings (outputs/ is made when missing)."""
    path = timings_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = orjson.dumps(record.model_dump(mode="json")) + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write on an O_APPEND file: lines of concurrent writers never mix
    finally:
        os.close(fd)


def read_timings(root: Path | None = None) -> list[TrainTiming | EvalTiming]:
    """Every readable line, oldest first."""
    return list(_parsed(timings_path(root)))


def _parsed(path: Path) -> Iterator[TrainTiming | EvalTiming]:
    for data in iter_jsonl(path):
        try:
            yield _TIMING.validate_python(data)
        except ValidationError:
            continue
