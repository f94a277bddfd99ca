"""Find and load environments by id.

`reverse-text`, `reverse_text` and `primeintellect/reverse-text` all name the module
`reverse_text`. Lookup order: `./environments/<name>/` (no install needed), an installed
package of that name, then the environments bundled with workbench.

A `load_environment()` that returns an environment written for `verifiers` gets it wrapped
(`verifiers_env.py`), so it runs unchanged; verifiers is imported only then. A verifiers v1
package (`<name>/<name>/__init__.py` exporting its `Taskset` through `__all__`, no
`load_environment`) is loaded through `verifiers_v1.taskset_factory`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from workbench.envs.environment import Environment
from workbench.errors import UserError
from workbench.workspace import environments_dir

# What an environment id looks like: `name` or `owner/name` (letters, digits, '-', '_', '.').
ENV_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]*/)?[A-Za-z0-9][A-Za-z0-9_.-]*$")


def not_an_env_id(env_id: str) -> str | None:
    """Why `env_id` cannot be an environment id (a path, a folder), or None when it can be."""
    text = env_id.strip()
    try:
        is_folder = Path(text).is_dir()
    except (OSError, ValueError):  # a name too long for the filesystem, a NUL byte: not a folder
        is_folder = False
    if ENV_ID.match(text) and ".." not in text and (not is_folder or "/" not in text):
        return None
    what = "a folder" if is_folder else "a path"
    return (
        f"'{shorten(text)}' is {what}, not an environment id (ids look like 'reverse-text' or "
        "'owner/name'); to use an environment from a folder: workbench env install FOLDER"
    )


def module_name(env_id: str) -> str:
    """'primeintellect/reverse-text' -> 'reverse_text'."""
    return env_id.strip().split("/")[-1].replace("-", "_")


def bundled_environments_dir() -> Path:
    """Bundled envs: inside the wheel, or the repository's environments/ for an editable install."""
    packaged = Path(__file__).resolve().parent.parent / "_bundled_environments"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "environments"


@dataclass
class EnvSource:
    name: str  # module name
    path: Path | None  # folder for local/bundled envs, None for installed packages
    origin: str  # "workspace" | "installed" | "bundled"


def _env_folders(root: Path) -> dict[str, Path]:
    """`<name>/<name>.py`, or a package `<name>/<name>/__init__.py` (verifiers v1's layout)."""
    if not root.is_dir():
        return {}
    return {
        p.name: p
        for p in sorted(root.iterdir())
        if (p / f"{p.name}.py").is_file() or (p / p.name / "__init__.py").is_file()
    }


def find_environment(env_id: str) -> EnvSource | None:
    name = module_name(env_id)
    local = _env_folders(environments_dir())
    if name in local:
        return EnvSource(name, local[name], "workspace")
    if name.isidentifier() and installed_spec(name) is not None:
        return EnvSource(name, None, "installed")
    bundled = _env_folders(bundled_environments_dir())
    if name in bundled:
        return EnvSource(name, bundled[name], "bundled")
    return None


