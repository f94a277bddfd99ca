"""The `rl` arm of `workbench gepa compare ENV --optimizers gepa,bootstrap,rl`: RL on the same
environment and model with the prompt optimizers' rollout budget, checked on the same held-out rows.

The arm is an ordinary `workbench train` run (run_train, its folder under outputs/runs/, shown in
the TUI's training monitor). Its config is rl.toml in the comparison's folder (written from the
GEPA settings: LoRA, 4 rollouts per prompt, 8 prompts a step) or `--rl-config FILE`, with
`--set rl.KEY=VALUE` overrides; its model and environment are always the comparison's. The budget
-B caps the rollouts it may generate: max_steps × batch_size (× the difficulty filter's
oversampling factor, when that is on) ≤ B. Unless given, batch_size is 32 (smaller when the budget
is) and max_steps is as many steps as fit. Online evaluation during training is off: it would
spend rollouts on monitoring, and the final checkpoint is what is checked, not a chosen one.

Verification is the prompt arms' check with models in place of prompts: the starting model and
the final checkpoint, both with the environment's own prompt, on the same held-out eval rows,
same seed, same rollouts per example (two ordinary eval runs), then the paired difference.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import UserError
from workbench.events import Reporter
from workbench.store.comparisons import ComparisonRow, training_rollouts, with_rates

if TYPE_CHECKING:
    from workbench.gepa.config import GepaConfig
    from workbench.train.schema import TrainConfig

RL_ARM = "rl"
ROLLOUTS_PER_PROMPT = 4  # a group big enough for a baseline, small enough to leave steps in the budget
PROMPTS_PER_STEP = 8


def rl_blocker(config: GepaConfig) -> str | None:
    """Why the comparison's model cannot be RL-trained here (a server's or an endpoint's), or None."""
    from workbench.inference.endpoints import load_endpoints
    from workbench.train.config import model_problem
    from workbench.workspace import endpoints_path

    needs = "RL trains the model's weights here: give a local model ('tiny', a model folder or checkpoint, a Hugging Face id)"
    if config.api_base_url:
        return f"--optimizers rl: '{config.model}' is served at {config.api_base_url} (-b); {needs}"
    registry = Path(config.endpoints_path) if config.endpoints_path else endpoints_path()
    if config.model in load_endpoints(registry):
        return f"--optimizers rl: '{config.model}' is an endpoint in {registry}; {needs}"
    problem = model_problem(config.model)
    return None if problem is None else f"--optimizers rl: {problem}"


def default_rl_config(base: GepaConfig) -> dict[str, Any]:
    """rl.toml when no --rl-config is given: LoRA RL on the comparison's env and model."""
    return {
        "model": base.model,
        "rollouts_per_example": ROLLOUTS_PER_PROMPT,
        "learning_rate": 1e-3,  # the shipped reverse-text config's: stable on LoRA, moves in few steps
        "seed": base.seed,
        "sampling": {"temperature": 1.0, **({"max_tokens": base.max_tokens} if base.max_tokens else {})},
        "env": [{"id": base.env_id, **({"args": base.env_args} if base.env_args else {})}],
        "lora": {"r": 16, "alpha": 32},
        "eval": {"interval": 0},
    }


def rl_train_config(
    base: GepaConfig, rl_config: Path | None, sets: list[str], folder: Path
) -> tuple[TrainConfig, Path]:
    """The RL arm's config (and the file it came from): batch_size and max_steps as given (the
    file, --set rl.KEY=VALUE), else fitted to the budget base.max_calls. UserError when one step
    does not fit, the given steps do not, or the run could not start (`train --dry-run`'s checks)."""
    import tomli_w

    from workbench.train import load_train_config
    from workbench.train.schema import TrainConfig

    if rl_config is None:
        made = next(p for p in reversed([folder, *folder.parents]) if not p.exists())
        folder.mkdir(parents=True)
        written = folder / "rl.toml"
        data = default_rl_config(base)
        written.write_text(
            "# the RL arm of `workbench gepa compare`: batch_size and max_steps come from the budget\n"
            + tomli_w.dumps(data),
            encoding="utf-8",
        )
        try:
            return _fit_budget(base, written, TrainConfig.model_validate(data), sets)
        except UserError:  # nothing ran: leave no comparison folder behind
            shutil.rmtree(made)
            raise
    return _fit_budget(base, rl_config, load_train_config(rl_config)[0], sets)


