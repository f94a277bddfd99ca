"""`run_eval`: load the env, build the client, run rollouts through the engine, stream groups to
`results.jsonl`, keep `metadata.json` current, and summarize.

Folder: environments/<env>/outputs/evals/<env>--<model>/<run_id>/ (DESIGN §9). Interrupted
runs are marked `stopped` and keep every finished group; `resume` finishes them.

No finished group stays in memory: each is written, counted into the running summary
(`engine.summary.RunningSummary`, the same numbers `summarize` gives) and dropped, so memory
does not grow with the number of rollouts. `EvalResult.groups` reads them back from disk.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from workbench import __version__
from workbench.engine import run_rollouts
from workbench.engine.retry import preflight
from workbench.engine.sampling import sampling_for
from workbench.engine.summary import RunningSummary
from workbench.engine.timings import record_eval
from workbench.envs.environment import Environment
from workbench.envs.loader import load_environment
from workbench.errors import ServerGone, UserError
from workbench.evaluate.config import EvalConfig
from workbench.events import NullReporter, Reporter
from workbench.inference.client import Client
from workbench.store.files import is_storage_error
from workbench.store.lock import claim_run
from workbench.store.results import RESULTS, ResultsWriter, compact_results, iter_groups, read_groups
from workbench.store.runs import (
    RUN_LOG,
    EvalRun,
    ResolvedModel,
    RunLog,
    RunStatus,
    create_run_dir,
    locate_resume,
    now_iso,
    read_run_metadata,
    read_saved,
    write_run_metadata,
)
from workbench.types import Example, Group, SamplingParams
from workbench.workspace import eval_runs_dir, new_run_id

METADATA_INTERVAL_S = 1.0  # how often progress is written to metadata.json for watchers (the TUI)


@dataclass
class EvalResult:
    run_dir: Path
    status: str  # finished | stopped | failed
    summary: dict[str, Any]
    rollouts_per_example: int | None = None
    _groups: list[Group] | None = field(default=None, repr=False)

    @property
    def groups(self) -> list[Group]:
        """Every saved group of the run, by example id, read from results.jsonl when first asked
        (the run itself keeps none in memory). Loads the whole run: see `group_means`."""
        if self._groups is None:
            self._groups = sorted(
                read_groups(self.run_dir, self.rollouts_per_example), key=lambda g: g.example_id
            )
        return self._groups

    def group_means(self) -> dict[int, float]:
        """`{example_id: group mean reward}`, streamed from results.jsonl (a group at a time)."""
        return {g.example_id: g.mean for g in iter_groups(self.run_dir, self.rollouts_per_example)}


def find_resume_dir(resume: str, config: EvalConfig | None) -> Path:
    """'latest' (needs env and model), a run folder path or a run id."""
    return locate_resume(
        resume, "eval", eval_runs_dir(config.env_id, config.model) if config is not None else None
    )


def run_eval(
    config: EvalConfig,
    reporter: Reporter | None = None,
    *,
    resume: str | None = None,
    client: Client | None = None,
) -> EvalResult:
    """Blocking entry point (the CLI's). Raises KeyboardInterrupt after saving on Ctrl-C."""
    return asyncio.run(run_eval_async(config, reporter or NullReporter(), resume=resume, client=client))


async def run_eval_async(
    config: EvalConfig, reporter: Reporter, *, resume: str | None = None, client: Client | None = None
) -> EvalResult:
    run_dir: Path
    # What -m named, resolved once here and kept: `outputs/runs/latest` means its newest checkpoint
    # now, and a resume evaluates that same checkpoint even after newer ones are trained.
    resolved: ResolvedModel | None = None
    if resume is not None:
        run_dir = find_resume_dir(resume, config)
        saved = read_run_metadata(run_dir, "eval")
        resolved = saved.resolved_model
        config = EvalConfig.model_validate(
            {**saved.config, "max_concurrent": config.max_concurrent, "verbose": config.verbose}
        )
    env = load_environment(config.env_id, **config.env_args)
    sampling = sampling_for(config, env.sampling_args)
    examples = eval_examples(env, config.num_examples, config.example_offset)
    if not examples:
        raise UserError(
            f"environment '{config.env_id}' has no eval examples past the first {config.example_offset}"
        )
    if config.num_examples > len(examples):
        reporter.message(f"the eval split has only {len(examples)} examples; using all of them")
    owns_client = client is None
    if resolved is None and not config.api_base_url:  # a server's model name is not a folder here
        from workbench.inference.resolve import describe_model

        resolved = describe_model(config.model)
    if client is None:
        from workbench.inference.resolve import make_client

        client = make_client(
            resolved.path if resolved is not None else config.model,
            base_url=config.api_base_url,
            api_key_var=config.api_key_var,
            endpoints_file=config.endpoints_path,
            timeout_s=config.request_timeout,
            tries=config.request_tries,
            dtype=config.dtype,
        )
        if config.dtype != "auto":  # in-process: make_client refuses a server any dtype but auto
            from workbench.inference.cpu_features import dtype_hint

            hint = dtype_hint(config.dtype)
            if hint:
                reporter.message(hint)
    try:
        await preflight(client)
        if resume is None:
            run_dir = eval_runs_dir(config.env_id, config.model) / new_run_id()
        return await _run(config, env, client, examples, sampling, run_dir, reporter, resolved)
    finally:
        if owns_client:
            await client.close()


class LazyExamples(Sequence[Example]):
    """`env.get_examples(n, "eval", offset)`, each example made when it is asked for: the engine
    takes them a group at a time, so a large eval never holds every prompt at once (only the
    environment's dataset rows, which are its own)."""

    def __init__(self, env: Environment, n: int, offset: int) -> None:
        self._env, self._rows, self._start = env, env.rows("eval"), offset
        self._end = len(self._rows) if n < 0 else min(len(self._rows), offset + n)

    def __len__(self) -> int:
        return max(0, self._end - self._start)

    @overload
    def __getitem__(self, index: int) -> Example: ...
    @overload
    def __getitem__(self, index: slice) -> list[Example]: ...
    def __getitem__(self, index: int | slice) -> Example | list[Example]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        row = self._start + index
        return self._env.example_from_row(row, self._rows[row])

    def __iter__(self) -> Iterator[Example]:
        return (self._env.example_from_row(i, self._rows[i]) for i in range(self._start, self._end))


def eval_examples(env: Environment, n: int, offset: int) -> Sequence[Example]:
    """The eval examples, made lazily where the environment makes them the usual way (one that
    overrides `get_examples` gets its own list)."""
    if type(env).get_examples is not Environment.get_examples:
        return env.get_examples(n, split="eval", offset=offset)
    examples = LazyExamples(env, n, offset)
    if examples:
        examples[0]  # a dataset the environment cannot read fails here, before the run starts
    return examples


async def _run(
    config: EvalConfig,
    env: Environment,
    client: Client,
    examples: Sequence[Example],
    sampling: SamplingParams,
    run_dir: Path,
    reporter: Reporter,
    resolved: ResolvedModel | None = None,
) -> EvalResult:
    lock = claim_run(run_dir)  # one process writes a run: a second -R of it stops here
    try:
        return await _run_owned(config, env, client, examples, sampling, run_dir, reporter, resolved)
    finally:
        lock.release()


async def _run_owned(
    config: EvalConfig,
    env: Environment,
    client: Client,
    examples: Sequence[Example],
    sampling: SamplingParams,
    run_dir: Path,
    reporter: Reporter,
    resolved: ResolvedModel | None = None,
) -> EvalResult:
    r = config.rollouts_per_example
    # A resume streams what is saved: complete groups are kept (and counted), a partial group
    # (interrupted) or one the server failed is no result and is redone.
    summary_stats = RunningSummary(env.pass_threshold)  # pass@k counts rewards >= the env's threshold
    done_ids: set[int] = set()
    reward_sum = 0.0  # of the result groups: the progress line's running mean

    def saved_results() -> Iterator[Group]:
        nonlocal reward_sum
        for group in iter_groups(run_dir, r):
            if not group.infrastructure_failures:
                done_ids.add(group.example_id)
                summary_stats.add(group, order=group.example_id)
                for x in group.rollouts:
                    reward_sum += x.reward
                yield group

    if (run_dir / RESULTS).exists():
        compact_results(run_dir, saved_results())
    done = len(done_ids)
    todo = (e for e in examples if e.example_id not in done_ids) if done_ids else examples
    create_run_dir(run_dir)
    metadata = EvalRun(
        run_id=run_dir.name,
        env_id=config.env_id,
        model=config.model,
        resolved_model=resolved,
        workbench_version=__version__,
        config=config.model_dump(mode="json"),
        num_examples=len(examples),
        rollouts_per_example=r,
        total_rollouts=len(examples) * r,
        completed_rollouts=done * r,
    )
    if (saved := read_saved(run_dir, "eval")) is not None:
        metadata.created_at = saved.created_at or metadata.created_at
        metadata.elapsed_s = saved.elapsed_s or 0.0
    write_run_metadata(run_dir, metadata)
    log = RunLog(run_dir / RUN_LOG)
    log.write(
        f"{'resume' if done else 'start'} env={config.env_id} model={config.model}"
        f"{f' ({resolved.label or resolved.path})' if resolved is not None and resolved.path != config.model else ''} "
        f"examples={len(examples)} r={r} done_groups={done}"
    )
    writer = ResultsWriter(run_dir)
    started = time.monotonic()
    last_meta = 0.0
    finished, counted = done, done * r  # groups on disk; rollouts in the running mean (resumed: all results)

    def on_group(group: Group) -> None:
        nonlocal last_meta, reward_sum, counted, finished
        writer.write_group(group)
        summary_stats.add(group, order=group.example_id)
        finished += 1
        if not group.infrastructure_failures:  # a server failure is no reward: left out of the mean
            reward_sum, counted = reward_sum + sum(group.rewards), counted + r
        metadata.completed_rollouts = counted  # results only: a group the server failed is redone
        for rollout in group.rollouts:
            if rollout.error is not None:
                log.write(
                    f"example {group.example_id} rollout {rollout.rollout_index}: "
                    f"{rollout.error.where} error {rollout.error.type}: {rollout.error.message[:300]}"
                )
        if not group.infrastructure_failures:  # the progress line counts saved results, nothing else
            reporter.group_done(group, {"reward_mean": reward_sum / counted if counted else 0.0})
        if time.monotonic() - last_meta > METADATA_INTERVAL_S:
            last_meta = time.monotonic()
            metadata.updated_at = now_iso()
            metadata.reward_mean = reward_sum / counted if counted else None
            write_run_metadata(run_dir, metadata)

    def notify(line: str) -> None:  # a retry worth knowing of (a stall, a server restarting)
        log.write(line)
        reporter.message(line)

    reporter.start(f"{config.env_id} · {config.model}", len(examples) * r, done * r)
    status: RunStatus = "failed"
    try:
        await run_rollouts(
            env,
            client,
            todo,
            rollouts_per_example=r,
            sampling=sampling,
            max_concurrent=config.max_concurrent,
            on_group=on_group,
            state_columns=config.state_columns,
            notify=notify,
        )
        status = "finished"
    except asyncio.CancelledError:
        status = "stopped"
        raise
    except ServerGone as exc:
        metadata.error = f"gave up: {exc}"
        kept = summary_stats.rollouts
        raise UserError(
            f"gave up: {exc}; {kept} of {len(examples) * r} rollouts are saved; "
            f"once the server answers again: workbench eval run -R {run_dir}"
        ) from exc
    except OSError as exc:
        if not is_storage_error(exc):
            metadata.error = f"{type(exc).__name__}: {exc}"
            raise
        metadata.error = f"{exc.strerror or exc} while saving results"
        raise UserError(
            f"{exc.strerror or exc} while writing {run_dir}: {summary_stats.rollouts} of "
            f"{len(examples) * r} rollouts are saved; once that is fixed: workbench eval run -R {run_dir}"
        ) from exc
    except Exception as exc:
        metadata.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        writer.close()
        reporter.finish()
        elapsed = time.monotonic() - started + (metadata.elapsed_s or 0.0)
        summary = summary_stats.summary(elapsed)
        if status == "finished" and summary.get("infrastructure_failures"):
            status = "failed"  # a server failure is never a finished result
            first = summary["server_errors"][0]["message"] if summary.get("server_errors") else ""
            metadata.error = (
                f"{summary['infrastructure_failures']} rollout(s) in {summary['incomplete_groups']} group(s) "
                f"failed on the model call: {first[:300]}"
            )
        metadata.status, metadata.updated_at, metadata.summary = status, now_iso(), summary
        metadata.elapsed_s, metadata.reward_mean = elapsed, summary.get("reward_mean")
        try:
            write_run_metadata(run_dir, metadata)
            log.write(
                f"{status}: {finished}/{len(examples)} groups, reward mean {summary.get('reward_mean', 0):.4f}"
            )
        except OSError:  # no room even for that: readers see the process gone and call the run died
            pass
        if status == "finished" and not done:  # a resumed run's seconds cover only part of it
            record_eval(
                run_id=run_dir.name,
                env_id=config.env_id,
                model=config.model,
                client=client,
                max_concurrent=config.max_concurrent,
                summary=summary,
                rollouts_s=elapsed,
            )
    return EvalResult(run_dir, status, summary, r)
