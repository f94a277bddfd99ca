"""`workbench train CONFIG.toml [--dry-run] [--set KEY=VALUE]... [--resume RUN] [--nproc N]`: RL or SFT training."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperGroup

from workbench.errors import UserError

if TYPE_CHECKING:
    # The context TyperGroup.parse_args is typed with: typer (0.29+) vendors click and names its
    # Context nowhere public (typer.Context is a subclass). For the type checker only.
    from typer._click import Context

    from workbench.config.plan import Plan

ConfigArg = Annotated[
    Path | None,
    typer.Argument(
        metavar="CONFIG",
        help="Training config (.toml): hosted, prime-rl (nested or flat) or vf-rl style.",
        show_default=False,
    ),
]
DryRun = Annotated[
    bool, typer.Option("--dry-run", help="Print the resolved plan and exit; nothing is loaded or written.")
]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override a config key (repeatable), value as TOML: --set max_steps=20 --set sampling.temperature=0.8 --set 'sampling.stop=[\"</a>\"]'.",
        show_default=False,
    ),
]
ResumeOption = Annotated[
    Path | None,
    typer.Option(
        "--resume",
        help="Continue a run folder from its newest complete checkpoint, with its saved config.toml (CONFIG not needed).",
        show_default=False,
    ),
]
ResumeStepOption = Annotated[
    int | None,
    typer.Option(
        "--resume-step",
        min=1,
        metavar="STEP",
        help="With --resume: continue from this step's checkpoint instead of the newest (prime-rl's --trainer.ckpt.resume-step); later checkpoints are set aside in checkpoints/set-aside-<time>/.",
        show_default=False,
    ),
]
NprocOption = Annotated[
    int,
    typer.Option(
        "--nproc",
        min=1,
        metavar="N",
        help='Train with N processes on this machine (data parallel: DDP, or FSDP with data_parallel = "fsdp"): each takes 1/N of every step\'s rollouts; gloo on CPU, one GPU per process with CUDA. The same as `torchrun --nproc-per-node N -m workbench train CONFIG`; several nodes: torchrun --nnodes (docs/distributed.md).',
    ),
]


def train(
    config: ConfigArg = None,
    dry_run: DryRun = False,
    overrides: SetOption = None,
    resume: ResumeOption = None,
    resume_step: ResumeStepOption = None,
    nproc: NprocOption = 1,
) -> None:
    """Train a model with RL on environments (or SFT on demonstrations) from one TOML config.

    Examples:

      workbench train configs/rl/reverse-text.toml

      workbench train configs/rl/reverse-text.toml --set max_steps=20 --set sampling.temperature=0.8

      workbench train prime-rl.toml --dry-run

      workbench train --resume outputs/runs/<run>

      workbench train --resume outputs/runs/<run> --resume-step 50

      workbench train configs/rl/reverse-text.toml --nproc 2
    """
    from workbench.cli.embedded import ensure_embedded_model
    from workbench.cli.render import RichReporter, console, err_console
    from workbench.train import (
        build_plan,
        config_source,
        is_rank_zero,
        load_train_config,
        model_notes,
        rank_blockers,
        run_blockers,
        run_train,
    )
    from workbench.train.placement import rank_gpu_blockers
    from workbench.train.plan import cuda_gpu_count

    path = config_source(config, resume)
    if resume_step is not None:
        if resume is None:
            raise UserError("--resume-step continues a run: give the run folder with --resume RUN")
        overrides = [*(overrides or []), f"checkpointing.resume_step={resume_step}"]
    train_config, notes = load_train_config(path, overrides or [])
    notes += resume_layout_notes(resume, nproc)
    blockers = run_blockers(train_config, resuming=resume is not None) + rank_blockers(train_config, nproc)
    blockers += rank_gpu_blockers(train_config, nproc, cuda_gpu_count())
    plan = build_plan(train_config, [*notes, *model_notes(train_config.model)], blockers, nproc=nproc)
    if dry_run:
        print_plan(plan)
        if blockers:  # the plan is fine to read, but the exit code says whether a real run could start
            raise UserError(f"{path}: a real run cannot start: {'; '.join(blockers)}")
        return
    if blockers:  # before any other output: a user mistake is one line
        raise UserError(f"{path}: {blockers[0]} (--dry-run shows the whole plan)")
    for note in plan.notes if nproc == 1 and is_rank_zero() else []:  # with --nproc, rank 0 says them
        err_console.print(f"[dim]note: {_escape(note)}[/]")
    if is_rank_zero():  # before any rank starts: one build (under torchrun, build it first)
        ensure_embedded_model(train_config.model)
    rank_args = [str(config)] if config is not None else []  # what each --nproc rank runs
    rank_args += [item for value in overrides or [] for item in ("--set", value)]
    rank_args += ["--resume", str(resume)] if resume is not None else []
    result = run_train(
        train_config,
        RichReporter(unit="steps") if is_rank_zero() else None,
        resume=resume,
        config_path=path,
        nproc=nproc,
        rank_args=rank_args,
    )
    if result.speaks:
        console.print(f"{result.status} at step {result.last_step} · [dim]{result.run_dir}[/]")
        print_took(result.run_dir)
        print_outcome(result.run_dir)
        if result.status == "stopped":
            err_console.print(
                f"[yellow]{stopped_line(result.run_dir, result.last_step, result.world_size)}[/]"
            )
    if result.status == "stopped":
        raise typer.Exit(130)


def stopped_line(run_dir: Path, last_step: int, world_size: int) -> str:
    """What a stopped run says: its checkpoint and how to continue. Stopped before its first
    checkpoint (during the baseline eval, say), nothing was saved and a resume starts over from
    step 0: "stopped with a checkpoint" would be untrue there."""
    from workbench.store.checkpoints import checkpoint_step, list_checkpoints
    from workbench.train.distributed import resume_hint

    hint = resume_hint(run_dir, world_size)
    saved = list_checkpoints(run_dir)
    if saved:
        return f"stopped with a checkpoint (step {checkpoint_step(saved[-1])}); continue with {hint}"
    return f"stopped at step {last_step} before any checkpoint was written; {hint} starts it over"


def resume_layout_notes(resume: Path | None, nproc: int) -> list[str]:
    """A resume with another number of trainer processes than the run had (its metadata.json says
    how many): allowed, each step still trains the whole batch, but worth a line."""
    if resume is None:
        return []
    from workbench.store.runs import TrainRun, read_saved
    from workbench.train.distributed import launched_world_size

    saved = read_saved(resume, "train")
    now = nproc if nproc > 1 else launched_world_size()  # a --nproc rank runs without --nproc
    if not isinstance(saved, TrainRun) or saved.world_size == now:
        return []
    return [
        f"{resume} trained with {saved.world_size} trainer process(es) and resumes with {now} (each step "
        f"still trains the whole batch); --nproc {saved.world_size} keeps its layout"
    ]


def export(
    run_dir: Annotated[
        Path, typer.Argument(metavar="RUN", help="A training run folder (outputs/runs/<run>).")
    ],
    step: Annotated[
        int | None,
        typer.Option("--step", help="Checkpoint step. \\[default: the newest]", show_default=False),
    ] = None,
    merge: Annotated[
        bool,
        typer.Option(
            "--merge", help="Fold the LoRA adapter into the base weights: a plain Hugging Face model."
        ),
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Target folder. \\[default: RUN/exports/step_N[-merged]]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Export a checkpoint as a model folder that transformers and vLLM load (--merge: no peft needed).

    Example: workbench train export outputs/runs/<run> --step 40 --merge
    """
    from workbench.cli.render import console
    from workbench.train.export import export_checkpoint

    console.print(f"exported to {export_checkpoint(run_dir, step, merge, output)}")


