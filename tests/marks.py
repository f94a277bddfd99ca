"""Which cases of a parametrized test run by default: the rest are `extended` (run with -m '').

A breadth test (the same path over every fixture environment, every parallel strategy) keeps a
few representative cases in the default run, so the suite stays within its time budget while
`python -m pytest -m ''` still covers every case."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest


def by_default(cases: Iterable[Any], keep: Sequence[Any], key: int | None = None) -> list[Any]:
    """`cases` with those not in `keep` marked extended; `key` picks the tuple item to match on."""
    return [
        case
        if (case[key] if key is not None else case) in keep
        else pytest.param(*(case if key is not None else (case,)), marks=pytest.mark.extended)
        for case in cases
    ]
