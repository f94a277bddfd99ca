"""`workbench setup [DIR]`: scaffold a workspace and build an embedded model (tiny, or tiny-qwen)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workbench.errors import UserError
from workbench.workspace import TINY_MODEL_NAME, TINY_QWEN_MODEL_NAME

EMBEDDED_MODELS = (TINY_MODEL_NAME, TINY_QWEN_MODEL_NAME)


def setup(
    directory: Annotated[Path, typer.Argument(help="Workspace folder (created if missing).")] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="Overwrite files you edited with the templates, and rebuild the model.")] = False,
    skip_model: Annotated[bool, typer.Option("--skip-model", help="Scaffold only; do not build a model.")] = False,
    model: Annotated[str, typer.Option("--model", "-m", help="Embedded model to build: 'tiny' (byte-level, the default) or 'tiny-qwen' (Qwen3 architecture, Qwen's real vocabulary; a test model).")] = TINY_MODEL_NAME,
) -> None:
    """Scaffold configs/ and environments/, and build the embedded tiny model (offline, ~2 min on 2 cores).

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

    if model not in EMBEDDED_MODELS:
        raise UserError(f"--model must be one of {', '.join(EMBEDDED_MODELS)}, got '{model}'")
    root = directory.resolve()
    report = scaffold_workspace(root, force=force)
    for path in report.created:
        console.print(f"  [green]created[/] {path.relative_to(root)}")
    for path in report.overwritten:
        console.print(f"  [yellow]overwrote[/] {path.relative_to(root)}")
    for path in report.kept_edited:
        console.print(f"  [yellow]kept your edited[/] {path.relative_to(root)} [dim](--force to overwrite)[/]")
    if report.unchanged:
        console.print(f"  [dim]{len(report.unchanged)} files already up to date[/]")
    if not skip_model:
        os.environ["WORKBENCH_WORKSPACE"] = str(root)
        build = build_tiny_qwen if model == TINY_QWEN_MODEL_NAME else build_tiny
        with build_progress(f"building {model} model") as progress:
            path, built = build(root, progress=progress, force=force)
        console.print(f"  [green]{'built' if built else 'up to date'}[/] {model} model: {path.relative_to(root)}")
    where = "" if root == Path.cwd().resolve() else f"cd {directory} && "
    console.print("\n[bold]Next:[/]")
    console.print(f"  {where}workbench eval run reverse-text -m {model} -n 20 -r 8")
    console.print(f"  {where}workbench eval run alphabet-sort -m {model} -n 10 -r 4 -a '{{\"max_turns\": 3}}'")
    console.print(f"  {where}workbench serve {model} --port 8000")
    console.print(f"  {where}workbench train configs/rl/reverse-text.toml   [dim](configs/rl, configs/eval: one per environment)[/]")
    console.print(f"  {where}workbench gepa run configs/gepa/reverse-text.toml")
