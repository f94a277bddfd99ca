"""`workbench tui` (and `workbench eval tui`): the keyboard-driven terminal UI."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workbench import startup
from workbench.errors import UserError


def tui(
    workspace: Annotated[
        Path | None,
        typer.Option(
            "--workspace",
            "-w",
            help="Workspace folder. [default: $WORKBENCH_WORKSPACE or the current directory]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Open the terminal UI: launch runs, watch them live, inspect rollouts, reward variance,
    checkpoints and GEPA results. Press ? for keys, ctrl+p for every action.

    Runs started from the UI are separate processes: quitting the UI never stops them.
    """
    import os

    from workbench.workspace import workspace_root

    root = (workspace or workspace_root()).resolve()
    if not root.is_dir():
        raise UserError(f"workspace not found: {root}")
    os.environ["WORKBENCH_WORKSPACE"] = str(root)  # the env list and children see the same workspace
    from workbench.tui.app import WorkbenchApp

    app = WorkbenchApp(root)
    startup.release()  # the command's start-up is over (workbench/startup.py)
    app.run()
