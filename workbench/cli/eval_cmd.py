"""`workbench eval run|show`: run an environment against a model; show or export a saved run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from workbench.cli import options as o
from workbench.errors import UserError

if TYPE_CHECKING:
    from workbench.evaluate import EvalConfig

app = typer.Typer(help="Evaluate a model on an environment and inspect the results.", no_args_is_help=True)


@app.command("run")
def run(
    target: Annotated[
        str | None,
        typer.Argument(
            help="An environment id (reverse-text, owner/name) or an eval config .toml.", show_default=False
        ),
    ] = None,
    model: o.Model = None,
    num_examples: o.NumExamples = None,
    rollouts_per_example: o.RolloutsPerExample = None,
    max_concurrent: o.MaxConcurrent = None,
    max_tokens: o.MaxTokens = None,
    temperature: o.Temperature = None,
    sampling_args: o.SamplingArgs = None,
    env_args: o.EnvArgs = None,
    api_base_url: o.BaseUrl = None,
    api_key_var: o.ApiKeyVar = None,
    endpoints_path: o.EndpointsPath = None,
    request_timeout: o.Timeout = None,
    request_tries: o.Tries = None,
    dtype: o.Dtype = None,
    save_results: o.SaveResults = False,
    verbose: o.Verbose = False,
    state_columns: o.StateColumns = None,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            "-R",
            help="Finish an interrupted run: its folder, or 'latest' for this env and model. Finished groups are not redone.",
            show_default=False,
        ),
    ] = None,
    seed: o.Seed = None,
    sets: o.Sets = None,
    checkpoints: Annotated[
        str | None,
        typer.Option(
            "--checkpoints",
            metavar="all|STEPS",
            help="With -m RUN (a training run folder or outputs/runs/latest): evaluate the base model and these checkpoints ('all', or steps such as 10,50,100) on the same examples and seed, then print reward by step. Points already evaluated with the same settings are skipped. With -b, each checkpoint is loaded into that server (started with the base model; LoRA via /v1/load_lora_adapter, full weights via /update_weights).",
            show_default=False,
        ),
    ] = None,
    no_base: Annotated[
        bool, typer.Option("--no-base", help="With --checkpoints: leave the base model out.")
    ] = False,
) -> None:
    """Run rollouts of an environment with a model, save them, and print the reward summary.

    Examples:

      workbench eval run reverse-text -m tiny -n 20 -r 8

      workbench eval run alphabet-sort -m tiny -n 10 -r 4 -a '{"max_turns": 3}'

      workbench eval run reverse-text -m my-model -b http://127.0.0.1:8000/v1

      workbench eval run reverse-text -m outputs/runs/latest --checkpoints all -n 64 -r 2
    """
    from workbench.cli.embedded import ensure_embedded_model
    from workbench.cli.render import RichReporter, console, err_console, server_failures, summary_table
    from workbench.evaluate import EvalConfig, run_eval

    flags = o.given(
        model=model,
        num_examples=num_examples,
        rollouts_per_example=rollouts_per_example,
        max_concurrent=max_concurrent,
        max_tokens=max_tokens,
        temperature=temperature,
        api_base_url=api_base_url,
        api_key_var=api_key_var,
        endpoints_path=endpoints_path,
        seed=seed,
        request_timeout=request_timeout,
        request_tries=request_tries,
        dtype=dtype,
        env_args=o.parse_json_object(env_args, "-a/--env-args"),
        sampling_args=o.parse_json_object(sampling_args, "-S/--sampling-args"),
        state_columns=o.split_columns(state_columns),
        verbose=verbose,
    )
    config = o.build_config(EvalConfig, target, flags, resume, sets)
    if config.dtype != "auto" and config.api_base_url:  # before a sweep loads weights into the server
        from workbench.inference.resolve import DTYPE_ON_SERVER

        raise UserError(DTYPE_ON_SERVER)
    if checkpoints is not None or no_base:
        sweep(config, checkpoints, include_base=not no_base, verbose=verbose)
        return
    ensure_embedded_model(config.model, base_url=config.api_base_url, endpoints_file=config.endpoints_path)
    try:
        result = run_eval(config, RichReporter(verbose=verbose), resume=resume)
    except KeyboardInterrupt:
        err_console.print(
            f"[yellow]stopped: every finished group is saved. Resume with `workbench eval run {resume_args(config)}`[/]"
        )
        raise typer.Exit(130) from None
    console.print(summary_table(result.summary, f"{config.env_id} · {config.model}"))
    console.print(f"[dim]saved to {result.run_dir}[/]")
    if result.summary.get("infrastructure_failures"):
        raise UserError(
            f"{server_failures(result.summary)}; not a finished result. "
            f"Once the server answers: workbench eval run -R {result.run_dir}"
        )


def resume_args(config: EvalConfig) -> str:
    """`-R <the run folder>` of the run just stopped (the newest of its env and model): the folder
    itself, since `-m outputs/runs/latest -R latest` would mean another run once a newer training
    run exists."""
    from workbench.evaluate.service import find_resume_dir

    try:
        folder = find_resume_dir("latest", config)
    except UserError:
        return f"{config.env_id} -m {config.model} -R latest"
    try:
        folder = folder.relative_to(Path.cwd())
    except ValueError:
        pass
    return f"-R {folder}"


def sweep(config: EvalConfig, checkpoints: str | None, *, include_base: bool, verbose: bool) -> None:
    """`--checkpoints`: every chosen checkpoint (and the base model) on the same examples."""
    from workbench.cli.render import RichReporter, console, err_console
    from workbench.cli.sweep_view import reward_bars, sweep_table
    from workbench.evaluate.sweep import run_sweep

    if checkpoints is None:
        raise UserError("--no-base goes with --checkpoints all|STEPS")
    try:
        result = run_sweep(
            config, checkpoints, include_base=include_base, reporter=RichReporter(verbose=verbose)
        )
    except KeyboardInterrupt:
        err_console.print(
            "[yellow]stopped: every finished checkpoint is saved; the same command skips them[/]"
        )
        raise typer.Exit(130) from None
    title = (
        f"{config.env_id} · {result.run_dir.name} · {config.num_examples} examples x "
        f"{config.rollouts_per_example} · seed {config.seed}"
    )
    console.print(sweep_table(result.points, title))
    console.print()
    for line in reward_bars(result.points):
        console.print(line, highlight=False)
    console.print(f"[dim]saved to {result.table}[/]")


@app.command("show")
def show(
    run_dir: Annotated[
        str | None,
        typer.Argument(
            help="A run folder (default: the newest eval run in this workspace).", show_default=False
        ),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table | csv | json | parquet")] = "table",
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Write the export here (csv/json default to stdout; parquet to <run>/results.parquet).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Show a saved eval run's summary, or export its rollouts as csv, json or parquet."""
    from workbench.cli.render import console, summary_table
    from workbench.evaluate.export import export_rollouts, find_run, load_run

    path = find_run(run_dir)
    metadata, groups = load_run(path)
    if fmt == "table":
        from workbench.engine.summary import DEFAULT_PASS_THRESHOLD, summarize
        from workbench.store.runs import effective_status

        status = effective_status(metadata)  # a "running" run whose process is gone has died
        saved = sum(len(g.rollouts) for g in groups)
        expected = metadata.progress()[0] or 0
        if saved < expected:  # results.jsonl lost lines after the run wrote its summary
            status = f"damaged: results.jsonl holds {saved} of {expected} rollouts"
            saved_summary = metadata.summary or {}  # the env's pass@k threshold, when the run recorded it
            summary = summarize(
                groups, pass_threshold=saved_summary.get("pass_threshold", DEFAULT_PASS_THRESHOLD)
            )
        else:
            summary = metadata.summary or summarize(groups)
        console.print(summary_table(summary, f"{metadata.env_id} · {metadata.model} · {status}"))
        console.print(f"[dim]{path}[/]")
        return
    if fmt not in ("csv", "json", "parquet"):
        raise UserError(f"unknown format '{fmt}' (use table, csv, json or parquet)")
    written = export_rollouts(groups, fmt, output, path)
    if written is not None:
        console.print(f"[dim]wrote {written}[/]")


@app.command("tui")
def tui(
    workspace: Annotated[
        Path | None,
        typer.Option(
            "--workspace",
            "-w",
            help="Workspace folder. \\[default: $WORKBENCH_WORKSPACE or the current directory]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Open the terminal UI on this workspace's runs (the same as `workbench tui`)."""
    from workbench.cli.tui_cmd import tui as open_tui

    open_tui(workspace)
