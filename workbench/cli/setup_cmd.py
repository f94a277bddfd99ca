"""`workbench setup [DIR]`: scaffold a workspace and build the embedded tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def setup(
    directory: Annotated[Path, typer.Argument(help="Workspace folder (created if missing).")] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="Overwrite files you edited with the templates, and rebuild the tiny model.")] = False,
    skip_model: Annotated[bool, typer.Option("--skip-model", help="Scaffold only; do not build the tiny model.")] = False,
) -> None:
    """Scaffold configs/ and environments/, and build the embedded tiny model (offline, ~2 min on 2 cores).

    Safe to run again: existing files are kept (use --force to overwrite your edits) and the
    model is rebuilt only when its recipe changed.
    """
    import os

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from workbench.bootstrap import build_tiny, scaffold_workspace
    from workbench.cli.render import console, err_console

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
        with Progress(TextColumn("[bold]building tiny model"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                      console=err_console) as bar:
            task = bar.add_task("tiny", total=None, loss="-")

            def progress(step: int, total: int, loss: float) -> None:
                bar.update(task, completed=step, total=total, loss=f"{loss:.3f}")

            path, built = build_tiny(root, progress=progress, force=force)
        console.print(f"  [green]{'built' if built else 'up to date'}[/] tiny model: {path.relative_to(root)}")
    where = "" if root == Path.cwd().resolve() else f"cd {directory} && "
    console.print("\n[bold]Next:[/]")
    console.print(f"  {where}workbench eval run reverse-text -m tiny -n 20 -r 8")
    console.print(f"  {where}workbench eval run alphabet-sort -m tiny -n 10 -r 4 -a '{{\"max_turns\": 3}}'")
    console.print(f"  {where}workbench serve tiny --port 8000")
