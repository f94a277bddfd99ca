"""The named models in the CLI: their build progress bar, and `tiny-qwen` / `smollm2-135m` made on first use.

`tiny` is built by `workbench setup`; `tiny-qwen` (a test model) and `smollm2-135m` (a real
pretrained model, fetched) are not needed by most workspaces, so `workbench setup --model NAME`
makes them — or the first command that names them (`eval run`, `gepa run`, `train`, `serve`,
which all call `ensure_embedded_model`). The command says so in one line and goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from workbench.workspace import (
    SMOLLM2_MODEL_NAME,
    TINY_QWEN_MODEL_NAME,
    endpoints_path,
    named_model_dir,
    workspace_root,
)


@contextmanager
def build_progress(label: str) -> Iterator[Callable[[int, int, float], None]]:
    """A rich progress bar (on stderr) for a model build; yields the builder's progress callback.
    Not on a terminal (a log file, a pipe): plain progress lines as it goes (`LineProgress`)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from workbench.cli.render import LineProgress, err_console

    if not err_console.is_interactive:
        lines = LineProgress(err_console, label, "steps", None, field="loss")
        try:
            yield lambda step, total, loss: lines.update(done=step, total=total, value=f"{loss:.3f}")
        finally:
            lines.close()
        return
    with Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
    ) as bar:
        task = bar.add_task(label, total=None, loss="-")

        def progress(step: int, total: int, loss: float) -> None:
            bar.update(task, completed=step, total=total, loss=f"{loss:.3f}")

        yield progress


def ensure_embedded_model(
    model: str | None, *, base_url: str | None = None, endpoints_file: str | None = None
) -> None:
    """Build tiny-qwen, or fetch smollm2-135m, into the workspace when `model` names it and it is not there yet.

    Not when a server (-b) or an endpoint of that name is meant: those serve their own model.
    A built but outdated tiny-qwen is used as it is (`workbench setup --model tiny-qwen` rebuilds).
    """
    if model not in (TINY_QWEN_MODEL_NAME, SMOLLM2_MODEL_NAME) or base_url:
        return
    root = workspace_root()
    where = named_model_dir(model, root)
    if (where / "config.json").is_file():
        return
    from workbench.inference.endpoints import load_endpoints

    registry = Path(endpoints_file) if endpoints_file else endpoints_path(root)
    if model in load_endpoints(registry):  # a missing registry is an empty one
        return
    from workbench.cli.render import err_console

    if model == SMOLLM2_MODEL_NAME:
        from workbench.bootstrap import fetch_smollm2

        err_console.print(
            f"[dim]smollm2-135m is not in this workspace yet: fetching it into {where} (once)[/]"
        )
        fetch_smollm2(root, say=lambda line: err_console.print(f"[dim]{line}[/]"))
        return
    from workbench.bootstrap import build_tiny_qwen

    err_console.print(
        f"[dim]tiny-qwen is not built yet: building it offline into {where} (once, about a minute)[/]"
    )
    with build_progress("building tiny-qwen") as progress:
        build_tiny_qwen(root, progress=progress)
