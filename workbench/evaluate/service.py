"""`run_eval`: load the env, build the client, run rollouts through the engine, stream groups to
`results.jsonl`, keep `metadata.json` current, and summarize.

Folder: environments/<env>/outputs/evals/<env>--<model>/<run_id>/ (DESIGN §9). Interrupted
runs are marked `stopped` and keep every finished group; `resume` finishes them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench import __version__
from workbench.engine import run_rollouts
from workbench.engine.retry import preflight
from workbench.engine.sampling import sampling_for
from workbench.engine.summary import summarize
from workbench.envs.environment import Environment
from workbench.envs.loader import load_environment
from workbench.errors import ServerGone, UserError
from workbench.evaluate.config import EvalConfig
from workbench.events import NullReporter, Reporter
from workbench.inference.client import Client
from workbench.store.results import ResultsWriter, compact_results, read_groups
from workbench.store.runs import (
    RUN_LOG, EvalRun, RunLog, create_run_dir, locate_resume, now_iso, read_run_metadata, read_saved, write_run_metadata,
)
from workbench.types import Example, Group, SamplingParams
from workbench.workspace import eval_runs_dir, new_run_id

METADATA_INTERVAL_S = 1.0  # how often progress is written to metadata.json for watchers (the TUI)


@dataclass
class EvalResult:
    run_dir: Path
    status: str  # finished | stopped | failed
    summary: dict[str, Any]
    groups: list[Group]


def find_resume_dir(resume: str, config: EvalConfig | None) -> Path:
    """'latest' (needs env and model), a run folder path or a run id."""
    return locate_resume(resume, "eval", eval_runs_dir(config.env_id, config.model) if config is not None else None)


def run_eval(config: EvalConfig, reporter: Reporter | None = None, *, resume: str | None = None,
             client: Client | None = None) -> EvalResult:
    """Blocking entry point (the CLI's). Raises KeyboardInterrupt after saving on Ctrl-C."""
    return asyncio.run(run_eval_async(config, reporter or NullReporter(), resume=resume, client=client))


async def run_eval_async(config: EvalConfig, reporter: Reporter, *, resume: str | None = None,
                         client: Client | None = None) -> EvalResult:
    run_dir: Path
    if resume is not None:
        run_dir = find_resume_dir(resume, config)
        saved = read_run_metadata(run_dir, "eval")
        config = EvalConfig.model_validate({**saved.config, "max_concurrent": config.max_concurrent,
                                            "verbose": config.verbose})
    env = load_environment(config.env_id, **config.env_args)
    sampling = sampling_for(config, env.sampling_args)
    examples = env.get_examples(config.num_examples, split="eval", offset=config.example_offset)
    if not examples:
        raise UserError(f"environment '{config.env_id}' has no eval examples past the first {config.example_offset}")
    if config.num_examples > len(examples):
        reporter.message(f"the eval split has only {len(examples)} examples; using all of them")
    owns_client = client is None
    if client is None:
        from workbench.inference.resolve import make_client

        client = make_client(config.model, base_url=config.api_base_url, api_key_var=config.api_key_var,
                             endpoints_file=config.endpoints_path, timeout_s=config.request_timeout,
                             tries=config.request_tries)
    try:
        await preflight(client)
        if resume is None:
            run_dir = eval_runs_dir(config.env_id, config.model) / new_run_id()
        return await _run(config, env, client, examples, sampling, run_dir, reporter)
    finally:
        if owns_client:
            await client.close()


async def _run(config: EvalConfig, env: Environment, client: Client, examples: list[Example],
               sampling: SamplingParams, run_dir: Path, reporter: Reporter) -> EvalResult:
    r = config.rollouts_per_example
    saved_groups = read_groups(run_dir, r) if (run_dir / "results.jsonl").exists() else []
    # A partial group (interrupted) or one the server failed is no result: both are redone.
    done_groups = [g for g in saved_groups if not g.infrastructure_failures]
    if saved_groups or (run_dir / "results.jsonl").exists():
        compact_results(run_dir, done_groups)
    done_ids = {g.example_id for g in done_groups}
    todo = [e for e in examples if e.example_id not in done_ids]
    groups: list[Group] = list(done_groups)
    create_run_dir(run_dir)
    metadata = EvalRun(
        run_id=run_dir.name, env_id=config.env_id, model=config.model, workbench_version=__version__,
        config=config.model_dump(mode="json"), num_examples=len(examples), rollouts_per_example=r,
        total_rollouts=len(examples) * r, completed_rollouts=len(done_groups) * r,
    )
    if (saved := read_saved(run_dir, "eval")) is not None:
        metadata.created_at = saved.created_at or metadata.created_at
        metadata.elapsed_s = saved.elapsed_s or 0.0
    write_run_metadata(run_dir, metadata)
    log = RunLog(run_dir / RUN_LOG)
    log.write(f"{'resume' if done_groups else 'start'} env={config.env_id} model={config.model} "
              f"examples={len(examples)} r={r} done_groups={len(done_groups)}")
    writer = ResultsWriter(run_dir)
    started = time.monotonic()
    last_meta = 0.0
    reward_sum, counted = sum(x.reward for g in groups for x in g.rollouts), len(groups) * r  # resumed: all results

    def on_group(group: Group) -> None:
        nonlocal last_meta, reward_sum, counted
        writer.write_group(group)
        groups.append(group)
        if not group.infrastructure_failures:  # a server failure is no reward: left out of the mean
            reward_sum, counted = reward_sum + sum(group.rewards), counted + r
        metadata.completed_rollouts = len(groups) * r
        for rollout in group.rollouts:
            if rollout.error is not None:
                log.write(f"example {group.example_id} rollout {rollout.rollout_index}: "
                          f"{rollout.error.where} error {rollout.error.type}: {rollout.error.message[:300]}")
        reporter.group_done(group, {"reward_mean": reward_sum / counted if counted else 0.0})
        if time.monotonic() - last_meta > METADATA_INTERVAL_S:
            last_meta = time.monotonic()
            metadata.updated_at = now_iso()
            metadata.reward_mean = reward_sum / counted if counted else None
            write_run_metadata(run_dir, metadata)

    def notify(line: str) -> None:  # a retry worth knowing of (a stall, a server restarting)
        log.write(line)
        reporter.message(line)

    reporter.start(f"{config.env_id} · {config.model}", len(examples) * r, len(done_groups) * r)
    status = "failed"
    try:
        await run_rollouts(env, client, todo, rollouts_per_example=r, sampling=sampling,
                           max_concurrent=config.max_concurrent, on_group=on_group,
                           state_columns=config.state_columns, notify=notify)
        status = "finished"
    except asyncio.CancelledError:
        status = "stopped"
        raise
    except ServerGone as exc:
        metadata.error = f"gave up: {exc}"
        kept = sum(len(g.rollouts) for g in groups if not g.infrastructure_failures)
        raise UserError(f"gave up: {exc}; {kept} of {len(examples) * r} rollouts are saved; "
                        f"once the server answers again: workbench eval run -R {run_dir}") from exc
    except Exception as exc:
        metadata.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        writer.close()
        reporter.finish()
        elapsed = time.monotonic() - started + (metadata.elapsed_s or 0.0)
        ordered = sorted(groups, key=lambda g: g.example_id)
        summary = summarize(ordered, elapsed)
        if status == "finished" and summary.get("infrastructure_failures"):
            status = "failed"  # a server failure is never a finished result
            metadata.error = (f"{summary['infrastructure_failures']} rollout(s) in {summary['incomplete_groups']} group(s) "
                              f"failed on the model server (connection, timeout, 5xx after retries)")
        metadata.status, metadata.updated_at, metadata.summary = status, now_iso(), summary
        metadata.elapsed_s, metadata.reward_mean = elapsed, summary.get("reward_mean")
        write_run_metadata(run_dir, metadata)
        log.write(f"{status}: {len(groups)}/{len(examples)} groups, reward mean {summary.get('reward_mean', 0):.4f}")
    return EvalResult(run_dir, status, summary, ordered)