class TrainGroup(TyperGroup):
    """`workbench train CONFIG ...` runs training; `workbench train export ...` exports."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=TrainGroup,
    no_args_is_help=False,
    help="Train with RL or SFT from a TOML config (workbench train CONFIG), or export a checkpoint.\n\n"
    "Options of a run (`workbench train run --help`): --dry-run, --set KEY=VALUE, --resume RUN, "
    "--nproc N (N data-parallel processes on this machine; or torchrun --nproc-per-node N -m workbench train CONFIG).",
)
app.command(
    "run",
    help="Train from a config (the default: `workbench train CONFIG` means `workbench train run CONFIG`).",
)(train)
app.command("export")(export)


def print_took(run_dir: Path) -> None:
    """How long the run took against its estimate at the start (metadata.json's `estimate`)."""
    from workbench.cli.render import console
    from workbench.store.runs import TrainRun, read_run_metadata
    from workbench.train.estimate import duration

    try:
        meta = read_run_metadata(run_dir, "train")
    except (OSError, ValueError):
        return
    estimate = meta.estimate if isinstance(meta, TrainRun) else None
    if estimate is None or estimate.actual_s is None:
        return
    took = estimate.actual_s
    shown = f"{took:.0f} s" if took < 90 else f"{int(took // 60)} min {took % 60:.0f} s"
    console.print(
        f"took {shown} (estimated {duration(estimate.seconds)}, {estimate.basis})"
        + (f" [dim]{estimate.error:+.0%}[/]" if estimate.error is not None else "")
    )


def print_outcome(run_dir: Path) -> None:
    """Held-out reward before and after training, and how to use the final checkpoint."""
    from workbench.cli.render import console
    from workbench.train import outcome

    result = outcome(run_dir)
    if len(result.held_out) >= 2:
        (first_step, before), (last_step, after) = result.held_out[0], result.held_out[-1]
        console.print(
            f"held-out reward: [bold]{before:.3f}[/] (step {first_step}) → [bold]{after:.3f}[/] "
            f"(step {last_step})  [{'green' if after > before else 'yellow'}]{after - before:+.3f}[/]"
        )
    if result.final_checkpoint is not None:
        console.print(
            f"final checkpoint: {result.final_checkpoint}\n"
            f"  evaluate it: workbench eval run ENV -m {result.final_checkpoint}\n"
            f"  export it:   workbench train export {run_dir} --merge"
        )


def print_plan(plan: Plan) -> None:
    from rich.table import Table

    from workbench.cli.render import console

    for section in plan.sections:
        table = Table(
            title=section.title,
            title_justify="left",
            title_style="bold",
            show_header=False,
            box=None,
            padding=(0, 2),
        )
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        for label, value in section.rows:
            table.add_row(_escape(label), _escape(value))
        console.print(table)
        console.print()
    for note in plan.notes:
        console.print(f"[yellow]note:[/] {_escape(note)}")
    for warning in plan.warnings:
        console.print(f"[red]a real run stops here:[/] {_escape(warning)}")
    console.print(
        "[green]dry run: config is valid[/]"
        + (", but a real run cannot start (see above)" if plan.warnings else "")
    )


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