def installed_spec(name: str) -> ModuleSpec | None:
    """The import spec of an installed module `name`, found by the import system's finders (the
    editable-install ones too). Not `importlib.util.find_spec`: that answers from sys.modules
    first, so an environment imported earlier in this process from another workspace's folder
    would pass for an installed one."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(name, None) if find is not None else None
        if spec is not None:
            return spec
    return None


def available_environments() -> list[EnvSource]:
    """Envs in the workspace and bundled ones (installed packages are found by name)."""
    found: dict[str, EnvSource] = {}
    for name, path in _env_folders(bundled_environments_dir()).items():
        found[name] = EnvSource(name, path, "bundled")
    for name, path in _env_folders(environments_dir()).items():
        found[name] = EnvSource(name, path, "workspace")
    return [found[k] for k in sorted(found)]


_imported: dict[str, tuple[Path, int, int]] = {}  # module name -> (file, mtime_ns, size) when imported


def _stamp(file: Path) -> tuple[Path, int, int]:
    try:
        st = file.stat()
    except OSError:
        return file, 0, 0
    return file, st.st_mtime_ns, st.st_size


def import_env_module(source: EnvSource) -> Any:
    """The environment's module, imported from its folder. Imported again when it comes from
    another folder, or when its file changed since (`gepa apply` rewrites an env's defaults)."""
    if source.path is not None:
        cached = sys.modules.get(source.name)
        file = Path(getattr(cached, "__file__", "") or "").resolve()
        same_folder = source.path.resolve() in (file.parent, file.parent.parent)  # module or package
        if cached is not None and same_folder and _imported.get(source.name) in (None, _stamp(file)):
            return cached
        for stale in [m for m in sys.modules if m == source.name or m.startswith(f"{source.name}.")]:
            sys.modules.pop(stale)  # a package's submodules too: they may come from another folder
        sys.path.insert(0, str(source.path))
        try:
            module = importlib.import_module(source.name)
        finally:
            sys.path.remove(str(source.path))
        _imported[source.name] = _stamp(Path(getattr(module, "__file__", "") or "").resolve())
        return module
    return importlib.import_module(source.name)


def checked_args(env_id: str, factory: Callable[..., Any], env_args: dict[str, Any]) -> dict[str, Any]:
    """`env_args` checked against the types `load_environment` declares (a number given as a
    string is read as one), so a wrong value is one line now instead of a failure mid-run."""
    from pydantic import TypeAdapter, ValidationError

    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # annotations that do not resolve: nothing to check against
        return env_args
    checked = dict(env_args)
    for name, value in env_args.items():
        if name not in hints or hints[name] is Any:
            continue
        try:
            checked[name] = TypeAdapter(hints[name]).validate_python(value)
        except ValidationError as exc:
            problem = exc.errors()[0]["msg"]
            raise UserError(
                f"environment '{env_id}': argument '{name}' = {shorten(repr(value))}: {problem}"
            ) from None
        except Exception:  # a type pydantic cannot check (a plain class): the env checks it itself
            continue
    return checked


def shorten(text: str, limit: int = 80) -> str:
    """Echo user input in an error line without letting a huge value swamp it."""
    return text if len(text) <= limit else f"{text[: limit - 15]}... ({len(text)} characters)"


def unknown_environment(env_id: str) -> str | None:
    """Why `env_id` is not found here, naming those that are; None when it is found."""
    if (problem := not_an_env_id(env_id)) is not None:
        return problem
    if find_environment(env_id) is not None:
        return None
    names = ", ".join(s.name.replace("_", "-") for s in available_environments()) or "none"
    return (
        f"unknown environment '{shorten(env_id)}' (available: {names}; "
        f"or pip install a package named '{shorten(module_name(env_id))}')"
    )


def load_environment(env_id: str, **env_args: Any) -> Environment:
    """Load an environment by id, passing `env_args` to its `load_environment`. UserError on failure."""
    source = None if not_an_env_id(env_id) else find_environment(env_id)
    if source is None:
        raise UserError(unknown_environment(env_id) or f"unknown environment '{shorten(env_id)}'")
    try:
        module = import_env_module(source)
    except ModuleNotFoundError as exc:
        if exc.name == "verifiers":
            from workbench.envs.verifiers_env import INSTALL

            raise UserError(
                f"environment '{env_id}' is written for verifiers, which is not installed: {INSTALL}"
            ) from exc
        raise UserError(f"environment '{env_id}' failed to import: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise UserError(f"environment '{env_id}' failed to import: {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, "load_environment", None)
    if factory is None:  # a verifiers v1 package exports its Taskset instead
        from workbench.envs.verifiers_v1 import taskset_factory

        factory = taskset_factory(module)
    if factory is None:
        raise UserError(f"environment '{env_id}' ({source.origin}) has no load_environment() function")
    accepted = inspect.signature(factory).parameters
    takes_any = any(p.kind == p.VAR_KEYWORD for p in accepted.values())
    unknown = [k for k in env_args if k not in accepted] if not takes_any else []
    if unknown:
        valid = ", ".join(k for k, p in accepted.items() if p.kind != p.VAR_KEYWORD) or "none"
        raise UserError(
            f"environment '{env_id}' has no argument {', '.join(repr(k) for k in unknown)} (arguments: {valid})"
        )
    env_args = checked_args(env_id, factory, env_args)
    from workbench.envs.verifiers_env import (
        is_verifiers_object,
        kept_signal_handlers,
        silence_disabled_logging,
        wrap,
    )

    silence_disabled_logging()  # the env's module has imported verifiers by now, if it uses it
    try:
        with kept_signal_handlers():  # a verifiers env installs its own on construction
            env = factory(**env_args)
    except UserError as exc:  # the environment's own one-line explanation
        raise UserError(f"environment '{env_id}' failed to load: {exc}") from exc
    except Exception as exc:
        raise UserError(f"environment '{env_id}' failed to load: {type(exc).__name__}: {exc}") from exc
    if is_verifiers_object(env):
        env = wrap(source.name.replace("_", "-"), env)
    if not isinstance(env, Environment):
        raise UserError(
            f"environment '{env_id}': load_environment() returned {type(env).__name__}, not an Environment"
        )
    env.env_id = source.name.replace("_", "-")
    return env
