"""The TUI's structure, checked on its source: screens are registered by name in the app and
open each other by that name — no screen module imports another screen module (the shared
`base` aside) or the app, and widgets import neither screens nor the app."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from textual.screen import Screen

import workbench.tui
from workbench.tui.app import LazyScreen, WorkbenchApp

TUI = Path(workbench.tui.__file__).parent
SCREENS_PACKAGE = "workbench.tui.screens"
SHARED = {f"{SCREENS_PACKAGE}.base"}  # what every screen may import


def module_name(path: Path) -> str:
    parts = path.relative_to(TUI.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (functions and TYPE_CHECKING blocks too);
    `from package import name` counts as importing `package.name` as well."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if (
                name in ("import_module", "__import__")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found.add(str(node.args[0].value))
    return found


def forbidden_for_screen(module: str, imported: str) -> bool:
    if imported == "workbench.tui.app" or imported.startswith("workbench.tui.app."):
        return True
    if imported.startswith(f"{SCREENS_PACKAGE}."):
        target = ".".join(imported.split(".")[:4])  # the screen module, not a name inside it
        return target != module and target not in SHARED
    return False


SCREEN_FILES = sorted((TUI / "screens").glob("*.py"))
WIDGET_FILES = sorted((TUI / "widgets").glob("*.py"))


def test_the_checks_see_the_screens():
    assert {p.stem for p in SCREEN_FILES} >= {
        "base",
        "runs",
        "rollouts",
        "monitor",
        "variance",
        "checkpoints",
    }
    assert "workbench.tui.app" in imported_modules(Path(__file__))  # the import finder works
    assert forbidden_for_screen("workbench.tui.screens.runs", "workbench.tui.screens.rollouts.RolloutsScreen")
    assert not forbidden_for_screen(
        "workbench.tui.screens.runs", "workbench.tui.screens.base.WorkbenchScreen"
    )


@pytest.mark.parametrize("path", SCREEN_FILES, ids=lambda p: p.name)
def test_no_screen_imports_another_screen_or_the_app(path: Path):
    module = module_name(path)
    bad = sorted(m for m in imported_modules(path) if forbidden_for_screen(module, m))
    assert not bad, f"{path.name} imports {bad}: open screens by name (WorkbenchScreen.open) instead"


@pytest.mark.parametrize("path", WIDGET_FILES, ids=lambda p: p.name)
def test_widgets_import_no_screen_and_not_the_app(path: Path):
    bad = sorted(
        m
        for m in imported_modules(path)
        if m == SCREENS_PACKAGE or m.startswith(f"{SCREENS_PACKAGE}.") or m.startswith("workbench.tui.app")
    )
    assert not bad, f"{path.name} imports {bad}: widgets post messages up and get attributes down"


def test_every_registered_name_builds_a_screen_and_every_screen_is_registered():
    registered = {}
    for name, factory in WorkbenchApp.SCREEN_FACTORIES.items():
        cls = factory.load() if isinstance(factory, LazyScreen) else factory
        assert isinstance(cls, type) and issubclass(cls, Screen), name
        registered[name] = cls
    from workbench.tui.screens.base import WorkbenchScreen

    for path in SCREEN_FILES:
        __import__(module_name(path))
    screens = {cls for cls in _subclasses(WorkbenchScreen) if cls.__module__.startswith(SCREENS_PACKAGE)}
    assert screens <= set(registered.values()), f"unregistered screens: {screens - set(registered.values())}"


def test_screens_open_only_registered_names():
    names = set(WorkbenchApp.SCREEN_FACTORIES)
    opened: set[str] = set()
    for path in SCREEN_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.args
                and (
                    node.func.attr == "open_screen"
                    or (
                        node.func.attr == "open"
                        and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "self"
                    )
                )
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                opened.add(node.args[0].value)
    assert opened, "no screen opens another by name"
    assert opened <= names, f"unknown screen names: {opened - names}"


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found
