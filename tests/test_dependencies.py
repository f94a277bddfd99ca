"""Every library workbench/ imports is declared in pyproject.toml: a core dependency, or an extra
for the features that import it lazily. A clean install then has what the code needs, and an
undeclared import (one that works here only because something else pulled it in) fails here."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Imported only inside a guard or a feature that an extra brings, never on a core path.
OPTIONAL = {
    "datasets": "guarded by `except ImportError`: gsm8k's from_hub, verifiers' data helpers",
    "openai": "verifiers adapter (the verifiers extra brings it) and type hints only",
    "tqdm": "silenced inside DSPy's optimizers (the dspy extra brings it)",
}


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[;@ ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def imported_modules() -> dict[str, str]:
    """Top-level third-party modules imported anywhere in workbench/, with one file that does."""
    found: dict[str, str] = {}
    for path in sorted((REPO / "workbench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("workbench", "__future__"):
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


def test_every_imported_library_is_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = requirement_names(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        declared |= requirement_names(extra)
    distributions = packages_distributions()
    undeclared = {
        module: where
        for module, where in imported_modules().items()
        if module not in OPTIONAL
        and not {d.lower().replace("_", "-") for d in distributions.get(module, [module])} & declared
    }
    assert not undeclared, f"imported but not in pyproject.toml: {undeclared}"


def test_wordfreq_is_no_dependency():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "wordfreq" not in requirement_names(project["dependencies"])
    assert "wordfreq" not in imported_modules()
