"""`workbench` entry point: registers the commands and turns user errors into one line + exit 1.

Command modules import their services lazily, so `workbench --help` never loads torch.
An unexpected exception (a bug) is one line too, naming a file that holds its traceback;
`WORKBENCH_TRACEBACK=1` lets it through instead, for debugging.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import NoReturn

import typer

from workbench.cli import env_cmd, eval_cmd, gepa_cmd, serve_cmd, setup_cmd, train_cmd, tui_cmd
from workbench.cli.crash import crash_report, summary
from workbench.errors import QuietExit, UserError, redact_credentials
from workbench.startup import hold as hold_collector
from workbench.startup import quiet_libraries
from workbench.store.files import is_storage_error

app = typer.Typer(
    name="workbench",
    help="Build LLM environments, then evaluate, RL-train and prompt-optimize models on them.\n\n"
    "Start with `workbench setup`, then `workbench eval run reverse-text -m tiny`.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)
app.command("setup")(setup_cmd.setup)
app.add_typer(eval_cmd.app, name="eval")
app.add_typer(env_cmd.app, name="env")
app.command("serve")(serve_cmd.serve)
app.add_typer(train_cmd.app, name="train")
app.command("tui")(tui_cmd.tui)
app.add_typer(gepa_cmd.app, name="gepa")

# `prime lab setup` users type `workbench lab setup`: the same command under prime's spelling.
lab = typer.Typer(help="prime's spelling: `workbench lab setup` is `workbench setup`.", no_args_is_help=True)
lab.command("setup", help="The same as `workbench setup`: " + (setup_cmd.setup.__doc__ or "").split("\n")[0])(
    setup_cmd.setup
)
app.add_typer(lab, name="lab")


def main() -> None:
    """The `workbench` command (the console script and `python -m workbench`)."""
    hold_collector()  # until the command's start-up (its imports, its model) is done: startup.py
    run(sys.argv[1:])


def run(args: Sequence[str], prog_name: str | None = None) -> NoReturn:
    """Run the command line `args` in this process and exit (SystemExit) with its code: a user
    error is one line and 1, Ctrl-C 130, a bug one line naming its traceback's file. The tests
    call it in-process (tests/cli.py), without `main`'s start-up collector hold."""
    quiet_libraries()
    try:
        app(args=list(args), prog_name=prog_name)
    except UserError as exc:
        print(f"error: {redact_credentials(str(exc))}", file=sys.stderr)
        sys.exit(1)
    except OSError as exc:
        if not is_storage_error(exc):  # the machine's doing (a full disk), not a bug: one plain line
            _bug(exc, args)
        where = f": {exc.filename}" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        sys.exit(1)
    except QuietExit as exc:
        sys.exit(exc.code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        _bug(exc, args)
    sys.exit(0)  # not reached: the app exits with the command's code


def _bug(exc: Exception, args: Sequence[str]) -> NoReturn:
    """An exception nobody expected: its traceback to a file, one line naming it, exit 1."""
    if os.environ.get("WORKBENCH_TRACEBACK"):
        raise exc
    report = crash_report((type(exc), exc, exc.__traceback__), f"workbench {' '.join(args)}")
    print(
        f"error: unexpected {redact_credentials(summary(exc))} (a Workbench bug; traceback in {report})",
        file=sys.stderr,
    )
    sys.exit(1)
