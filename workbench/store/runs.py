"""The run folder's contract: `metadata.json`, `run.log`, and finding a run (DESIGN §9).

Every run kind (eval, train, GEPA) keeps one `metadata.json` that says what the run is and how
far it got, so listing runs never opens results or weights. Its shape is the pydantic model
for the kind (`EvalRun`, `TrainRun`, `GepaRun`), versioned by `schema_version`; services write
it only through `write_run_metadata` and front ends read it only through `read_run_metadata`,
which also reads files written before the schema had a version.

Locating a run (`locate_run`) takes what users type after `--resume`, `-R` or `eval show`:
`latest`, a folder path, or a run id (the folder's name).
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workbench.errors import UserError, redact_credentials, redact_values
from workbench.store.files import iter_jsonl, read_json, write_json_atomic
from workbench.store.timings import RunEstimate
from workbench.workspace import RUN_FOLDERS, workspace_root

SCHEMA_VERSION = 1
METADATA = "metadata.json"
RUN_LOG = "run.log"
METRICS = "metrics.jsonl"  # training: one JSON object per step ({"step": N, "reward/mean": ...})

RunKind = Literal["eval", "train", "gepa"]
# "died" is never written: it is what a reader calls a "running" run whose process is gone;
# "unknown" is what a reader calls a file that does not say.
RunStatus = Literal["running", "finished", "stopped", "failed", "unknown"]
KIND_LABEL: dict[str, str] = {"eval": "eval run", "train": "training run", "gepa": "GEPA run"}


def now_iso() -> str:
    """The timestamp format of metadata.json and run.log (UTC, seconds)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


class ResolvedModel(BaseModel):
    """What `-m` named, as it was resolved when the run started: `-m outputs/runs/latest` (or a
    training run folder) means that run's newest checkpoint *then*, so a label made from the text
    as typed would point at another run once a newer one is trained."""

    model_config = ConfigDict(extra="ignore")

    path: str = Field(description="The model folder loaded (a checkpoint folder: absolute).")
    run: str | None = Field(None, description="The training run whose checkpoint it is (folder name).")
    step: int | None = Field(None, description="That checkpoint's step.")

    @property
    def label(self) -> str | None:
        """'<run> step N' for a training checkpoint, else None."""
        return f"{self.run} step {self.step}" if self.run is not None and self.step is not None else None


class RunMetadata(BaseModel):
    """What every kind of run records. Unknown keys in a file are ignored when read (a newer
    writer), so old readers keep listing new runs."""

    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    schema_version: int = Field(SCHEMA_VERSION, description="Version of this file's shape.")
    kind: RunKind
    status: RunStatus = Field("running", description="running | finished | stopped | failed.")
    run_id: str = Field(description="The run folder's name.")
    env_id: str = Field("", description="The environment ('a+b' for several).")
    model: str = Field("", description="The model as the user named it (-m, `model =`).")
    resolved_model: ResolvedModel | None = Field(
        None, description="The model folder `model` resolved to at launch (a run or checkpoint path)."
    )
    config: dict[str, Any] = Field(default_factory=dict, description="The run's resolved config.")
    created_at: str | None = Field(default_factory=now_iso)
    updated_at: str | None = Field(default_factory=now_iso)
    pid: int | None = Field(
        default_factory=os.getpid, description="The process writing the run (to tell a dead run)."
    )
    workbench_version: str | None = None
    reward_mean: float | None = Field(None, description="The headline reward so far.")
    elapsed_s: float | None = Field(None, description="Working time, summed over resumed sessions.")
    summary: dict[str, Any] | None = Field(None, description="Final statistics (engine.summary.summarize).")
    error: str | None = Field(None, description="Why a failed run failed, in one line.")

    def progress(self) -> tuple[int | None, int | None]:
        """(done, total) in the kind's own unit: rollouts, steps or metric calls."""
        return None, None

    def local_pids(self) -> list[int]:
        """The run's processes on this machine (the writer's pid; a training run adds its ranks)."""
        return [self.pid] if self.pid is not None else []

    @property
    def headline_reward(self) -> float | None:
        return self.reward_mean

    @property
    def env_label(self) -> str:
        return self.env_id or "-"


class EvalRun(RunMetadata):
    kind: Literal["eval"] = "eval"
    num_examples: int = 0
    rollouts_per_example: int = 0
    total_rollouts: int | None = None
    completed_rollouts: int | None = None

    def progress(self) -> tuple[int | None, int | None]:
        return self.completed_rollouts, self.total_rollouts


class RankProcess(BaseModel):
    """One trainer process of a multi-process run (--nproc N, torchrun)."""

    rank: int
    pid: int
    host: str = Field("", description="The machine it runs on (torchrun spreads ranks over nodes).")


