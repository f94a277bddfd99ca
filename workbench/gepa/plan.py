"""The resolved plan of a GEPA run, as data: what `workbench gepa run ... --dry-run` prints.

Nothing is loaded or contacted: the env is looked up (and its `load_environment` signature
checked), models are only named. Problems a real run would stop at become warnings, so a config
written for another workspace (an env not installed here) still shows its whole plan.
"""

from __future__ import annotations

from pathlib import Path

from workbench.config.plan import Plan, PlanSection
from workbench.errors import UserError
from workbench.gepa.config import DEFAULT_REFLECTION_MAX_TOKENS, GepaConfig
from workbench.workspace import gepa_runs_dir


def env_problem(env_id: str) -> str | None:
    """Why this env cannot be prompt-optimized here, or None."""
    from workbench.envs.loader import unknown_environment
    from workbench.gepa.prompted_env import require_system_prompt_arg

    if (unknown := unknown_environment(env_id)) is not None:
        return unknown
    try:
        require_system_prompt_arg(env_id)
    except UserError as exc:
        return str(exc)
    except Exception as exc:  # the env module fails to import
        return f"environment '{env_id}' failed to import: {type(exc).__name__}: {exc}"
    return None


def model_source(model: str, base_url: str | None, endpoints_path: str | None) -> str:
    """Where a model would be answered from, in words (no connection, no loading)."""
    from workbench.inference.endpoints import load_endpoints
    from workbench.workspace import endpoints_path as default_endpoints

    if base_url:
        return f"{model} at {base_url}"
    try:
        registry = load_endpoints(default_endpoints() if endpoints_path is None else Path(endpoints_path))
    except Exception:  # a broken registry is reported by the real run
        registry = {}
    if model in registry:
        return f"{model} (endpoint registry)"
    if model == "tiny" or Path(model).expanduser().exists():
        return f"{model} (in-process)"
    return f"{model} (in-process from the Hugging Face hub; give a base URL for a served model)"


def build_plan(config: GepaConfig) -> Plan:
    """Sections of the resolved config, and the problems a real run would stop at."""
    c = config
    warnings: list[str] = []
    notes: list[str] = []
    if (problem := env_problem(c.env_id)) is not None:
        warnings.append(problem)

    run = PlanSection("Run")
    args = ", ".join(f"{k}={v!r}" for k, v in c.env_args.items() if k != "system_prompt") or "no args"
    run.add("environment", f"{c.env_id} · {args}")
    seed = c.env_args.get("system_prompt")
    run.add("seed prompt", repr(seed) if isinstance(seed, str) else "the environment's default system prompt")
    run.add("policy model", model_source(c.model, c.api_base_url, c.endpoints_path))
    reflection_url = c.reflection_base_url or (c.api_base_url if c.reflection_model_name == c.model else None)
    run.add("reflection model", model_source(c.reflection_model_name, reflection_url, c.endpoints_path))
    run.add("run folder", c.output_dir or f"{gepa_runs_dir(c.env_id, c.model)}/<run_id>")
    run.add("seed", c.seed)

    run.add("optimizer", c.optimizer if c.optimizer == "gepa" else f"{c.optimizer} (DSPy)")
    budget = gepa_budget(c, warnings) if c.optimizer == "gepa" else dspy_budget(c, warnings)
    val = "all" if c.num_val == -1 else c.num_val

    data = PlanSection("Data")
    data.add(
        "train",
        f"{'all' if c.num_train == -1 else c.num_train} examples of the train split (reflection minibatches)",
    )
    data.add("validation", f"{val} examples of the eval split (Pareto frontier, best prompt)")
    data.add(
        "perfect score",
        "none (no minibatch is skipped)"
        if c.perfect_score is None
        else f"{c.perfect_score:g} (minibatches already perfect are skipped)",
    )
    data.add("candidate selection", c.candidate_selection)
    data.add("state columns", ", ".join(c.state_columns) or "none")

    sampling = PlanSection("Sampling")
    policy = {"max_tokens": c.max_tokens, "temperature": c.temperature, **c.sampling_args}
    sampling.add(
        "policy",
        " · ".join(f"{k} {v}" for k, v in policy.items() if v is not None) or "env and workbench defaults",
    )
    sampling.add("policy concurrency", f"{c.max_concurrent} rollouts in flight")
    reflection = {"max_tokens": DEFAULT_REFLECTION_MAX_TOKENS, **c.reflection_sampling_args}
    sampling.add("reflection", " · ".join(f"{k} {v}" for k, v in reflection.items()))

    out = PlanSection("Outputs")
    if c.optimizer == "gepa":
        out.add("files", "best_prompt.txt, pareto_frontier.jsonl, metadata.json, run.log")
        out.add(
            "resumable state", "gepa_state/ (the gepa library's run_dir): resume with --resume RUN_FOLDER"
        )
    else:
        out.add(
            "files",
            "best_prompt.txt, best_few_shot.json (demos as turns), pareto_frontier.jsonl, metadata.json, run.log",
        )
        out.add("resumable state", "none: a DSPy run cannot be resumed (Ctrl-C keeps what was scored)")
    return Plan([run, budget, data, sampling, out], notes, warnings)


