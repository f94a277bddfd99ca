"""Reading a finished GEPA/DSPy run and checking its best candidate on held-out examples: what
`gepa apply`, `gepa verify` and `gepa compare` share. A front end's module: it combines the
GEPA run folder with the eval service (services never call each other)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import UserError
from workbench.evaluate.prompts import PromptCheck
from workbench.events import Reporter
from workbench.store.runs import GepaRun

if TYPE_CHECKING:
    from workbench.evaluate.config import EvalConfig
    from workbench.gepa.config import GepaConfig


@dataclass(frozen=True)
class Verification:
    env_id: str
    start: int  # first held-out eval row
    rollouts: int
    seed: int
    check: PromptCheck


def load_run(run: str) -> tuple[Path, GepaRun, str]:
    """(run folder, its metadata, its best prompt) of a finished or stopped GEPA run."""
    from workbench.gepa.service import find_gepa_run
    from workbench.store.runs import read_run_metadata

    run_dir = find_gepa_run(run, None)
    try:
        meta = read_run_metadata(run_dir, "gepa")
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {run_dir}/metadata.json: {exc}") from exc
    best_file = run_dir / "best_prompt.txt"
    if not isinstance(meta, GepaRun) or not best_file.is_file():
        raise UserError(f"{run_dir} has no best_prompt.txt yet (the run scored no candidate)")
    return run_dir, meta, best_file.read_text(encoding="utf-8").rstrip("\n")


def best_few_shot(run_dir: Path, meta: GepaRun) -> list[dict[str, Any]] | None:
    """The best candidate's few-shot turns when the run shows demonstrations as turns (DSPy runs
    with demos_as 'turns'), else None: GEPA runs and 'system' runs carry everything in the prompt.
    best_few_shot.json is read first (it sits beside best_prompt.txt), else the metadata's copy."""
    if meta.demos_as != "turns":
        return None
    path = run_dir / "best_few_shot.json"
    if not path.is_file():
        return list(meta.best_few_shot)
    try:
        turns = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from exc
    if not isinstance(turns, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in turns
    ):
        raise UserError(f'{path} is not a list of chat messages ({{"role": ..., "content": ...}})')
    return turns


def candidate_args(prompt: str, few_shot: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The env arguments that make a candidate: its system prompt, and its few-shot turns when
    the run has them (None: a run without turns, whose env may not take `few_shot` at all)."""
    return {"system_prompt": prompt} if few_shot is None else {"system_prompt": prompt, "few_shot": few_shot}


def heldout_eval_config(
    gepa: GepaConfig,
    env_args: dict[str, Any],
    start: int,
    num_examples: int,
    rollouts: int,
    *,
    model: str | None = None,
    api_base_url: str | None = None,
    api_key_var: str | None = None,
    max_concurrent: int | None = None,
) -> EvalConfig:
    """The eval of `num_examples` held-out rows from `start` with the GEPA run's policy settings
    (sampling, seed, concurrency): what every side of a verification is scored with. Another
    `model` is evaluated in-process or on its own `api_base_url`, not on the run's server."""
    from workbench.evaluate.config import EvalConfig

    return EvalConfig(
        env_id=gepa.env_id,
        env_args=env_args,
        model=model or gepa.model,
        num_examples=num_examples,
        rollouts_per_example=rollouts,
        example_offset=start,
        max_concurrent=max_concurrent or gepa.max_concurrent,
        max_tokens=gepa.max_tokens,
        temperature=gepa.temperature,
        sampling_args=gepa.sampling_args,
        api_base_url=api_base_url or (None if model else gepa.api_base_url),
        api_key_var=api_key_var or gepa.api_key_var,
        endpoints_path=gepa.endpoints_path,
        seed=gepa.seed,
    )


def verify_run(
    run: str,
    num_examples: int,
    rollouts: int,
    *,
    reporter: Reporter,
    model: str | None = None,
    api_base_url: str | None = None,
    api_key_var: str | None = None,
    max_concurrent: int | None = None,
) -> Verification:
    """Seed vs best candidate of `run` on held-out eval rows, same examples and seed."""
    from workbench.cli.embedded import ensure_embedded_model
    from workbench.envs.loader import load_environment
    from workbench.evaluate.prompts import compare_env_args
    from workbench.gepa.config import GepaConfig
    from workbench.gepa.heldout import held_out_start

    if num_examples < 1 or rollouts < 1:
        raise UserError("-n and -r must be at least 1")
    run_dir, meta, best = load_run(run)
    few_shot = best_few_shot(run_dir, meta)
    gepa = GepaConfig.model_validate(meta.config)
    # the candidates' own arguments are each side's overlay, not the run's
    env_args = {k: v for k, v in gepa.env_args.items() if k not in ("system_prompt", "few_shot")}
    env = load_environment(gepa.env_id, **env_args)
    start = held_out_start(meta, env.rows("train"), env.rows("eval"))
    config = heldout_eval_config(
        gepa,
        env_args,
        start,
        num_examples,
        rollouts,
        model=model,
        api_base_url=api_base_url,
        api_key_var=api_key_var,
        max_concurrent=max_concurrent,
    )
    ensure_embedded_model(config.model, base_url=config.api_base_url, endpoints_file=config.endpoints_path)
    # A run with turns passes few_shot on both sides: the seed candidate's is [] (explicitly, so an
    # env whose default `gepa apply` already set to the best turns still shows the seed without them).
    seed_args = candidate_args(meta.seed_prompt, None if few_shot is None else [])
    check = compare_env_args(config, (seed_args, candidate_args(best, few_shot)), ("seed", "best"), reporter)
    return Verification(gepa.env_id, start, rollouts, gepa.seed, check)


def print_verification(v: Verification) -> None:
    from workbench.cli.render import console

    d = v.check.difference
    color = {"better": "green", "worse": "red"}.get(d.verdict, "yellow")
    console.print(
        f"held-out examples {v.start}..{v.start + d.n - 1} of {v.env_id} (n={d.n}, r={v.rollouts}, seed {v.seed})",
        soft_wrap=True,
    )
    console.print(
        f"seed prompt {d.mean_a:.4f} → best prompt {d.mean_b:.4f}: [{color}]{d.diff:+.4f} "
        f"(95% CI {d.low:+.4f} to {d.high:+.4f}) · {d.verdict}[/]",
        soft_wrap=True,
    )
    console.print(f"[dim]eval runs: {v.check.runs[0]} (seed), {v.check.runs[1]} (best)[/]", soft_wrap=True)
