"""The package `workbench env init NAME` writes: a working single-turn environment with a test.

The `.tmpl` files beside this module are the template; `{{env_id}}` (my-env), `{{module}}`
(my_env) and `{{class_name}}` (MyEnv) are filled in. They are not `.py` files so that neither
Python nor pytest ever imports the template itself.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from workbench.envs.loader import installed_spec
from workbench.errors import UserError

TEMPLATES = Path(__file__).resolve().parent
_NAME = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$")


def module_for(name: str) -> str:
    """Check a new environment's name and return its module name ('my-env' -> 'my_env')."""
    if not _NAME.match(name):
        raise UserError(
            f"'{name}' is not a valid environment name: use lowercase letters, digits and single "
            "'-' or '_' between them, starting with a letter (e.g. my-env)"
        )
    module = name.replace("-", "_")
    if keyword.iskeyword(module):
        raise UserError(f"'{name}' is a Python keyword; pick another name")
    # e.g. 'json', 'workbench': the env would shadow it. Asked of the import system's finders, not
    # sys.modules, so an environment this process imported earlier from a workspace is not one.
    if installed_spec(module) is not None:
        raise UserError(f"'{module}' is already the name of an importable Python module; pick another name")
    return module


def render(template: str, env_id: str, module: str) -> str:
    class_name = "".join(part.capitalize() for part in module.split("_"))
    return (
        template.replace("{{env_id}}", env_id)
        .replace("{{module}}", module)
        .replace("{{class_name}}", class_name)
    )


def create_environment(name: str, environments: Path) -> list[Path]:
    """Write environments/<module>/ from the template; returns the files. Never overwrites."""
    module = module_for(name)
    env_id = module.replace("_", "-")
    folder = environments / module
    if folder.exists():
        raise UserError(f"{folder} already exists; pick another name, or delete that folder first")
    files = {
        folder / "pyproject.toml": "pyproject.toml.tmpl",
        folder / f"{module}.py": "env.py.tmpl",
        folder / "README.md": "README.md.tmpl",
        folder / "tests" / f"test_{module}.py": "test_env.py.tmpl",
    }
    for path, template in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            render((TEMPLATES / template).read_text(encoding="utf-8"), env_id, module), encoding="utf-8"
        )
    return list(files)