class TrainRun(RunMetadata):
    kind: Literal["train"] = "train"
    mode: str = "rl"
    env_ids: list[str] = Field(default_factory=list)
    max_steps: int | None = None
    step: int | None = None
    eval_reward_mean: float | None = Field(None, description="The newest held-out reward.")
    world_size: int = Field(1, description="Trainer processes (--nproc N); resuming takes as many.")
    ranks: list[RankProcess] = Field(
        default_factory=list,
        description="Every trainer rank's process, in rank order (rank 0's pid is also `pid`); empty for one process.",
    )
    estimate: RunEstimate | None = Field(
        None, description="Seconds and tokens estimated at the start, and the actual ones at the end."
    )

    def progress(self) -> tuple[int | None, int | None]:
        return self.step, self.max_steps

    def local_pids(self) -> list[int]:
        """Every rank on this machine: one that is gone fails the whole run (the others stop
        with it), so a "running" run missing any of them has died. A pid of another node says
        nothing here."""
        here = socket.gethostname()
        ranks = [r.pid for r in self.ranks if r.host in ("", here) and r.pid != self.pid]
        return [*super().local_pids(), *ranks]

    @property
    def env_label(self) -> str:
        return self.env_id or "+".join(self.env_ids) or "-"


class GepaRun(RunMetadata):
    kind: Literal["gepa"] = "gepa"
    reflection_model: str | None = None
    gepa_version: str | None = None
    num_train: int = 0
    num_val: int = 0
    seed_prompt: str = ""
    metric_calls_used: int | None = None
    max_calls: int | None = None
    rollouts: int = 0
    rollout_errors: int = 0
    iterations: int = 0
    seed_score: float | None = None
    best_score: float | None = None
    best_candidate: int | None = None
    num_candidates: int = 0
    candidates: list[dict[str, Any]] = Field(
        default_factory=list, description="Every candidate prompt with its score."
    )
    reflections: dict[str, int] = Field(default_factory=lambda: {"proposed": 0, "unusable": 0, "error": 0})
    events: list[dict[str, Any]] = Field(
        default_factory=list, description="Recent reflection problems and errors."
    )
    iteration_errors: int = 0
    stopped_early: str | None = None
    # Which optimizer wrote the run: "gepa" (the library's reflective search) or a DSPy optimizer
    # ("miprov2", "bootstrap"). DSPy candidates carry few-shot demonstrations besides the prompt:
    # as earlier turns (`few_shot`, also in best_few_shot.json) when the env takes a `few_shot`
    # argument ("turns"), else rendered into the system prompt itself ("system").
    optimizer: str = "gepa"
    optimizer_version: str | None = None
    demos_as: Literal["turns", "system"] | None = None
    best_few_shot: list[dict[str, Any]] = Field(
        default_factory=list, description="The best candidate's few-shot turns (demos_as 'turns')."
    )

    def progress(self) -> tuple[int | None, int | None]:
        return self.metric_calls_used, self.max_calls if self.max_calls is not None else self.config.get(
            "max_calls"
        )

    @property
    def headline_reward(self) -> float | None:
        return self.best_score if self.best_score is not None else self.reward_mean


MODELS: dict[str, type[RunMetadata]] = {"eval": EvalRun, "train": TrainRun, "gepa": GepaRun}


def create_run_dir(run_dir: Path) -> Path:
    """Make the run folder (and its parents); UserError with one line when it cannot be (a path
    through a file, no permission, a read-only or virtual filesystem)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the run folder {run_dir}: {exc.strerror or exc}") from None
    if not os.access(run_dir, os.W_OK):
        raise UserError(f"cannot write to the run folder {run_dir}")
    return run_dir


def write_run_metadata(run_dir: Path, metadata: RunMetadata) -> None:
    """Atomically replace `<run_dir>/metadata.json` (readers never see half a file)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    data = metadata.model_dump(mode="json", exclude_none=True)
    write_json_atomic(run_dir / METADATA, redact_values(data))  # a URL's key is never saved


def parse_run_metadata(data: Any, kind: str | None = None) -> RunMetadata:
    """A metadata.json's content as its kind's model; `kind` names it for files that don't.
    ValueError when it is not run metadata."""
    if not isinstance(data, dict):
        raise ValueError("metadata.json is not a JSON object")
    found = str(data.get("kind") or kind or "")
    if found not in MODELS:
        raise ValueError(f"unknown run kind '{found}'")
    data = {
        **data,
        "kind": found,
        "status": data.get("status") if data.get("status") in get_args(RunStatus) else "unknown",
    }
    data.setdefault("run_id", "")
    for key in ("pid", "created_at", "updated_at"):  # the writer's defaults are not the reader's facts
        data.setdefault(key, None)
    while True:  # a field of the wrong shape (a hand edit, another tool) is read as missing
        try:
            return MODELS[found].model_validate(data)
        except ValidationError as exc:
            bad = {str(err["loc"][0]) for err in exc.errors() if err["loc"]} - {"kind", "run_id"}
            if not bad:
                raise ValueError(str(exc).splitlines()[0]) from exc
            data = {key: value for key, value in data.items() if key not in bad}


