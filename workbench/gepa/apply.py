"""`apply_prompt`: put an optimized system prompt where the docs say it goes — the environment's
default — so a plain `eval run ENV` (no `-a`) uses it.

The default is whatever `load_environment(system_prompt=...)` defaults to: a module constant
(`DEFAULT_SYSTEM_PROMPT = "..."`, `SYSTEM_PROMPT = (...)`) or a literal. Only that expression
is rewritten, found with `ast`, so comments, formatting and everything else in the file stay as
they were; the new file must parse and give back exactly the new prompt, else nothing is
written. Environments that are not workspace files (an installed package, the bundled ones)
are not edited: the caller prints the `-a '{"system_prompt": ...}'` form instead.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from workbench.envs.loader import find_environment
from workbench.errors import UserError
from workbench.store.files import write_text_atomic

ARG = "system_prompt"


@dataclass(frozen=True)
class Applied:
    path: Path | None  # the file rewritten; None: not a workspace file (see `reason`)
    target: str  # what was replaced: 'SYSTEM_PROMPT', or 'the default of system_prompt'
    previous: str | None  # the prompt it replaced (None when it was not a plain string)
    reason: str = ""  # why nothing was written


def env_source_file(env_id: str) -> tuple[Path | None, str]:
    """(the env's editable source file, or None with the reason)."""
    source = find_environment(env_id)
    if source is None:
        raise UserError(f"unknown environment '{env_id}'")
    if source.origin != "workspace" or source.path is None:
        return None, f"'{env_id}' is {'an installed package' if source.origin == 'installed' else 'bundled with workbench'}, not a file of this workspace"
    for path in (source.path / f"{source.name}.py", source.path / source.name / "__init__.py"):
        if path.is_file():
            return path, ""
    return None, f"no {source.name}.py in {source.path}"


def prompt_literal(prompt: str) -> str:
    """Python source for `prompt`: a triple-quoted string when it spans lines (as the docs write
    it), else a plain one; always one that evaluates back to exactly `prompt`."""
    if "\n" in prompt:
        body = prompt.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
        if body.endswith('"'):
            body = body[:-1] + '\\"'
        literal = f'"""{body}"""'
        try:
            if ast.literal_eval(literal) == prompt:
                return literal
        except (SyntaxError, ValueError):
            pass
    return repr(prompt)


def _default_node(tree: ast.Module) -> ast.expr | None:
    """The default expression of load_environment's `system_prompt` parameter."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "load_environment":
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True):
                if arg.arg == ARG:
                    return default
            for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                if arg.arg == ARG:
                    return kw_default
    return None


def _constant_value(tree: ast.Module, name: str) -> ast.expr | None:
    """The value of the last module-level `name = ...` (or `name: str = ...`)."""
    found = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            found = node.value
    return found


def _replace(source: str, node: ast.expr, text: str) -> str:
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line.encode()))
    data = source.encode()
    start = offsets[node.lineno - 1] + node.col_offset  # ast offsets are in UTF-8 bytes
    end = offsets[node.end_lineno - 1] + node.end_col_offset  # type: ignore[operator]
    return (data[:start] + text.encode() + data[end:]).decode()


def apply_prompt(env_id: str, prompt: str) -> Applied:
    """Rewrite the env's default system prompt to `prompt` (see the module doc)."""
    path, reason = env_source_file(env_id)
    if path is None:
        return Applied(None, "", None, reason)
    source = path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise UserError(f"{path}:{exc.lineno}: cannot parse the environment: {exc.msg}") from exc
    default = _default_node(tree)
    if default is None:
        return Applied(None, "", None, f"load_environment() in {path} has no `{ARG}` parameter with a default")
    target, node = f"the default of {ARG}", default
    if isinstance(default, ast.Name):
        value = _constant_value(tree, default.id)
        if value is None:
            return Applied(None, "", None, f"{default.id} (the default of {ARG}) is not assigned at the top of {path}")
        target, node = default.id, value
    try:
        previous = ast.literal_eval(node)
    except ValueError:
        previous = None
    updated = _replace(source, node, prompt_literal(prompt))
    check = ast.parse(updated)
    new_default = _default_node(check)
    new_value = _constant_value(check, target) if isinstance(default, ast.Name) else new_default
    if new_value is None or ast.literal_eval(new_value) != prompt:  # never write a file that says something else
        raise UserError(f"could not rewrite {target} in {path} safely; set it by hand")
    write_text_atomic(path, updated)
    return Applied(path, target, previous if isinstance(previous, str) else None)
