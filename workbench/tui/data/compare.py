"""Compare two eval runs example by example: mean reward in each, the difference, and which
examples *flipped* (solved in one run and not in the other; solved = group mean >= 0.5, so a
binary reward means "most rollouts passed")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workbench.types import Group

SOLVED = 0.5


@dataclass
class ExampleDiff:
    example_id: int
    a: float | None  # group mean in run A (None: example not in A)
    b: float | None

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def flip(self) -> str:
        """'fixed' (A failed, B solved), 'broke' (A solved, B failed) or ''."""
        if self.a is None or self.b is None:
            return ""
        if self.a < SOLVED <= self.b:
            return "fixed"
        if self.b < SOLVED <= self.a:
            return "broke"
        return ""


@dataclass
class Comparison:
    rows: list[ExampleDiff]

    def _means(self, side: str) -> float | None:
        values = [getattr(r, side) for r in self.rows if r.a is not None and r.b is not None]
        return sum(values) / len(values) if values else None

    @property
    def mean_a(self) -> float | None:
        """Mean over the examples both runs have (so the two numbers are comparable)."""
        return self._means("a")

    @property
    def mean_b(self) -> float | None:
        return self._means("b")

    @property
    def shared(self) -> int:
        return sum(r.a is not None and r.b is not None for r in self.rows)

    def count(self, flip: str) -> int:
        return sum(r.flip == flip for r in self.rows)

    @property
    def better(self) -> int:
        return sum((r.delta or 0) > 1e-9 for r in self.rows)

    @property
    def worse(self) -> int:
        return sum((r.delta or 0) < -1e-9 for r in self.rows)


def compare_groups(a: Sequence[Group], b: Sequence[Group]) -> Comparison:
    means_a = {g.example_id: g.mean for g in a}
    means_b = {g.example_id: g.mean for g in b}
    ids = sorted(set(means_a) | set(means_b))
    return Comparison([ExampleDiff(i, means_a.get(i), means_b.get(i)) for i in ids])