def gepa_budget(c: GepaConfig, warnings: list[str]) -> PlanSection:
    budget = PlanSection("Budget (metric calls: one rollout of one example)")
    budget.add("max_calls", c.max_calls)
    val = "all" if c.num_val == -1 else c.num_val
    budget.add("seed evaluation", f"{val} calls (every validation example)")
    per_try = 2 * c.minibatch_size
    budget.add(
        "per iteration",
        f"{per_try} calls (parent and proposal on a minibatch of {c.minibatch_size}) "
        f"+ {val} when the proposal is accepted",
    )
    if c.num_val != -1:
        if c.max_calls < c.num_val:
            warnings.append(
                f"max_calls ({c.max_calls}) is below num_val ({c.num_val}): the seed prompt's "
                f"evaluation alone needs {c.num_val} calls"
            )
        else:
            budget.add("iterations", f"at most {(c.max_calls - c.num_val) // per_try}")
    return budget


def dspy_budget(c: GepaConfig, warnings: list[str]) -> PlanSection:
    """The settings DSPy's optimizer gets from the budget (dspy_optimizers.plan_calls)."""
    from importlib.util import find_spec

    from workbench.gepa.dspy_optimizers import plan_calls
    from workbench.gepa.dspy_support import INSTALL

    budget = PlanSection("Budget (metric calls: one rollout of one example)")
    budget.add("max_calls", c.max_calls)
    if find_spec("dspy") is None:
        warnings.append(f"--optimizer {c.optimizer} needs DSPy, which is not installed: {INSTALL}")
    budget.add(
        "demonstrations",
        f"up to {c.max_demos} per candidate, from rollouts with reward "
        f"{'above 0' if c.demo_threshold is None else f'>= {c.demo_threshold:g}'}",
    )
    if c.num_train == -1 or c.num_val == -1:
        budget.add("search", "sized from the split sizes when the run starts")
        return budget
    try:
        plan = plan_calls(c.optimizer, c.max_calls, c.num_train, c.num_val, c.num_candidates, c.num_trials)
    except UserError as exc:
        warnings.append(str(exc))
        return budget
    if plan.optimizer == "bootstrap":
        budget.add("search", f"the seed prompt, 1 bootstrapped demo set and {plan.candidates} shuffled ones")
    else:
        budget.add(
            "search",
            f"{plan.candidates} instructions (the seed + {plan.candidates - 1} proposed by the reflection "
            f"model) × {plan.candidates} demo sets, {plan.trials} trials",
        )
    budget.add("at most", f"{plan.bound} calls: {plan.breakdown}")
    return budget