def read_run_metadata(run_dir: Path, kind: str | None = None) -> RunMetadata:
    """The run's metadata; OSError/ValueError when missing or unreadable."""
    meta = parse_run_metadata(read_json(run_dir / METADATA), kind)
    if not meta.run_id:
        meta.run_id = run_dir.name
    return meta


def read_saved(run_dir: Path, kind: RunKind) -> RunMetadata | None:
    """The metadata a run being resumed left behind, or None for a new run folder."""
    if not (run_dir / METADATA).is_file():
        return None
    try:
        return read_run_metadata(run_dir, kind)
    except (OSError, ValueError):
        return None


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def effective_status(meta: RunMetadata) -> str:
    """The status to show: a `running` run whose process is gone (killed, OOM) has `died` (for
    a training run of several ranks: any of its ranks on this machine)."""
    if meta.status == "running" and meta.pid is not None and not all(map(pid_alive, meta.local_pids())):
        return "died"
    return meta.status


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """A training run's step metrics, in file order (a torn last line is skipped)."""
    return list(iter_jsonl(run_dir / METRICS))


class RunLog:
    """Appends timestamped lines to run.log (what the TUI tails and users grep)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(f"{now_iso()} {redact_credentials(line)}\n")


class QuietLog(RunLog):
    """A run log that writes nothing (ranks other than 0 of a multi-process run)."""

    def write(self, line: str) -> None:
        pass


# ----- locating runs --------------------------------------------------------------------------
START_COMMAND = {
    "eval": "workbench eval run ENV",
    "train": "workbench train CONFIG",
    "gepa": "workbench gepa run ENV",
}


def runs_in(parent: Path) -> list[Path]:
    """Run folders (those with metadata.json) directly inside `parent`, oldest first by name
    (run ids start with a sortable timestamp)."""
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.iterdir() if (p / METADATA).is_file())


def workspace_runs(kind: RunKind, root: Path | None = None) -> list[Path]:
    """Every run folder of `kind` in the workspace, oldest first by run id."""
    base = root or workspace_root()
    return sorted((p.parent for p in base.glob(f"{RUN_FOLDERS[kind]}/{METADATA}")), key=lambda p: p.name)


def locate_run(
    ref: str | Path, kind: RunKind, *, latest_in: Path | None = None, root: Path | None = None
) -> Path:
    """A run folder from what the user typed: 'latest' (the newest run in `latest_in`, or in
    the whole workspace), a path to a run folder, or a run id (a folder name in the workspace).
    UserError with one line when there is none, or when the folder holds another kind of run."""
    label = KIND_LABEL[kind]
    text = str(ref)
    if text == "latest":
        if latest_in is not None:
            runs = runs_in(latest_in)
            if not runs:
                raise UserError(f"no earlier {'run' if kind == 'eval' else label} to resume in {latest_in}")
            return runs[-1]
        runs = workspace_runs(kind, root)
        if not runs:
            raise UserError(
                f"no {kind} runs under {root or workspace_root()}; run `{START_COMMAND[kind]}` first"
            )
        return runs[-1]
    path = Path(text).expanduser()
    if not (path / METADATA).is_file() and os.sep not in text:
        path = next((p for p in workspace_runs(kind, root) if p.name == text), path)
    article = "an" if label[0] in "aeiou" else "a"
    if not (path / METADATA).is_file():
        raise UserError(f"not {article} {label} folder (no {METADATA}): {text}")
    try:
        found = read_run_metadata(path, kind).kind
    except (OSError, ValueError):
        found = kind
    if found != kind:
        raise UserError(f"not {article} {label} folder ({METADATA} kind is not '{kind}'): {text}")
    return path


def locate_resume(resume: str, kind: RunKind, latest_in: Path | None) -> Path:
    """The run `--resume`/`-R` names. 'latest' means the newest run of this env and model, so it
    needs their folder (`latest_in`: None when the command did not say them)."""
    if resume == "latest" and latest_in is None:
        raise UserError("--resume latest needs the env and model (-m) to find the run")
    return locate_run(resume, kind, latest_in=latest_in)
