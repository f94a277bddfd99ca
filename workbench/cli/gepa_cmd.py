"""`workbench gepa run ENV|CONFIG.toml`: optimize an environment's system prompt with GEPA."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from workbench.cli import options as o
from workbench.errors import UserError

if TYPE_CHECKING:
    from workbench.gepa.service import GepaResult

app = typer.Typer(
    help="Optimize an environment's system prompt with GEPA (reflection + Pareto frontier).",
    no_args_is_help=True,
)

ReflectionModel = Annotated[
    str | None,
    typer.Option(
        "--reflection-model",
        "-M",
        help="Model that reads rollouts and proposes prompts (same forms as -m). \\[default: the -m model]",
        show_default=False,
    ),
]
MaxCalls = Annotated[
    int | None,
    typer.Option(
        "--max-calls",
        "-B",
        help="Budget in metric calls (one rollout of one example), seed evaluation included. \\[default: 500]",
        show_default=False,
    ),
]
NumTrain = Annotated[
    int | None,
    typer.Option(
        "--num-train",
        "-n",
        help="Training examples (train split) for reflection minibatches; -1: all. \\[default: 100]",
        show_default=False,
    ),
]
NumVal = Annotated[
    int | None,
    typer.Option(
        "--num-val",
        "-N",
        help="Validation examples (eval split) every accepted prompt is scored on; -1: all. \\[default: 50]",
        show_default=False,
    ),
]
MinibatchSize = Annotated[
    int | None,
    typer.Option(
        "--minibatch-size", help="Training examples per reflection step. \\[default: 3]", show_default=False
    ),
]
PerfectScore = Annotated[
    float | None,
    typer.Option(
        "--perfect-score",
        help="The best possible score; minibatches already there are skipped. \\[default: 1.0]",
        show_default=False,
    ),
]
ReflectionBaseUrl = Annotated[
    str | None,
    typer.Option(
        "--reflection-base-url",
        help="Base URL of the reflection model's server. \\[default: its endpoint registry entry, else -b]",
        show_default=False,
    ),
]
ReflectionKeyVar = Annotated[
    str | None,
    typer.Option(
        "--reflection-api-key-var",
        help="NAME of the environment variable with the reflection server's API key. \\[default: -k on the policy's server]",
        show_default=False,
    ),
]
ReflectionSampling = Annotated[
    str | None,
    typer.Option(
        "--reflection-sampling-args",
        help="Reflection sampling settings as JSON, e.g. '{\"temperature\": 0.7}'. \\[default: max_tokens 2048]",
        show_default=False,
    ),
]
OutputDir = Annotated[
    str | None,
    typer.Option(
        "--output-dir",
        "-o",
        help="Run folder to write. \\[default: environments/<env>/outputs/gepa/<env>--<model>/<run_id>]",
        show_default=False,
    ),
]
Resume = Annotated[
    str | None,
    typer.Option(
        "--resume",
        "-R",
        help="Continue an interrupted run: its folder, or 'latest' for this env and model. -B raises its budget.",
        show_default=False,
    ),
]
Optimizer = Annotated[
    str | None,
    typer.Option(
        "--optimizer",
        help="gepa (reflection + Pareto frontier), or DSPy's miprov2 (instructions proposed by -M + few-shot demos, Bayesian search) or bootstrap (few-shot demos from the model's own good rollouts, random search); the DSPy ones need pip install -e '.[dspy]'. \\[default: gepa]",
        show_default=False,
    ),
]
DryRun = Annotated[
    bool, typer.Option("--dry-run", help="Print the resolved plan and exit; nothing is loaded or written.")
]


@app.command("run")
def run(
    target: Annotated[
        str | None,
        typer.Argument(
            help="An environment id (reverse-text, owner/name) or a GEPA config .toml.", show_default=False
        ),
    ] = None,
    model: o.Model = None,
    optimizer: Optimizer = None,
    reflection_model: ReflectionModel = None,
    max_calls: MaxCalls = None,
    num_train: NumTrain = None,
    num_val: NumVal = None,
    minibatch_size: MinibatchSize = None,
    perfect_score: PerfectScore = None,
    state_columns: o.StateColumns = None,
    env_args: o.EnvArgs = None,
    api_base_url: o.BaseUrl = None,
    api_key_var: o.ApiKeyVar = None,
    endpoints_path: o.EndpointsPath = None,
    request_timeout: o.Timeout = None,
    request_tries: o.Tries = None,
    max_concurrent: o.MaxConcurrent = None,
    max_tokens: o.MaxTokens = None,
    temperature: o.Temperature = None,
    sampling_args: o.SamplingArgs = None,
    reflection_base_url: ReflectionBaseUrl = None,
    reflection_api_key_var: ReflectionKeyVar = None,
    reflection_sampling_args: ReflectionSampling = None,
    seed: o.Seed = None,
    sets: o.Sets = None,
    output_dir: OutputDir = None,
    resume: Resume = None,
    dry_run: DryRun = False,
) -> None:
    """Evolve an environment's system prompt: score it, let a reflection model read the rollouts
    and propose better prompts, keep a Pareto frontier over validation examples, until the
    budget is spent. Writes best_prompt.txt, pareto_frontier.jsonl and metadata.json.

    Examples:

      workbench gepa run reverse-text -m my-model -b http://127.0.0.1:8000/v1 -B 300 -n 50 -N 30

      workbench gepa run wordle -m MODEL -M REFLECTION_MODEL -B 1000 -n 200 -N 100

      workbench gepa run reverse-text --optimizer bootstrap -B 300 -n 40 -N 32

      workbench gepa run configs/gepa/my-env.toml --dry-run

      workbench gepa run --resume environments/reverse_text/outputs/gepa/<env>--<model>/<run_id>
    """
    from workbench.gepa.config import GepaConfig

    flags = o.given(
        model=model,
        optimizer=optimizer,
        reflection_model=reflection_model,
        max_calls=max_calls,
        num_train=num_train,
        num_val=num_val,
        minibatch_size=minibatch_size,
        perfect_score=perfect_score,
        max_concurrent=max_concurrent,
        max_tokens=max_tokens,
        temperature=temperature,
        api_base_url=api_base_url,
        api_key_var=api_key_var,
        endpoints_path=endpoints_path,
        request_timeout=request_timeout,
        request_tries=request_tries,
        reflection_base_url=reflection_base_url,
        reflection_api_key_var=reflection_api_key_var,
        seed=seed,
        output_dir=output_dir,
        env_args=o.parse_json_object(env_args, "-a/--env-args"),
        sampling_args=o.parse_json_object(sampling_args, "-S/--sampling-args"),
        reflection_sampling_args=o.parse_json_object(reflection_sampling_args, "--reflection-sampling-args"),
        state_columns=o.split_columns(state_columns),
    )
    if target is None and resume not in (None, "latest"):
        from workbench.gepa.service import find_gepa_run

        find_gepa_run(resume, None)  # a clear error before its metadata is read
    config = o.build_config(GepaConfig, target, flags, resume, sets)
    if dry_run:
        from workbench.cli.train_cmd import print_plan
        from workbench.gepa.plan import build_plan

        plan = build_plan(config)
        print_plan(plan)
        if plan.warnings:  # the exit code says whether a real run could start
            raise UserError(f"{target or resume}: a real run cannot start: {'; '.join(plan.warnings)}")
        return
    _run(config, resume)


def _run(config: Any, resume: str | None) -> None:
    from workbench.cli.embedded import ensure_embedded_model
    from workbench.cli.render import RichReporter, err_console
    from workbench.gepa import run_gepa

    ensure_embedded_model(config.model, base_url=config.api_base_url, endpoints_file=config.endpoints_path)
    ensure_embedded_model(
        config.reflection_model,
        base_url=config.reflection_base_url or config.api_base_url,
        endpoints_file=config.endpoints_path,
    )
    result = run_gepa(config, RichReporter(unit="calls"), resume=resume)
    print_summary(result, config)
    if result.status == "stopped" and result.optimizer != "gepa":
        err_console.print(
            f"[yellow]stopped: the candidates scored so far are saved in {result.run_dir} "
            f"({result.optimizer} runs cannot be resumed)[/]",
            soft_wrap=True,
        )
        raise typer.Exit(130)
    if result.status == "stopped":
        err_console.print(
            f"[yellow]stopped: saved up to the last finished iteration. Resume with "
            f"`workbench gepa run --resume {result.run_dir}`[/]",
            soft_wrap=True,
        )
        raise typer.Exit(130)
    if result.status == "failed":
        raise typer.Exit(1)


def print_summary(result: GepaResult, config: Any) -> None:
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    from workbench.cli.render import console

    def score(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    table = Table(
        title=f"{result.optimizer} · {config.env_id} · {config.model} · {result.status}",
        show_header=False,
        title_justify="left",
        box=None,
        padding=(0, 2),
    )
    table.add_column(style="bold")
    table.add_column()
    gain = ""
    if result.seed_score is not None and result.best_score is not None:
        delta = result.best_score - result.seed_score
        gain = f"  ([{'green' if delta > 0 else 'yellow'}]{delta:+.4f}[/])"
    table.add_row(
        "validation score", f"seed {score(result.seed_score)} → best {score(result.best_score)}{gain}"
    )
    table.add_row("metric calls", f"{result.metric_calls_used} of {result.max_calls}")
    accepted = max(result.num_candidates - 1, 0)
    if result.optimizer == "gepa":
        table.add_row("candidates", f"the seed + {accepted} accepted, over {result.iterations} iterations")
    else:
        table.add_row("candidates", f"the seed + {accepted} more, each scored on the validation set")
    if result.stopped_early:
        table.add_row("stopped early", result.stopped_early)
    if result.error:
        table.add_row("error", f"[red]{escape(result.error)}[/]")
    console.print(table)
    console.print(Panel(escape(result.best_prompt), title="best prompt", title_align="left"))
    if result.best_few_shot:
        turns = "\n".join(
            f"[bold]{m.get('role')}[/]: {escape(str(m.get('content') or ''))}" for m in result.best_few_shot
        )
        console.print(
            Panel(
                turns,
                title=f"few-shot turns before each question ({len(result.best_few_shot)} messages, "
                "best_few_shot.json)",
                title_align="left",
            )
        )
    console.print(f"[dim]saved to {result.run_dir}[/]", soft_wrap=True)
    console.print(
        f"[dim]check the gain on held-out examples: workbench gepa verify {result.run_dir}[/]", soft_wrap=True
    )
    console.print(
        f"[dim]make it the environment's default: workbench gepa apply {result.run_dir}[/]", soft_wrap=True
    )


RunArg = Annotated[str, typer.Argument(help="A GEPA run: its folder, or its run id.", show_default=False)]


@app.command("apply")
def apply(run: RunArg) -> None:
    """Make a run's best prompt the environment's default system prompt, so `eval run ENV` (with
    no -a) uses it. Rewrites only the default (`DEFAULT_SYSTEM_PROMPT = ...` or what
    load_environment's `system_prompt` defaults to) in the workspace's environment file; for a
    DSPy run whose demonstrations are few-shot turns, the default of `few_shot` too. For an
    installed or bundled environment it prints the -a form to use instead.

    Example:

      workbench gepa apply environments/reverse_text/outputs/gepa/<env>--<model>/<run_id>
    """
    from rich.markup import escape

    from workbench.cli.gepa_verify import best_few_shot, candidate_args, load_run
    from workbench.cli.render import console
    from workbench.gepa.apply import apply_defaults

    run_dir, meta, best = load_run(run)
    # a run with demos as turns sets few_shot even when its best candidate has none ([]): the
    # env's default then is exactly the best candidate, whatever an earlier apply left there
    args = candidate_args(best, best_few_shot(run_dir, meta))
    applied = apply_defaults(meta.env_id, args)
    if applied[0].path is None:
        console.print(
            f"[yellow]not written: {escape(applied[0].reason)}[/]; use the "
            f"{'prompt' if len(args) == 1 else 'prompt and few-shot turns'} with -a:",
            soft_wrap=True,
        )
        console.print(_eval_command(meta, args), soft_wrap=True, highlight=False)
        return
    path = applied[0].path
    if not any(a.changed for a in applied):
        what = "this prompt" if len(args) == 1 else "this prompt and these few-shot turns"
        console.print(
            f"{' and '.join(a.target for a in applied)} in {path} already {'is' if len(args) == 1 else 'hold'} "
            f"{what}",
            soft_wrap=True,
        )
        return
    for a in applied:
        if not a.changed:
            console.print(f"[dim]{a.target} in {path} already is the best one[/]", soft_wrap=True)
        elif a.arg == "few_shot":
            console.print(
                f"[green]wrote the best few-shot turns ({len(args['few_shot'])} messages) to {a.target} in "
                f"{path}[/]",
                soft_wrap=True,
            )
        else:
            console.print(f"[green]wrote the best prompt to {a.target} in {path}[/]", soft_wrap=True)
            if isinstance(a.previous, str):
                console.print(f"[dim]it replaced:[/] {escape(a.previous)}", soft_wrap=True, highlight=False)
    console.print(
        f"[dim]now `workbench eval run {meta.env_id} -m {meta.model}` uses "
        f"{'it' if len(args) == 1 else 'them'}[/]",
        soft_wrap=True,
    )


def _eval_command(meta: Any, env_args: dict[str, Any]) -> str:
    """`workbench eval run ENV -m MODEL -a '{...}'`, shell-quoted and markup-escaped."""
    import json
    import shlex

    from rich.markup import escape

    return f"workbench eval run {meta.env_id} -m {meta.model} -a {escape(shlex.quote(json.dumps(env_args)))}"


@app.command("verify")
def verify(
    run: RunArg,
    num_examples: Annotated[
        int,
        typer.Option("--num-examples", "-n", help="Held-out examples (eval split rows the run never used)."),
    ] = 20,
    rollouts: Annotated[int, typer.Option("--rollouts-per-example", "-r", help="Rollouts per example.")] = 2,
    model: o.Model = None,
    api_base_url: o.BaseUrl = None,
    api_key_var: o.ApiKeyVar = None,
    max_concurrent: o.MaxConcurrent = None,
) -> None:
    """Evaluate the seed prompt and the best prompt of a GEPA run on held-out examples (eval rows
    past the ones the run validated on), same examples and seed, and print the difference with
    a 95% confidence interval (paired bootstrap over examples). For a DSPy run with few-shot
    turns, the best side uses the best candidate's turns and the seed side none. The two
    evaluations are ordinary eval runs: open them side by side with Compare in `workbench tui`.

    Example:

      workbench gepa verify environments/reverse_text/outputs/gepa/<env>--<model>/<run_id> -n 50
    """
    from workbench.cli.gepa_verify import print_verification, verify_run
    from workbench.cli.render import RichReporter

    verification = verify_run(
        run,
        num_examples,
        rollouts,
        model=model,
        api_base_url=api_base_url,
        api_key_var=api_key_var,
        max_concurrent=max_concurrent,
        reporter=RichReporter(),
    )
    print_verification(verification)


@app.command("compare")
def compare(
    target: Annotated[
        str,
        typer.Argument(
            help="An environment id or a GEPA config .toml (its optimizer is ignored).", show_default=False
        ),
    ],
    model: o.Model = None,
    reflection_model: ReflectionModel = None,
    max_calls: MaxCalls = None,
    num_train: NumTrain = None,
    num_val: NumVal = None,
    env_args: o.EnvArgs = None,
    api_base_url: o.BaseUrl = None,
    api_key_var: o.ApiKeyVar = None,
    max_concurrent: o.MaxConcurrent = None,
    max_tokens: o.MaxTokens = None,
    temperature: o.Temperature = None,
    reflection_base_url: ReflectionBaseUrl = None,
    seed: o.Seed = None,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="Override a config key (repeatable), value as TOML: --set demo_threshold=0.3 for the prompt "
            "optimizers, --set rl.KEY=VALUE for the rl arm's training config (rl.learning_rate=5e-4, "
            "rl.rollouts_per_example=8, rl.batch_size=16, rl.max_steps=4). Flags win over it.",
            show_default=False,
        ),
    ] = None,
    optimizers: Annotated[
        str | None,
        typer.Option(
            "--optimizers",
            help="Comma-separated arms: gepa, miprov2, bootstrap, rl. \\[default: gepa,miprov2,bootstrap, "
            "plus rl when the model's weights are here to train (not -b or an endpoint)]",
            show_default=False,
        ),
    ] = None,
    heldout: Annotated[
        int,
        typer.Option(
            "--heldout",
            "-H",
            help="Held-out examples (eval rows past the validation ones) each result is checked on.",
        ),
    ] = 64,
    rollouts: Annotated[
        int, typer.Option("--rollouts-per-example", "-r", help="Rollouts per held-out example.")
    ] = 2,
    rl_config: Annotated[
        Path | None,
        typer.Option(
            "--rl-config",
            metavar="FILE",
            help="The rl arm's training config (any `workbench train` style); its model and environment "
            "become the comparison's. \\[default: LoRA, 4 rollouts per prompt, 8 prompts a step, saved "
            "as rl.toml in the comparison's folder]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run GEPA, MIPROv2, bootstrap and RL on one environment with one rollout budget (-B), check
    each result against its start on the same held-out examples, and print the table (held-out
    reward and gain with a 95% CI, rollouts spent, gain per 100 rollouts and per minute,
    prompt-model calls, wall time); saved as comparison.md/.json under
    environments/<env>/outputs/gepa/compare/ and shown in the TUI's GEPA view.

    A prompt optimizer spends -B metric calls (one rollout each). The rl arm is an ordinary
    `workbench train` run whose rollouts fit -B (max_steps × batch_size ≤ B; unless set, batch_size
    is 8 prompts × 4 rollouts and max_steps what fits; every rollout it trains on counts, online
    evaluation is off unless its config turns it on, and then not counted); it checks the final
    checkpoint against the starting model, both with the environment's own prompt.

    Example:

      workbench gepa compare reverse-text -m tiny -B 200 -n 24 -N 16 --optimizers gepa,bootstrap,rl
    """
    from workbench.cli.embedded import ensure_embedded_model
    from workbench.cli.gepa_compare import Reporters, RlArm, compare_folder, compare_optimizers
    from workbench.cli.gepa_compare_rl import RL_ARM, rl_blocker, rl_train_config
    from workbench.cli.render import RichReporter, console
    from workbench.gepa.config import GepaConfig
    from workbench.gepa.dspy_optimizers import OPTIMIZERS

    arms = (*OPTIMIZERS, RL_ARM)
    prompt_sets = [item for item in sets or [] if not item.startswith("rl.")]
    rl_sets = [item.removeprefix("rl.") for item in sets or [] if item.startswith("rl.")]
    flags = o.given(
        model=model,
        reflection_model=reflection_model,
        max_calls=max_calls,
        num_train=num_train,
        num_val=num_val,
        api_base_url=api_base_url,
        api_key_var=api_key_var,
        max_concurrent=max_concurrent,
        max_tokens=max_tokens,
        temperature=temperature,
        reflection_base_url=reflection_base_url,
        seed=seed,
        env_args=o.parse_json_object(env_args, "-a/--env-args"),
    )
    config = o.build_config(GepaConfig, target, flags, None, prompt_sets)
    if optimizers is None:
        # RL is the comparison the budget is for, so it is in by default wherever it can run: a
        # model whose weights are here. A served model (-b, an endpoint) cannot be trained from
        # here, and the default leaves it out instead of failing.
        chosen = [*OPTIMIZERS, *([RL_ARM] if rl_blocker(config) is None else [])]
    else:
        chosen = [name.strip() for name in optimizers.split(",") if name.strip()]
    if unknown := [name for name in chosen if name not in arms]:
        raise UserError(f"unknown optimizer '{unknown[0]}': choose from {', '.join(arms)}")
    folder = compare_folder(config)
    rl = None
    if RL_ARM in chosen:  # every RL problem before any arm runs
        if (blocker := rl_blocker(config)) is not None:
            raise UserError(blocker)
        rl = RlArm(*rl_train_config(config, rl_config, rl_sets, folder))
    elif rl_sets or rl_config is not None:
        raise UserError("--set rl.KEY=VALUE and --rl-config configure the rl arm: add rl to --optimizers")
    ensure_embedded_model(config.model, base_url=config.api_base_url, endpoints_file=config.endpoints_path)
    reporters = Reporters(RichReporter(unit="calls"), RichReporter(unit="steps"), RichReporter())
    compare_optimizers(config, chosen, heldout, rollouts, reporters, folder, rl)
    console.print((folder / "comparison.md").read_text(encoding="utf-8"), highlight=False, soft_wrap=True)
    console.print(f"[dim]saved to {folder}[/]", soft_wrap=True)
