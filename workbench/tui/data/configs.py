"""The config editor's checks: which TOML files there are under configs/, the TOML syntax of the
text being edited (tomllib, in the TUI), and what a dry run of it said (in a child process).

A config's dry run is the command that runs it (its first line, `launcher.config_spec`) with
`--dry-run`: `workbench train CONFIG --dry-run` or `workbench gepa run CONFIG --dry-run`. The
dry run loads every environment the config names, so it never runs in the TUI's process. The
unsaved text is checked as a dot-file beside the config (`.<name>.check.toml`): paths inside a
config are relative to its folder. Messages name that file; `DryRun` names the config instead.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from workbench.tui.launcher import LaunchSpec, config_spec

RUN_FOLDERS = ("rl", "eval", "gepa", "sft")  # configs/<folder>/: what a config there runs
DRY_RUN_FLAG = "--dry-run"
NO_DRY_RUN = "No such option: --dry-run"  # click's words when a command has no dry run (eval run)
CANNOT_START = "a real run cannot start"  # the dry run's verdict on a valid config that cannot run yet


def config_files(root: Path) -> list[Path]:
    """Every TOML file under configs/ (sub-folders too), sorted by path; dot-files left out."""
    folder = root / "configs"
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.rglob("*.toml")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def check_path(path: Path, tag: str) -> Path:
    """Where the editor writes unsaved text for a dry run: a dot-file beside the config, one per
    check (`tag`), so a check being cancelled never deletes the next one's file."""
    return path.with_name(f".{path.stem}.{tag}.check.toml")


def run_spec(path: Path, root: Path) -> LaunchSpec | None:
    """The command that runs this config (`launcher.config_spec`), or None for a TOML no command
    runs: endpoints.toml, or one outside configs/{rl,eval,gepa,sft} whose first line names none."""
    if path.name == "endpoints.toml":
        return None
    try:
        spec = config_spec(path, root)
    except ValueError:  # a first line `# workbench ...` with unbalanced quotes: no command to run
        return None
    try:
        first = path.read_text(encoding="utf-8").lstrip().splitlines()[0]
    except (OSError, UnicodeDecodeError, IndexError):
        first = ""
    if not first.startswith("# workbench ") and path.parent.name not in RUN_FOLDERS:
        return None
    return spec


@dataclass(frozen=True)
class Problem:
    """One mistake, at its 1-based line when it is known."""

    message: str
    line: int | None = None


def syntax_problem(text: str) -> Problem | None:
    """The TOML syntax error of `text` (tomllib's words, at its line), or None."""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = re.search(r"\(at line (\d+)", message)
        return Problem(f"invalid TOML: {message.split(' (at')[0]}", int(match.group(1)) if match else None)
    except RecursionError:
        return Problem("invalid TOML: lists or tables nest too deeply")
    return None


def dry_run_args(spec: LaunchSpec, checked: str) -> list[str] | None:
    """The config's own command with `checked` (the check file, as the child sees it) in place of
    the config and `--dry-run` added; None for a config no command runs (endpoints.toml)."""
    if spec.kind not in ("train", "gepa", "eval"):
        return None
    args = [checked if arg.endswith(".toml") else arg for arg in spec.args]
    return [*args, DRY_RUN_FLAG]


@dataclass(frozen=True)
class DryRun:
    """What a dry run said: `verdict` is valid | cannot-start | invalid | unsupported."""

    verdict: str
    plan: str = ""  # the plan it printed, in its own words
    problems: list[Problem] = field(default_factory=list)

    @property
    def summary(self) -> str:
        return {
            "valid": "valid: a real run can start",
            "cannot-start": "valid, but a real run cannot start yet",
            "invalid": "invalid",
            "unsupported": "this command has no dry run: only the TOML syntax is checked",
        }[self.verdict]


def read_dry_run(output: str, returncode: int, checked: str, shown: str) -> DryRun:
    """The verdict of a dry run that printed `output` and exited with `returncode`; `checked` (the
    check file's name in the messages) becomes `shown` (the config's)."""
    text = output.replace(checked, shown)
    lines = [line.rstrip() for line in text.splitlines()]
    if returncode == 0:
        return DryRun("valid", "\n".join(lines).strip())
    if NO_DRY_RUN in text:
        return DryRun("unsupported")
    errors = [line.removeprefix("error:").strip() for line in lines if line.startswith("error:")]
    problems = [Problem(_without_place(e, shown), error_line(e, shown)) for e in errors] or [
        Problem(next((line for line in reversed(lines) if line.strip()), f"exited with code {returncode}"))
    ]
    plan = "\n".join(line for line in lines if not line.startswith("error:")).strip()
    if any(CANNOT_START in problem.message for problem in problems):
        return DryRun("cannot-start", plan, problems)
    return DryRun("invalid", plan, problems)


def error_line(message: str, shown: str) -> int | None:
    """The line a message points at in the config: `CONFIG:LINE: ...` (the config loader's way)."""
    match = re.search(rf"{re.escape(shown)}:(\d+)", message)
    return int(match.group(1)) if match else None


def _without_place(message: str, shown: str) -> str:
    """The message without its leading `CONFIG:LINE:` (the pane names the line itself)."""
    return re.sub(rf"^{re.escape(shown)}(:\d+)?:\s*", "", message)
