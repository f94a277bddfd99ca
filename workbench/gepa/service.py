"""`run_gepa`: optimize an environment's system prompt with the `gepa` library.

Loads the env (which must take `system_prompt`), picks train examples (train split) and
validation examples (eval split), builds the policy and reflection clients, and runs
`gepa.optimize` with `WorkbenchAdapter` (rollouts through the engine) and `Reflector`
(reflection through any Client). The library keeps its resumable state in `<run>/gepa_state/`
(its `run_dir`); `RunRecorder` keeps best_prompt.txt, pareto_frontier.jsonl and metadata.json
current. Ctrl-C marks the run `stopped`; `resume` continues it from its last iteration.

Folder: environments/<env>/outputs/gepa/<env>--<model>/<run_id>/ (DESIGN §9), or `output_dir`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import __version__
from workbench.engine.retry import preflight
from workbench.engine.sampling import sampling_for
from workbench.errors import ServerGone, UserError
from workbench.events import NullReporter, Reporter
from workbench.gepa.config import DEFAULT_REFLECTION_MAX_TOKENS, GepaConfig
from workbench.gepa.prompted_env import SYSTEM_PROMPT_COMPONENT, PromptedEnvs
from workbench.inference.client import Client
from workbench.store.lock import claim_run, releasing_claims
from workbench.store.runs import (
    METADATA,
    GepaRun,
    ResolvedModel,
    RunStatus,
    create_run_dir,
    locate_resume,
    read_run_metadata,
)
from workbench.types import SamplingParams
from workbench.workspace import gepa_runs_dir, new_run_id

STATE_DIR = "gepa_state"  # the gepa library's run_dir inside the run folder
STOP_FILE = "gepa.stop"  # gepa stops at the next iteration when this file appears in its run_dir
# What a resumed run may change: the budget (to extend a run) and where the servers are now.
RESUME_OVERRIDABLE = (
    "max_calls",
    "max_concurrent",
    "api_base_url",
    "api_key_var",
    "endpoints_path",
    "reflection_base_url",
    "reflection_api_key_var",
)


@dataclass
class GepaResult:
    run_dir: Path
    status: str  # finished | stopped | failed
    seed_prompt: str
    seed_score: float | None
    best_score: float | None
    best_prompt: str
    metric_calls_used: int
    max_calls: int
    num_candidates: int
    iterations: int
    error: str | None = None
    stopped_early: str | None = None  # why the run ended before its budget, if it did
    optimizer: str = "gepa"
    best_few_shot: list[dict[str, Any]] = field(
        default_factory=list
    )  # DSPy runs: the best candidate's few-shot turns


def run_gepa(
    config: GepaConfig, reporter: Reporter | None = None, *, resume: str | None = None
) -> GepaResult:
    """Blocking entry point (the CLI's). Ctrl-C during the optimization returns the result so far
    with status 'stopped' (resume it with `resume=run_dir`)."""
    from workbench.gepa.bridge import AsyncBridge

    reporter = reporter or NullReporter()
    if config.optimizer != "gepa":
        if resume is not None:
            raise UserError(
                f"--optimizer {config.optimizer} runs cannot be resumed (DSPy keeps no state to continue "
                f"from); start a new run"
            )
        from workbench.gepa.dspy_service import run_dspy

        return run_dspy(config, reporter)
    run_dir, config, saved = resolve_run_folder(config, resume)
    envs = PromptedEnvs(config.env_id, config.env_args)
    trainset, valset = datasets(envs, config, reporter)
    if len(valset) > config.max_calls:
        raise UserError(
            f"--max-calls ({config.max_calls}) is below the validation set size ({len(valset)}): "
            f"scoring the seed prompt alone takes {len(valset)} calls"
        )
    sampling = sampling_for(config, envs.sampling_args)
    reflection_sampling = reflection_sampling_for(config)
    policy, reflection = make_clients(config, launch_model(config, saved))
    clients = [policy] if reflection is policy else [policy, reflection]
    with AsyncBridge() as bridge:
        try:
            for client in clients:
                bridge.run(preflight(client))
            return _optimize(
                config,
                envs,
                trainset,
                valset,
                policy,
                reflection,
                sampling,
                reflection_sampling,
                bridge,
                run_dir,
                saved,
                reporter,
            )
        finally:
            for client in clients:
                try:
                    bridge.run(client.close())
                except Exception:  # closing must not hide the real outcome
                    pass


@releasing_claims()  # the run folder claimed below is freed when the optimization ends
def _optimize(
    config: GepaConfig,
    envs: PromptedEnvs,
    trainset: list[Any],
    valset: list[Any],
    policy: Client,
    reflection: Client,
    sampling: SamplingParams,
    reflection_sampling: SamplingParams,
    bridge: Any,
    run_dir: Path,
    saved: GepaRun | None,
    reporter: Reporter,
) -> GepaResult:
    import gepa

    from workbench.gepa.adapter import WorkbenchAdapter, scores_by_index
    from workbench.gepa.recorder import MAX_ERROR_STREAK, RunRecorder
    from workbench.gepa.reflection import ReflectionModel, Reflector
    from workbench.gepa.scoring import Budget, CandidateScorer, ServerFailures

    claim_run(run_dir)  # one process writes a run: a second -R of it stops here
    state_dir = create_run_dir(run_dir / STATE_DIR)
    (state_dir / STOP_FILE).unlink(missing_ok=True)  # a stop request that ended the previous session
    state = load_gepa_state(state_dir)
    seed_prompt = (
        state.program_candidates[0][SYSTEM_PROMPT_COMPONENT] if state is not None else envs.seed_prompt
    )
    if not seed_prompt.strip():
        reporter.message(
            "the environment has no default system prompt: GEPA starts from an empty one "
            '(give a seed with -a \'{"system_prompt": "..."}\')'
        )
    budget = Budget(config.max_calls, used=state.total_num_evals if state is not None else 0)
    metadata = run_metadata(config, run_dir, saved, seed_prompt, len(trainset), len(valset))
    recorder = RunRecorder(run_dir, metadata, reporter, budget)
    scorer = CandidateScorer(
        envs,
        policy,
        bridge,
        sampling,
        budget=budget,
        max_concurrent=config.max_concurrent,
        state_columns=config.state_columns,
        on_group=recorder.group_done,
        notify=recorder.notice,
    )
    if saved is not None:
        scorer.rollouts, scorer.rollout_errors = saved.rollouts, saved.rollout_errors
    adapter = WorkbenchAdapter(scorer, perfect_score=config.perfect_score)
    recorder.scorer = scorer
    if state is not None:
        adapter.replay_seed_scores(seed_prompt, scores_by_index(state.prog_candidate_val_subscores[0]))
        recorder.take_snapshot(state)
    reflector = Reflector(ReflectionModel(reflection, bridge, reflection_sampling), recorder.reflection_event)
    recorder.write("running")
    recorder.log.write(
        f"{'resume' if state is not None else 'start'} env={config.env_id} model={config.model} "
        f"reflection_model={config.reflection_model_name} train={len(trainset)} val={len(valset)} "
        f"budget={budget.used}/{config.max_calls}"
    )
    reporter.start(f"gepa {config.env_id} · {config.model}", config.max_calls, budget.used)
    status: RunStatus = "failed"
    try:
        gepa.optimize(
            seed_candidate={SYSTEM_PROMPT_COMPONENT: seed_prompt},
            trainset=trainset,
            valset=valset,
            adapter=adapter,
            reflection_strategy=reflector,
            candidate_selection_strategy=config.candidate_selection,
            reflection_minibatch_size=config.minibatch_size,
            perfect_score=1.0 if config.perfect_score is None else config.perfect_score,
            skip_perfect_score=config.perfect_score is not None,
            max_metric_calls=config.max_calls,
            stop_callbacks=[
                lambda state: recorder.should_stop(state, config.minibatch_size, config.perfect_score)
            ],
            logger=recorder.log,
            run_dir=str(state_dir),
            callbacks=[recorder],  # type: ignore[list-item]  # gepa calls only the on_* methods an object has
            track_best_outputs=False,
            display_progress_bar=False,
            raise_on_exception=False,  # an iteration that fails is recorded and the next one starts
            seed=config.seed,
        )
        if adapter.server_gone is not None:
            raise adapter.server_gone
        if recorder.error_streak >= MAX_ERROR_STREAK:
            metadata.error = f"{MAX_ERROR_STREAK} iterations in a row failed; last: {recorder.last_error}"
        else:
            status = "stopped" if (state_dir / STOP_FILE).exists() else "finished"
    except KeyboardInterrupt:  # Ctrl-C: saved up to the last iteration; the caller gets the result so far
        status = "stopped"
    except (
        ServerGone,
        ServerFailures,
    ) as exc:  # saved up to the last iteration (failures: the seed's scoring)
        metadata.error = f"gave up: {exc}"
        raise UserError(
            f"gave up: {exc}; every finished iteration is saved; once the server answers again: "
            f"workbench gepa run -R {run_dir}"
        ) from exc
    except Exception as exc:
        metadata.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        reporter.finish()
        recorder.close(status)
    snap = recorder.snapshot
    return GepaResult(
        run_dir=run_dir,
        status=status,
        seed_prompt=seed_prompt,
        seed_score=snap.seed_score if snap else None,
        best_score=snap.best_score if snap else None,
        best_prompt=snap.best_prompt if snap else seed_prompt,
        metric_calls_used=budget.used,
        max_calls=config.max_calls,
        num_candidates=len(snap.candidates) if snap else 0,
        iterations=snap.iterations if snap else 0,
        error=metadata.error,
        stopped_early=metadata.stopped_early,
    )


# ----- setup helpers ----------------------------------------------------------------------------
def resolve_run_folder(config: GepaConfig, resume: str | None) -> tuple[Path, GepaConfig, GepaRun | None]:
    """(run folder, effective config, saved metadata). Resuming keeps the saved config except
    RESUME_OVERRIDABLE fields set explicitly in `config`."""
    if resume is None:
        run_dir = (
            Path(config.output_dir)
            if config.output_dir
            else gepa_runs_dir(config.env_id, config.model) / new_run_id()
        )
        if (run_dir / METADATA).exists():
            raise UserError(
                f"{run_dir} already holds a run: continue it with --resume {run_dir}, or choose another -o"
            )
        return run_dir, config, None
    run_dir = find_gepa_run(resume, config)
    try:
        saved = read_run_metadata(run_dir, "gepa")
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {run_dir / METADATA}: {exc}") from exc
    if not isinstance(saved, GepaRun):
        raise UserError(f"not a GEPA run folder: {run_dir}")
    overrides = {k: getattr(config, k) for k in RESUME_OVERRIDABLE if k in config.model_fields_set}
    merged = GepaConfig.model_validate({**saved.config, **overrides, "output_dir": str(run_dir)})
    return run_dir, merged, saved


def find_gepa_run(resume: str, config: GepaConfig | None) -> Path:
    """'latest' (newest run of this env and model), a GEPA run folder or a run id."""
    return locate_resume(
        resume, "gepa", gepa_runs_dir(config.env_id, config.model) if config is not None else None
    )


def datasets(envs: PromptedEnvs, config: GepaConfig, reporter: Reporter) -> tuple[list[Any], list[Any]]:
    """GEPA's trainset (train split rows) and valset (eval split rows), as DataItems."""
    from workbench.gepa.adapter import DataItem

    train_rows, eval_rows = envs.rows("train"), envs.rows("eval")
    picked = {}
    for split, rows, wanted, flag in (
        ("train", train_rows, config.num_train, "-n/--num-train"),
        ("eval", eval_rows, config.num_val, "-N/--num-val"),
    ):
        n = len(rows) if wanted == -1 else min(wanted, len(rows))
        if wanted > len(rows):
            reporter.message(
                f"the {split} split has only {len(rows)} examples ({flag} {wanted}); using all of them"
            )
        if n == 0:
            raise UserError(f"environment '{config.env_id}' has no {split} examples")
        picked[split] = [DataItem(split, i) for i in range(n)]
    if train_rows[:5] == eval_rows[:5]:
        reporter.message("this environment has one split: training and validation examples overlap")
    return picked["train"], picked["eval"]


def reflection_sampling_for(config: GepaConfig) -> SamplingParams:
    try:
        return SamplingParams(max_tokens=DEFAULT_REFLECTION_MAX_TOKENS).merged(
            {
                **config.reflection_sampling_args,
                "seed": config.reflection_sampling_args.get("seed", config.seed),
            }
        )
    except TypeError as exc:
        raise UserError(f"bad reflection sampling arguments: {exc}") from exc


def reflection_endpoint(config: GepaConfig) -> tuple[str | None, str | None]:
    """(base URL, key variable) for the reflection model: its own URL, else its registry entry,
    else the policy's server (hosted APIs serve both models from one URL)."""
    if config.reflection_base_url:
        return config.reflection_base_url, config.reflection_api_key_var
    from workbench.inference.endpoints import load_endpoints
    from workbench.workspace import endpoints_path

    registry = load_endpoints(Path(config.endpoints_path) if config.endpoints_path else endpoints_path())
    if config.reflection_model_name in registry and config.reflection_model_name != config.model:
        return None, None
    return config.api_base_url, config.reflection_api_key_var or config.api_key_var


def launch_model(config: GepaConfig, saved: GepaRun | None) -> ResolvedModel | None:
    """The model folder `config.model` means, resolved once when the run starts (a resume keeps
    it): `outputs/runs/latest` or a run folder is that run's newest checkpoint *then*. None for a
    named model, a hub or endpoint id, or a model on a server (`-b`)."""
    if saved is not None and saved.resolved_model is not None:
        return saved.resolved_model
    if config.api_base_url:
        return None
    from workbench.inference.resolve import describe_model

    return describe_model(config.model)


def make_clients(config: GepaConfig, resolved: ResolvedModel | None = None) -> tuple[Client, Client]:
    """(policy, reflection); one client when both are the same model on the same server.
    `resolved`: the folder the policy model was resolved to at launch (`launch_model`)."""
    from workbench.inference.resolve import make_client

    policy = make_client(
        resolved.path if resolved is not None else config.model,
        base_url=config.api_base_url,
        api_key_var=config.api_key_var,
        endpoints_file=config.endpoints_path,
        timeout_s=config.request_timeout,
        tries=config.request_tries,
    )
    url, key_var = reflection_endpoint(config)
    if (
        config.reflection_model_name == config.model
        and url == config.api_base_url
        and key_var == config.api_key_var
    ):
        return policy, policy
    reflection = make_client(
        config.reflection_model_name,
        base_url=url,
        api_key_var=key_var,
        endpoints_file=config.endpoints_path,
        timeout_s=config.request_timeout,
        tries=config.request_tries,
    )
    return policy, reflection


def load_gepa_state(state_dir: Path) -> Any:
    """The library's saved state (to resume), or None for a fresh run."""
    if not (state_dir / "gepa_state.bin").is_file():
        return None
    from gepa.core.state import GEPAState

    try:
        return GEPAState.load(str(state_dir))
    except Exception as exc:
        raise UserError(
            f"cannot read the saved GEPA state in {state_dir}: {type(exc).__name__}: {exc}"
        ) from exc


def run_metadata(
    config: GepaConfig, run_dir: Path, saved: GepaRun | None, seed_prompt: str, num_train: int, num_val: int
) -> GepaRun:
    from importlib.metadata import version

    metadata = GepaRun(
        run_id=run_dir.name,
        env_id=config.env_id,
        model=config.model,
        resolved_model=launch_model(config, saved),
        reflection_model=config.reflection_model_name,
        workbench_version=__version__,
        gepa_version=version("gepa"),
        config=config.model_dump(mode="json"),
        num_train=num_train,
        num_val=num_val,
        seed_prompt=seed_prompt,
    )
    if saved is not None:  # what a resumed run carries on counting
        metadata.created_at, metadata.elapsed_s = saved.created_at or metadata.created_at, saved.elapsed_s
        metadata.reflections, metadata.events = saved.reflections, saved.events
        metadata.iteration_errors = saved.iteration_errors
    return metadata
