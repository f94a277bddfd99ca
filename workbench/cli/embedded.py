"""The embedded models in the CLI: their build progress bar, and `tiny-qwen` built on first use.

`tiny` is built by `workbench setup`; `tiny-qwen` is a test model that most workspaces never
need, so `workbench setup --model tiny-qwen` builds it — or the first command that names it
(`eval run`, `gepa run`, `train`, `serve`, which all call `ensure_embedded_model`). It builds
offline in about a minute, so the command says so in one line and goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from workbench.workspace import TINY_QWEN_MODEL_NAME, endpoints_path, tiny_qwen_model_dir, workspace_root


@contextmanager
def build_progress(label: str) -> Iterator[Callable[[int, int, float], None]]:
    """A rich progress bar (on stderr) for a model build; yields the builder's progress callback.
    Not on a terminal (a log file, a pipe): plain progress lines as it goes (`LineProgress`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from workbench.cli.render import LineProgress, err_console

    if not err_console.is_interactive:
        lines = LineProgress(err_console, label, "steps", None, field="loss")
        try:
            yield lambda step, total, loss: lines.update(done=step, total=total, value=f"{loss:.3f}")
        finally:
            lines.close()
        return
    with Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=err_console) as bar:
        task = bar.add_task(label, total=None, loss="-")

        def progress(step: int, total: int, loss: float) -> None:
            bar.update(task, completed=step, total=total, loss=f"{loss:.3f}")

        yield progress


def ensure_embedded_model(model: str | None, *, base_url: str | None = None, endpoints_file: str | None = None) -> None:
    """Build tiny-qwen into the workspace when `model` names it and it is not built yet.

    Not when a server (-b) or an endpoint of that name is meant: those serve their own model.
    A built but outdated tiny-qwen is used as it is (`workbench setup --model tiny-qwen` rebuilds).
    """
    if model != TINY_QWEN_MODEL_NAME or base_url:
        return
    root = workspace_root()
    if (tiny_qwen_model_dir(root) / "config.json").is_file():
        return
    from workbench.inference.endpoints import load_endpoints

    registry = Path(endpoints_file) if endpoints_file else endpoints_path(root)
    if model in load_endpoints(registry):  # a missing registry is an empty one
        return
    from workbench.bootstrap import build_tiny_qwen
    from workbench.cli.render import err_console

    where = tiny_qwen_model_dir(root)
    err_console.print(f"[dim]tiny-qwen is not built yet: building it offline into {where} (once, about a minute)[/]")
    with build_progress("building tiny-qwen") as progress:
        build_tiny_qwen(root, progress=progress)
