"""`apply_defaults`: put what an optimizer found where the docs say it goes — the environment's
defaults — so a plain `eval run ENV` (no `-a`) uses it: the system prompt (`apply_prompt`) and,
for DSPy runs that show demonstrations as turns, the few-shot turns.

A default is whatever `load_environment(ARG=...)` defaults to: a module constant
(`DEFAULT_SYSTEM_PROMPT = "..."`, `SYSTEM_PROMPT = (...)`) or a literal (`few_shot=None`). Only
that expression is rewritten, found with `ast`, so comments, formatting and everything else in
the file stay as they were; the new file must parse and give back exactly the new values, else
nothing is written. All or nothing: when one argument cannot be set (no such parameter), no
file is touched. Environments that are not workspace files (an installed package, the bundled
ones) are not edited: the caller prints the `-a '{"system_prompt": ...}'` form instead.
"""

from __future__ import annotations

import ast
import pprint
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.envs.loader import find_environment
from workbench.errors import UserError
from workbench.store.files import write_text_atomic

ARG = "system_prompt"
FEW_SHOT_ARG = "few_shot"
_NOT_LITERAL = object()  # the previous default was an expression, not a literal
PRETTY_WIDTH = 110  # few-shot literals wrap before this column (the repo's lines end at 130)


@dataclass(frozen=True)
class Applied:
    path: Path | None  # the file rewritten; None: not a workspace file (see `reason`)
    target: str  # what was replaced: 'SYSTEM_PROMPT', or 'the default of system_prompt'
    previous: Any  # the value it replaced (None when it was not a literal; apply_prompt: not a plain string)
    reason: str = ""  # why nothing was written
    arg: str = ARG  # the load_environment parameter whose default this is
    changed: bool = (
        True  # False: the default already was the new value, so that expression was left as it was
    )


def env_source_file(env_id: str) -> tuple[Path | None, str]:
    """(the env's editable source file, or None with the reason)."""
    source = find_environment(env_id)
    if source is None:
        raise UserError(f"unknown environment '{env_id}'")
    if source.origin != "workspace" or source.path is None:
        return (
            None,
            f"'{env_id}' is {'an installed package' if source.origin == 'installed' else 'bundled with workbench'}, not a file of this workspace",
        )
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


def value_literal(value: Any, column: int = 0) -> str:
    """Python source for `value` written at `column`: a string as `prompt_literal`, anything else
    (few-shot turns: a list of message dicts) pretty-printed, its continuation lines indented to
    `column` so it lines up in a signature. Indenting is safe: pprint never puts a raw newline
    inside a string token (it writes '\\n'), so only whitespace between tokens changes."""
    if isinstance(value, str):
        return prompt_literal(value)
    text = pprint.pformat(value, width=max(40, PRETTY_WIDTH - column), sort_dicts=False)
    return text.replace("\n", "\n" + " " * column)


def _default_node(tree: ast.Module, arg_name: str = ARG) -> ast.expr | None:
    """The default expression of load_environment's `arg_name` parameter."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "load_environment":
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            for arg, default in zip(
                positional[len(positional) - len(args.defaults) :], args.defaults, strict=True
            ):
                if arg.arg == arg_name:
                    return default
            for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                if arg.arg == arg_name:
                    return kw_default
    return None


def _constant_value(tree: ast.Module, name: str) -> ast.expr | None:
    """The value of the last module-level `name = ...` (or `name: str = ...`)."""
    found = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            found = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            found = node.value
    return found


def _offsets(source: str) -> list[int]:
    """Byte offset of each line's start (ast offsets are in UTF-8 bytes)."""
    offsets = [0]
    for line in source.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line.encode()))
    return offsets


def _span(offsets: list[int], node: ast.expr) -> tuple[int, int]:
    end_line, end_col = node.end_lineno, node.end_col_offset
    assert end_line is not None and end_col is not None  # set on every node ast.parse makes
    return (offsets[node.lineno - 1] + node.col_offset, offsets[end_line - 1] + end_col)


