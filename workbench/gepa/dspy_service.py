"""`run_dspy`: `workbench gepa run --optimizer miprov2|bootstrap` — DSPy's optimizers on an
environment, through the same engine, budget and run folder as GEPA.

The environment becomes a DSPy program (dspy_program.py) whose every call is one rollout scored
by the env's rubric; settings come from the budget (dspy_optimizers.py); the files are GEPA's
(dspy_recorder.py). MIPROv2's prompt model is the reflection model (-M), reached by DSPy's LM
through a loopback OpenAI-compatible server in front of Workbench's client, so the tiny model,
an endpoint id and -b all work, with Workbench's retries and keys.

Simplifications: one predictor (the system prompt + demos), no minibatched MIPRO evaluation,
no labeled (gold-answer) demos, and no resume — Ctrl-C keeps what was scored, status stopped.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from importlib.metadata import version
from types import FrameType
from typing import Any

from workbench.engine.retry import preflight
from workbench.engine.sampling import sampling_for
from workbench.errors import UserError
from workbench.events import Reporter
from workbench.gepa.config import GepaConfig
from workbench.gepa.dspy_optimizers import DspyPlan, compile_program, plan_calls
from workbench.gepa.dspy_program import make_program_class, metric, to_examples
from workbench.gepa.dspy_recorder import DspyRecorder
from workbench.gepa.dspy_support import import_dspy, quiet_dspy
from workbench.gepa.prompted_env import PromptedEnvs
from workbench.gepa.scoring import Budget, Candidate, CandidateScorer
from workbench.gepa.service import (
    GepaResult,
    datasets,
    launch_model,
    make_clients,
    reflection_sampling_for,
    resolve_run_folder,
    run_metadata,
)
from workbench.store.runs import RunStatus

PROMPT_MODEL_NAME = "workbench-prompt-model"  # what DSPy's LM asks the loopback server for


def run_dspy(config: GepaConfig, reporter: Reporter) -> GepaResult:
    from workbench.gepa.bridge import AsyncBridge

    dspy = import_dspy(config.optimizer)
    run_dir, config, _ = resolve_run_folder(config, None)
    envs = PromptedEnvs(config.env_id, config.env_args)
    trainset, valset = datasets(envs, config, reporter)
    plan = plan_calls(
        config.optimizer,
        config.max_calls,
        len(trainset),
        len(valset),
        config.num_candidates,
        config.num_trials,
    )
    sampling = sampling_for(config, envs.sampling_args)
    policy, reflection = make_clients(config, launch_model(config, None))
    clients = [policy] if reflection is policy or config.optimizer == "bootstrap" else [policy, reflection]
    loopback = None
    with AsyncBridge() as bridge:
        try:
            for client in clients:
                bridge.run(preflight(client))
            prompt_lm = None
            if config.optimizer == "miprov2":
                from workbench.inference.loopback import serve_loopback

                loopback = bridge.run(serve_loopback(reflection, PROMPT_MODEL_NAME))
                prompt_lm = _prompt_lm(dspy, config, loopback.base_url)
            scorer = CandidateScorer(
                envs,
                policy,
                bridge,
                sampling,
                budget=Budget(config.max_calls),
                max_concurrent=config.max_concurrent,
                state_columns=config.state_columns,
            )
            return _optimize(dspy, config, plan, envs, scorer, trainset, valset, prompt_lm, run_dir, reporter)
        finally:
            if loopback is not None:
                bridge.run(loopback.close())
            for client in {id(c): c for c in (policy, reflection)}.values():
                try:
                    bridge.run(client.close())
                except Exception:  # closing must not hide the real outcome
                    pass


def _prompt_lm(dspy: Any, config: GepaConfig, base_url: str) -> Any:
    """DSPy's LM for MIPROv2's proposals: the reflection client behind the loopback server."""
    sampling = reflection_sampling_for(config)
    # num_retries=0: Workbench's client retries behind the loopback; engine lm15 is DSPy's own
    # OpenAI client (litellm, its fallback, would read OPENAI_* variables and phone home).
    return dspy.LM(
        f"openai/{PROMPT_MODEL_NAME}",
        api_base=base_url,
        api_key="workbench",
        cache=False,
        num_retries=0,
        engine="lm15",
        temperature=sampling.temperature,
        max_tokens=sampling.max_tokens,
    )


def _optimize(
    dspy: Any,
    config: GepaConfig,
    plan: DspyPlan,
    envs: PromptedEnvs,
    scorer: CandidateScorer,
    trainset: list[Any],
    valset: list[Any],
    prompt_lm: Any,
    run_dir: Any,
    reporter: Reporter,
) -> GepaResult:
    seed = Candidate(envs.seed_prompt)
    metadata = run_metadata(config, run_dir, None, seed.system_prompt, len(trainset), len(valset))
    metadata.optimizer, metadata.optimizer_version = config.optimizer, version("dspy")
    metadata.demos_as = "turns" if envs.takes_few_shot else "system"
    recorder = DspyRecorder(run_dir, metadata, reporter, scorer.budget, seed, len(valset))
    scorer.on_group, scorer.notify, scorer.on_scored = recorder.group_done, recorder.notice, recorder.scored
    recorder.scorer = scorer
    student = make_program_class(dspy)(scorer, seed.system_prompt, metadata.demos_as)
    train = to_examples(dspy, envs.rows("train"), trainset)
    val = to_examples(dspy, envs.rows("eval"), valset)
    recorder.write("running")
    recorder.log.write(
        f"start {config.optimizer} env={config.env_id} model={config.model} train={len(train)} "
        f"val={len(val)} budget={config.max_calls} plan: {plan.breakdown} (≤{plan.bound} calls); "
        f"demos as {metadata.demos_as}"
    )
    reporter.start(f"{config.optimizer} {config.env_id} · {config.model}", plan.bound, 0)
    status: RunStatus = "failed"
    best = seed
    try:
        with stop_on_interrupt(scorer), quiet_dspy(recorder.dspy_line), dspy.context(lm=prompt_lm):
            program = compile_program(
                dspy,
                plan,
                student,
                train,
                val,
                metric=metric,
                max_demos=config.max_demos,
                demo_threshold=config.demo_threshold,
                threads=config.max_concurrent,
                seed=config.seed,
                prompt_lm=prompt_lm,
                on_proposal=recorder.proposal,
            )
        if scorer.stop.is_set():  # DSPy's evaluation swallows a Ctrl-C and returns what it has
            raise KeyboardInterrupt
        best = program.candidate()
        recorder.choose(best)
        _check_scores_are_whole(scorer)
        status = "finished"
    except KeyboardInterrupt:  # Ctrl-C: what was scored is kept
        status = "stopped"
    except Exception as exc:
        if scorer.stop.is_set():  # DSPy turned the Ctrl-C into its own "cancelled" error
            status = "stopped"
        elif isinstance(exc, UserError):
            metadata.error = str(exc)
            raise
        else:  # DSPy's own failure: recorded, then shown as one line
            metadata.error = f"{type(exc).__name__}: {exc}"
            raise UserError(f"{config.optimizer} failed: {metadata.error}; see {run_dir}/run.log") from exc
    finally:
        reporter.finish()
        if recorder.snapshot is None:
            recorder.refresh()
        recorder.close(status)
    snap = recorder.snapshot
    assert snap is not None  # refreshed above
    return GepaResult(
        run_dir=run_dir,
        status=status,
        seed_prompt=seed.system_prompt,
        seed_score=snap.seed_score,
        best_score=snap.best_score,
        best_prompt=snap.best_prompt,
        metric_calls_used=scorer.scored_calls,
        max_calls=config.max_calls,
        num_candidates=len(snap.candidates),
        iterations=snap.iterations,
        error=metadata.error,
        optimizer=config.optimizer,
        best_few_shot=list(metadata.best_few_shot),
    )


@contextlib.contextmanager
def stop_on_interrupt(scorer: CandidateScorer) -> Iterator[None]:
    """Ctrl-C (or the TUI's stop, a SIGINT) stops the scorer as well as interrupting the main
    thread: DSPy's worker threads would otherwise go on scoring, and its evaluation catches the
    KeyboardInterrupt and carries on with partial scores."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(sig: int, frame: FrameType | None) -> None:
        scorer.request_stop()  # DSPy's threads wait on rollouts: cancelled, so they return at once
        signal.default_int_handler(sig, frame)

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _check_scores_are_whole(scorer: CandidateScorer) -> None:
    """DSPy scores a call that raised as 0: a server failure must not become a result."""
    if scorer.server_gone is not None:
        raise UserError(
            f"gave up: {scorer.server_gone}; the scores so far are saved, the run is not finished"
        )
    if scorer.server_failures:
        raise UserError(
            f"{scorer.server_failures} metric calls failed on the model server and DSPy counted them as "
            "0: the run is not saved as finished; run it again once the server is healthy"
        )
    if scorer.budget.exhausted:  # the plan's bound is an upper bound: this is a bug, not a user error
        raise RuntimeError("the metric-call budget was reached before the optimizer finished")
