"""Load TOML into pydantic models; every mistake becomes one `UserError` line that names the
file, the line and the key, with the closest valid key for typos:

    configs/eval/rt.toml:3: unknown key 'num_exmples' (did you mean 'num_examples'?)
"""

from __future__ import annotations

import difflib
import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from workbench.config.bounds import MAX_NESTING, too_deep
from workbench.errors import UserError

M = TypeVar("M", bound=BaseModel)


def read_toml(path: Path) -> tuple[dict[str, Any], str]:
    """The parsed table and the raw text (for line lookups). Syntax errors name file and line."""
    if path.is_dir():
        raise UserError(f"{path} is a folder, not a config file (give the .toml inside it)")
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        bad_line = raw[: exc.start].count(b"\n") + 1
        raise UserError(
            f"{path}:{bad_line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); TOML files are UTF-8"
        ) from None
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise UserError(f"{path}: lists or tables nest too deeply (at most {MAX_NESTING} levels)") from None
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        line = f":{match.group(1)}" if match else ""
        raise UserError(f"{path}{line}: invalid TOML: {str(exc).split(' (at')[0]}") from exc
    if too_deep(data):
        raise UserError(f"{path}: lists or tables nest too deeply (at most {MAX_NESTING} levels)")
    return data, text


def key_line(text: str, key: str, after_line: int = 0, before_line: int | None = None) -> int | None:
    """1-based line where `key` is assigned (bare or quoted, dotted, or in an inline table) or its
    [table] opens, among the lines `after_line` to `before_line` (0-based, end excluded).
    tomllib reports no positions, so every file:line message of the TOML configs comes from here."""
    name = rf"""(?:{re.escape(key)}|"{re.escape(key)}"|'{re.escape(key)}')"""
    pattern = re.compile(rf"^\s*(?:\[+\s*)?(?:[\w.-]+\.)?{name}\s*(?:=|\]|\.)")
    inline = re.compile(rf"[{{,]\s*{name}\s*=")
    lines = text.splitlines()
    for i in range(after_line, min(len(lines), len(lines) if before_line is None else before_line)):
        if pattern.search(lines[i]) or inline.search(lines[i]):
            return i + 1
    return None


def closest(key: str, valid: list[str]) -> str | None:
    match = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    return match[0] if match else None


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the last element of `loc` (for suggestions)."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = (
            current.model_fields.get(part)
            if isinstance(current, type) and issubclass(current, BaseModel)
            else None
        )
        if field is None:
            return None
        annotation = field.annotation
        for candidate in (annotation, *getattr(annotation, "__args__", ())):
            inner = getattr(candidate, "__args__", (candidate,))
            found = next(
                (c for c in (candidate, *inner) if isinstance(c, type) and issubclass(c, BaseModel)), None
            )
            if found is not None:
                current = found
                break
        else:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def format_validation_error(exc: ValidationError, model: type[BaseModel], path: Path, text: str) -> str:
    """The first error of `exc` as one line: file:line: what is wrong with which key."""
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    key = str(next((p for p in reversed(loc) if isinstance(p, str)), "?"))
    dotted = ".".join(str(p) for p in loc)
    line = key_line(text, key)
    where = f"{path}:{line}" if line else str(path)
    if err["type"] == "extra_forbidden":
        owner = _model_at(model, loc)
        valid = list(owner.model_fields) if owner else []
        hint = closest(key, valid)
        suggestion = f" (did you mean '{hint}'?)" if hint else ""
        return f"{where}: unknown key '{dotted}'{suggestion}"
    if err["type"] == "missing":
        return f"{path}: missing required key '{dotted}'"
    message = err["msg"].removeprefix("Value error, ")
    return f"{where}: key '{dotted}': {message}"


def validate(model: type[M], data: dict[str, Any], path: Path, text: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, model, path, text)) from exc


def load_config(model: type[M], path: Path) -> M:
    data, text = read_toml(path)
    return validate(model, data, path, text)
