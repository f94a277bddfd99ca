"""What `workbench env install TARGET` runs: one pip command for a folder, a wheel or a hub id.

- a folder with a pyproject.toml (or an env id in ./environments): `pip install -e FOLDER`, so
  edits apply without reinstalling;
- a wheel file (`*.whl`, e.g. one downloaded from the Environments Hub): `pip install WHEEL`;
- `owner/name[@version]`: the Environments Hub's package index for that owner, as
  `prime env install` uses it (`pip install NAME[==VERSION] --extra-index-url HUB/OWNER/simple/`).
  The index is probed first, so an unreachable hub or an unknown environment is one line, not
  pip's screenful. `$WORKBENCH_HUB_URL` points at another hub (a mirror, a test server).

pip runs from the Python that runs Workbench, so the package lands where Workbench finds it.
"""

from __future__ import annotations

import os
import re
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from workbench.envs.loader import module_name
from workbench.errors import UserError

HUB_URL = "https://hub.primeintellect.ai"
HUB_ID = re.compile(
    r"^(?P<owner>[A-Za-z0-9][\w.-]*)/(?P<name>[A-Za-z0-9][\w.-]*)(?:@(?P<version>[\w.+!-]+))?$"
)
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class InstallPlan:
    command: list[str]
    what: str  # for the closing line: "reverse-text (editable, from /path)"


def plan_install(target: str, environments: Path) -> InstallPlan:
    """The pip command that installs `target`; a UserError (one line) when there is none."""
    pip = [sys.executable, "-m", "pip", "install"]
    given = Path(target).expanduser()
    if given.suffix == ".whl":
        if not given.is_file():
            raise UserError(f"no wheel file {given}")
        return InstallPlan(
            [*pip, str(given.resolve())], f"{given.name.split('-')[0].replace('_', '-')} (from {given.name})"
        )
    if given.is_dir():
        return _folder_plan(pip, given.resolve())
    hub = HUB_ID.match(target)
    if hub is not None:
        return _hub_plan(pip, hub["owner"], hub["name"], hub["version"])
    folder = environments / module_name(target)
    if not folder.is_dir():
        raise UserError(
            f"no environment folder {folder}: create one with `workbench env init {target}`, give the "
            "path of a folder with a pyproject.toml or of a .whl file, or a hub id (owner/name)"
        )
    return _folder_plan(pip, folder)


def _folder_plan(pip: list[str], folder: Path) -> InstallPlan:
    if not (folder / "pyproject.toml").is_file():
        raise UserError(f"{folder} has no pyproject.toml, so pip cannot install it")
    return InstallPlan(
        [*pip, "-e", str(folder)], f"{folder.name.replace('_', '-')} (editable, from {folder})"
    )


def hub_index(owner: str) -> str:
    return f"{os.environ.get('WORKBENCH_HUB_URL', HUB_URL).rstrip('/')}/{owner}/simple/"


def _hub_plan(pip: list[str], owner: str, name: str, version: str | None) -> InstallPlan:
    index = hub_index(owner)
    probe = f"{index}{name.lower().replace('_', '-')}/"
    try:
        with urllib.request.urlopen(probe, timeout=PROBE_TIMEOUT_S) as response:
            response.read(1)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise UserError(
                f"'{owner}/{name}' is not on the Environments Hub ({probe} answered 404)"
            ) from None
        raise UserError(f"the Environments Hub answered {exc.code} for {probe}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(
            f"cannot reach the Environments Hub at {index} ({reason}); install from a folder or a "
            ".whl file instead: workbench env install PATH"
        ) from None
    requirement = f"{name}=={version}" if version else name
    return InstallPlan(
        [*pip, requirement, "--extra-index-url", index],
        f"{owner}/{name}{'@' + version if version else ''} (from {index})",
    )
