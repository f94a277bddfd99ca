"""Rows (plain dicts) from whatever an environment was given as its dataset.

Workbench datasets are lists of dicts. Environments written for verifiers pass a Hugging Face
`datasets.Dataset` (or a builder returning one); its rows are read here without importing
`datasets` (duck typing on `to_list`), so Workbench does not pay for that import itself.

A Dataset stores chat messages as Arrow structs, which gives every message of a column the union
of all messages' keys (a user message gets `tool_calls: None` if any message had tool calls);
those filler Nones are dropped so messages read back as they were written. `info` stored as a
JSON string (as verifiers allows) is decoded where an example is made (`row_info`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Protocol, TypeGuard

Row = dict[str, Any]


class RowTable(Iterable[Row], Protocol):
    """What is read of a `datasets.Dataset` (which iterates over its rows as dicts)."""

    @property
    def column_names(self) -> list[str]: ...

    def to_list(self) -> list[Row]: ...


def is_hf_dataset(data: object) -> TypeGuard[RowTable]:
    return hasattr(data, "to_list") and hasattr(data, "column_names")


def rows_of(data: Iterable[Row]) -> list[Row]:
    """The rows of a list of dicts or a `datasets.Dataset`."""
    if is_hf_dataset(data):
        return [_clean_row(row) for row in data.to_list()]
    return list(data)


def _clean_row(row: Row) -> Row:
    if isinstance(row.get("prompt"), list):
        row["prompt"] = [_clean_message(m) for m in row["prompt"]]
    return row


def _clean_message(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    return {k: v for k, v in message.items() if v is not None or k in ("role", "content")}


def row_info(row: Row) -> dict[str, Any]:
    """A row's `info` as a dict: absent or null is `{}`, a JSON string is decoded."""
    info = row.get("info")
    if info is None:
        return {}
    if isinstance(info, str):
        decoded = json.loads(info) if info.strip() else {}
        if not isinstance(decoded, dict):
            raise TypeError(f"a row's info must be a JSON object, got {type(decoded).__name__}")
        return decoded
    return dict(info)
