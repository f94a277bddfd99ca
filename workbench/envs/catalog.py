"""What environments are there, and what are they? Backs `workbench env list` (and the TUI).

An environment is described without loading its data: its module is imported (that is all
`load_environment` needs to be found) and read for the first docstring line, the kind of
environment `load_environment` is annotated to return, and its arguments with defaults. An
environment that fails to import is still listed, with the error as its description.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import re
import typing
from dataclasses import dataclass, field
from typing import Any

from workbench.envs.environment import Environment
from workbench.envs.loader import EnvSource, available_environments, import_env_module

# Checked in MRO order, so a WordleEnv(MultiTurnEnv) is a MultiTurnEnv.
KINDS = ("EnvGroup", "ToolEnv", "SingleTurnEnv", "MultiTurnEnv")
_ENV_PACKAGE_REQUIRES = re.compile(
    r"^\s*(workbench|verifiers)\s*($|[\s;\[<>=!~(])"
)  # env packages depend on one


@dataclass
class EnvInfo:
    env_id: str  # dashed form: reverse-text
    origin: str  # workspace | bundled | installed
    kind: str = "?"
    description: str = ""
    arguments: dict[str, Any] = field(
        default_factory=dict
    )  # name -> default (inspect.Parameter.empty if none)
    error: str | None = None
    location: str = ""


def installed_environments(exclude: set[str]) -> list[EnvSource]:
    """Installed distributions that depend on workbench or verifiers and whose module (the distribution
    name with '_' for '-') can be imported — env packages as `workbench env init` and the
    Environments Hub make them."""
    found: dict[str, EnvSource] = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("-", "_").replace(".", "_")
        if not name or name in exclude or name in found or name == "workbench":
            continue
        if not any(_ENV_PACKAGE_REQUIRES.match(req) for req in dist.requires or []):
            continue
        if name.isidentifier() and importlib.util.find_spec(name) is not None:
            found[name] = EnvSource(name, None, "installed")
    return [found[k] for k in sorted(found)]


def list_environments() -> list[EnvSource]:
    """Workspace, installed and bundled environments; each shadows the next, as in loading."""
    local = available_environments()
    installed = installed_environments({s.name for s in local if s.origin == "workspace"})
    shadowed = {s.name for s in installed}
    return sorted([s for s in local if s.name not in shadowed] + installed, key=lambda s: s.name)


def env_kind(factory: Any) -> str:
    """The environment class `load_environment` is annotated to return, as one of `KINDS`."""
    try:
        returned = typing.get_type_hints(factory).get("return")
    except Exception:  # unresolvable annotation: the kind is unknown, the env still works
        return "?"
    if isinstance(returned, type) and issubclass(returned, Environment):
        for cls in returned.__mro__:
            if cls.__name__ in KINDS and cls.__module__.startswith("workbench.envs"):
                return cls.__name__
        return "Environment"
    return "?"


def describe(source: EnvSource) -> EnvInfo:
    info = EnvInfo(
        env_id=source.name.replace("_", "-"),
        origin=source.origin,
        location=str(source.path) if source.path else "",
    )
    try:
        module = import_env_module(source)
    except Exception as exc:  # a broken env must not break the listing
        info.error = f"import failed: {type(exc).__name__}: {exc}"
        return info
    info.location = info.location or str(getattr(module, "__file__", "") or "")
    info.description = _first_line(inspect.getdoc(module) or "", source.name)
    factory = getattr(module, "load_environment", None)
    if factory is None:
        info.error = "no load_environment() function"
        return info
    info.kind = env_kind(factory)
    info.arguments = {
        name: p.default
        for name, p in inspect.signature(factory).parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    return info


def _first_line(doc: str, module_name: str) -> str:
    """The docstring's first line, without a leading 'env-name:' (the listing shows the name)."""
    line = doc.strip().splitlines()[0] if doc.strip() else ""
    for prefix in (module_name, module_name.replace("_", "-")):
        if line.lower().startswith(prefix + ":"):
            line = line[len(prefix) + 1 :].strip()
    return line