def _fit_budget(
    base: GepaConfig, rl_config: Path, as_written: TrainConfig, sets: list[str]
) -> tuple[TrainConfig, Path]:
    from workbench.train import load_train_config, run_blockers
    from workbench.train.config import apply_overrides
    from workbench.train.schema import TrainConfig

    data = as_written.model_dump()
    given = as_written.model_fields_set | set(apply_overrides(data, sets))
    # a first look with the overrides; a batch of one group until the budget says how big
    first = [] if "batch_size" in given else [f"batch_size={data['rollouts_per_example']}"]
    config, _ = load_train_config(rl_config, [*sets, *first])
    factor = config.difficulty_filter.oversampling_factor if config.difficulty_filter.enabled else 1.0
    budget, per_prompt, batch = base.max_calls, config.rollouts_per_example, config.batch_size
    if "batch_size" not in given:
        batch = min(PROMPTS_PER_STEP * per_prompt, int(budget / factor) // per_prompt * per_prompt)
    worst = batch * factor  # the rollouts one step may generate
    oversampling = f" × oversampling {factor:g}" if factor > 1 else ""
    if batch < 1 or worst > budget:
        raise UserError(
            f"-B {budget} is less than one RL step ({max(batch, per_prompt)} rollouts{oversampling}): "
            "raise -B or lower rl.batch_size / rl.rollouts_per_example"
        )
    steps = config.max_steps if "max_steps" in given else int(budget // worst)
    if steps * worst > budget:
        raise UserError(
            f"rl.max_steps {steps} × batch_size {batch}{oversampling} is more than the budget -B {budget} rollouts"
        )
    config, _ = load_train_config(rl_config, [*sets, f"batch_size={batch}", f"max_steps={steps}"])
    update = {"model": base.model, "env": [{"id": base.env_id, "args": base.env_args}]}
    config = TrainConfig.model_validate({**config.model_dump(), **update})
    if problems := run_blockers(config):
        raise UserError(f"the rl arm cannot start: {problems[0]}")
    return config, rl_config


def heldout_start(base: GepaConfig) -> int:
    """The first eval row no arm used: past the validation rows the prompt arms score on (and
    past their training rows when the env has one split), as `gepa verify` counts them."""
    from workbench.envs.loader import load_environment
    from workbench.gepa.heldout import held_out_start
    from workbench.store.runs import GepaRun

    env = load_environment(base.env_id, **base.env_args)
    train_rows, eval_rows = env.rows("train"), env.rows("eval")
    used = GepaRun(
        run_id="compare",
        env_id=base.env_id,
        num_train=len(train_rows) if base.num_train == -1 else min(base.num_train, len(train_rows)),
        num_val=len(eval_rows) if base.num_val == -1 else min(base.num_val, len(eval_rows)),
    )
    return held_out_start(used, train_rows, eval_rows)


def run_rl_arm(
    base: GepaConfig,
    config: TrainConfig,
    config_path: Path,
    start: int,
    heldout: int,
    rollouts: int,
    train_reporter: Reporter,
    eval_reporter: Reporter,
) -> ComparisonRow:
    """Train, then check the final checkpoint against the starting model on the held-out rows."""
    from workbench.cli.gepa_verify import heldout_eval_config
    from workbench.engine.paired import paired_difference
    from workbench.evaluate.service import run_eval
    from workbench.train import outcome, run_train

    started = time.perf_counter()
    result = run_train(config, train_reporter, config_path=config_path)
    wall = time.perf_counter() - started
    final = outcome(result.run_dir).final_checkpoint
    if result.status != "finished" or final is None:
        raise UserError(f"the RL arm's training {result.status} at step {result.last_step}: {result.run_dir}")
    means = []
    for label, model in (("starting model", base.model), ("final RL checkpoint", str(final))):
        eval_config = heldout_eval_config(base, base.env_args, start, heldout, rollouts, model=model)
        eval_reporter.message(f"evaluating the {label} on {heldout} held-out examples (from example {start})")
        evaluated = run_eval(eval_config, eval_reporter)
        if evaluated.status != "finished":
            raise UserError(f"the {label}'s evaluation {evaluated.status}: {evaluated.run_dir}")
        means.append(evaluated.group_means())
    d = paired_difference(means[0], means[1], seed=base.seed)
    spent = training_rollouts(result.run_dir)
    return with_rates(
        ComparisonRow(
            optimizer=RL_ARM,
            run_dir=str(result.run_dir),
            status=result.status,
            heldout_start=start,
            heldout_n=d.n,
            heldout_seed=d.mean_a,
            heldout_best=d.mean_b,
            diff=d.diff,
            ci_low=d.low,
            ci_high=d.high,
            verdict=d.verdict,
            metric_calls=spent,
            max_calls=base.max_calls,
            wall_s=round(wall, 1),
            rollouts_spent=spent,
            best=str(final),
        )
    )