def _column(source: str, node: ast.expr) -> int:
    """The column, in characters, where `node` starts."""
    line = source.splitlines()[node.lineno - 1].encode()
    return len(line[: node.col_offset].decode())


def _replace(source: str, node: ast.expr, text: str) -> str:
    start, end = _span(_offsets(source), node)
    data = source.encode()
    return (data[:start] + text.encode() + data[end:]).decode()


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _NOT_LITERAL


@dataclass(frozen=True)
class _Target:
    arg: str
    name: str  # 'SYSTEM_PROMPT', or 'the default of few_shot'
    constant: str | None  # the module constant holding the default, if it is one
    node: ast.expr  # the expression to rewrite


def _find_target(tree: ast.Module, path: Path, arg: str) -> _Target | str:
    """Where `arg`'s default is written, or why it cannot be rewritten."""
    default = _default_node(tree, arg)
    if default is None:
        return f"load_environment() in {path} has no `{arg}` parameter with a default"
    if isinstance(default, ast.Name):
        value = _constant_value(tree, default.id)
        if value is None:
            return f"{default.id} (the default of {arg}) is not assigned at the top of {path}"
        return _Target(arg, default.id, default.id, value)
    return _Target(arg, f"the default of {arg}", None, default)


def _new_value(tree: ast.Module, target: _Target) -> Any:
    """`target`'s value in a re-parsed file."""
    node = _constant_value(tree, target.constant) if target.constant else _default_node(tree, target.arg)
    return _NOT_LITERAL if node is None else _literal(node)


def apply_defaults(env_id: str, values: dict[str, Any]) -> list[Applied]:
    """Rewrite the default of each of load_environment's arguments in `values` (see the module
    doc). One Applied per argument; when nothing could be written, a single one with path None
    and the reason. Defaults that already are their new value are left as they are."""
    path, reason = env_source_file(env_id)
    if path is None:
        return [Applied(None, "", None, reason)]
    source = path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise UserError(f"{path}:{exc.lineno}: cannot parse the environment: {exc.msg}") from exc
    targets = []
    for arg in values:
        found = _find_target(tree, path, arg)
        if isinstance(found, str):
            return [Applied(None, "", None, found, arg=arg)]
        targets.append(found)
    if len({(t.node.lineno, t.node.col_offset) for t in targets}) < len(
        targets
    ):  # two arguments, one constant
        raise UserError(f"{', '.join(values)} share one default in {path}; set them by hand")
    previous = {t.arg: _literal(t.node) for t in targets}
    changed = [t for t in targets if previous[t.arg] != values[t.arg]]
    updated = source
    # from the end of the file backwards, so the offsets of the nodes still to rewrite stay valid
    for target in sorted(changed, key=lambda t: (t.node.lineno, t.node.col_offset), reverse=True):
        updated = _replace(
            updated, target.node, value_literal(values[target.arg], _column(source, target.node))
        )
    if changed:
        check = ast.parse(updated)
        for target in targets:  # never write a file that says something else
            if _new_value(check, target) != values[target.arg]:
                raise UserError(f"could not rewrite {target.name} in {path} safely; set it by hand")
        write_text_atomic(path, updated)
    return [
        Applied(
            path,
            t.name,
            None if previous[t.arg] is _NOT_LITERAL else previous[t.arg],
            arg=t.arg,
            changed=t in changed,
        )
        for t in targets
    ]


def apply_prompt(env_id: str, prompt: str) -> Applied:
    """Rewrite the env's default system prompt to `prompt` (see the module doc)."""
    applied = apply_defaults(env_id, {ARG: prompt})[0]
    return Applied(
        applied.path,
        applied.target,
        applied.previous if isinstance(applied.previous, str) else None,
        applied.reason,
        applied.arg,
        applied.changed,
    )
