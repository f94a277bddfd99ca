"""The layer diagram of DESIGN §2, enforced: imports point down the layers only, and no service
imports another. Every import counts, also those inside functions (they are how heavy modules
load lazily, and they couple modules all the same)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"

# Top to bottom. A module may import its own layer and any layer below it.
LAYERS: list[tuple[str, set[str]]] = [
    ("front ends", {"cli", "tui", "__main__"}),
    ("services", {"train", "gepa", "evaluate", "bootstrap"}),
    ("engine", {"engine"}),
    ("environments and inference", {"envs", "inference", "models"}),
    (
        "foundation",
        {"store", "config", "types", "errors", "events", "workspace", "startup", "__init__"},
    ),
]
SERVICES = {"train", "gepa", "evaluate", "bootstrap"}
# The TUI starts runs as child `workbench ...` processes and reads their files (DESIGN §10): a
# crash or OOM in a run never takes the UI down, so it calls no service in-process.
READS_FILES_ONLY = {"tui"}


def layer_of(part: str) -> int:
    for index, (_, parts) in enumerate(LAYERS):
        if part in parts:
            return index
    raise AssertionError(f"workbench.{part} is in no layer: add it to LAYERS (and to DESIGN §2)")


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path) -> set[str]:
    """Every workbench module `path` imports, resolved (relative imports included)."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.add(name)
            # `from workbench import train` imports the module workbench.train
            found.update(
                f"{name}.{alias.name}"
                for alias in node.names
                if (root.parent / f"{name}.{alias.name}".replace(".", "/")).exists()
            )
    return {name for name in found if name == "workbench" or name.startswith("workbench.")}


def top_part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def violations(root: Path = PACKAGE) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*.py")):
        source = module_name(path, root)
        here = top_part(source) if path.name != "__main__.py" else "__main__"
        for target in sorted(imports_of(path, root)):
            there = top_part(target)
            if there == here:
                continue
            if layer_of(there) < layer_of(here):
                problems.append(
                    f"{source} imports {target}: up from {LAYERS[layer_of(here)][0]} "
                    f"to {LAYERS[layer_of(there)][0]}"
                )
            elif here in SERVICES and there in SERVICES:
                problems.append(f"{source} imports {target}: one service imports another")
            elif here in READS_FILES_ONLY and there in SERVICES:
                problems.append(f"{source} imports {target}: the TUI runs services as child processes only")
    return problems


def test_imports_point_down_the_layers():
    assert violations() == []


def test_the_checker_sees_an_upward_import(tmp_path: Path):
    """The rule itself can fail: a foundation module importing a service (even lazily, inside a
    function) and one service importing another (relatively) are both reported."""
    fake = tmp_path / "workbench"
    for folder in ("store", "train", "gepa"):
        (fake / folder).mkdir(parents=True)
        (fake / folder / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "store" / "runs.py").write_text("def f():\n    from workbench.train import loop\n")
    (fake / "train" / "loop.py").write_text("from ..gepa import service\n")
    (fake / "gepa" / "service.py").write_text("")
    found = violations(fake)
    assert any(line.startswith("workbench.store.runs imports workbench.train") for line in found), found
    assert any(
        line.startswith("workbench.train.loop imports workbench.gepa")
        and "one service imports another" in line
        for line in found
    ), found
