"""`workbench env list|init|install`: see the environments there are, start a new one, install one."""

from __future__ import annotations

import inspect
import json
from typing import Annotated, Any

import typer

from workbench.errors import UserError

app = typer.Typer(
    help="Environments: list them, create one from a template, install one with pip.\n\n"
    "An environment is a folder environments/<name>/ with <name>.py exposing load_environment(), "
    "a pyproject.toml and a README. It runs from ./environments without installing.",
    no_args_is_help=True,
)


def _short(value: Any, width: int = 24) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _arguments(arguments: dict[str, Any]) -> str:
    return "\n".join(
        name if default is inspect.Parameter.empty else f"{name}={_short(default)}"
        for name, default in arguments.items()
    )


@app.command("list")
def list_(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON (one object per environment) instead of a table.")
    ] = False,
) -> None:
    """List environments: this workspace's environments/, the bundled ones and installed env packages.

    For each: its id (what `workbench eval run ID` takes), its kind (SingleTurnEnv, MultiTurnEnv, ToolEnv, EnvGroup), where it comes from (workspace, bundled, installed), the first line of its docstring, and the arguments of its load_environment() with their defaults.

    Pass arguments with -a: workbench eval run wordle -m tiny -a '{"max_turns": 4}'

    A workspace environment shadows a bundled or installed one of the same name.
    """
    from rich.table import Table

    from workbench.cli.render import console
    from workbench.envs.catalog import describe, list_environments

    infos = [describe(source) for source in list_environments()]
    if as_json:
        rows = [
            {
                "id": i.env_id,
                "kind": i.kind,
                "origin": i.origin,
                "description": i.error or i.description,
                "arguments": {
                    k: (None if v is inspect.Parameter.empty else v) for k, v in i.arguments.items()
                },
                "location": i.location,
                "error": i.error,
            }
            for i in infos
        ]
        print(json.dumps(rows, indent=2, default=repr))
        return
    if not infos:
        console.print("no environments found: create one with `workbench env init NAME`")
        return
    table = Table(title="environments", show_lines=True)
    for column in ("id", "kind", "origin"):
        table.add_column(column, no_wrap=True)
    table.add_column("description", ratio=1, min_width=20)
    table.add_column("arguments", overflow="fold")
    for i in infos:
        description = f"[red]{i.error}[/]" if i.error else i.description
        table.add_row(i.env_id, i.kind, i.origin, description, _arguments(i.arguments))
    console.print(table)


@app.command("init")
def init(
    name: Annotated[
        str,
        typer.Argument(
            help="The new environment's id, e.g. my-env (folder environments/my_env).", show_default=False
        ),
    ],
) -> None:
    """Create environments/<name>/ from a working template: a single-turn env with a reward and a test.

    Writes pyproject.toml, <name>.py (load_environment, dataset, reward function), README.md and tests/test_<name>.py. Edit the data and the reward, then:

      python -m pytest environments/my_env

      workbench eval run my-env -m tiny -n 5 -r 3

    Never overwrites: an existing folder is an error.
    """
    from workbench.cli.render import console
    from workbench.envs.templates import create_environment
    from workbench.workspace import environments_dir, workspace_root

    files = create_environment(name, environments_dir())
    root = workspace_root()
    for path in files:
        console.print(f"  [green]created[/] {path.relative_to(root)}")
    folder = files[0].parent.relative_to(root)
    env_id = files[0].parent.name.replace("_", "-")
    console.print("\n[bold]Next:[/]")
    console.print(f"  python -m pytest {folder}")
    console.print(f"  workbench eval run {env_id} -m tiny -n 5 -r 3")


@app.command("install")
def install(
    target: Annotated[
        str,
        typer.Argument(
            help="An environment id in ./environments (my-env), a folder with a pyproject.toml, "
            "a .whl file, or an Environments Hub id (owner/name or owner/name@version).",
            show_default=False,
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the pip command instead of running it.")
    ] = False,
) -> None:
    """Install an environment package with pip: a local folder (editable), a wheel, or one from the Environments Hub.

    Optional for local environments: workbench finds ./environments by itself. An installed environment loads from any folder, and pip installs the dependencies in its pyproject.toml. Environments written for verifiers need `pip install 'workbench[verifiers]'`. Uses the pip of the Python that runs workbench.

      workbench env install my-env                     # pip install -e environments/my_env

      workbench env install dist/my_env-0.1.0-py3-none-any.whl

      workbench env install primeintellect/reverse-text@0.1.4   # as prime env install does

    A hub id needs the hub to be reachable ($WORKBENCH_HUB_URL points at a mirror).
    """
    import shlex
    import subprocess

    from workbench.cli.render import console
    from workbench.envs.install import plan_install
    from workbench.workspace import environments_dir

    plan = plan_install(target, environments_dir())
    if dry_run:
        print(shlex.join(plan.command))
        return
    console.print(f"[dim]$ {shlex.join(plan.command)}[/]")
    result = subprocess.run(plan.command, check=False)
    if result.returncode != 0:
        raise UserError(
            f"pip install of {target} failed with exit code {result.returncode} (its output is above)"
        )
    console.print(f"[green]installed[/] {plan.what}")
