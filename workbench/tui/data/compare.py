"""Compare two eval runs example by example: mean reward in each, the difference, and how each
example changed from A to B:

- fixed: failed in A, solved in B; broke: the reverse (solved = group mean >= 0.5, so a binary
  reward means "most rollouts passed");
- better / worse: the mean moved up / down without crossing that line; same: it did not move.

Two runs are only comparable when their example ids name the same examples: same environment,
same environment args, and the same question under a shared id (`mismatch` checks a few; the
system prompt may differ).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.tui.data.rollout_index import GroupRow, RolloutIndex
from workbench.tui.data.runs import RunInfo

SOLVED = 0.5
EPS = 1e-9
CHANGES = ("fixed", "broke", "better", "worse")  # the filters, in the order `f` cycles them
PROMPTS_CHECKED = 5  # shared examples whose prompts must match (each costs two small reads)


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

    @property
    def change(self) -> str:
        """fixed | broke | better | worse | same, or 'only A' / 'only B'."""
        if self.a is None or self.b is None:
            return "only A" if self.b is None else "only B"
        delta = self.b - self.a
        return self.flip or ("better" if delta > EPS else "worse" if delta < -EPS else "same")


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

    def count(self, change: str) -> int:
        """Examples whose `change` is `change` ('better' and 'worse' include the flips)."""
        return len(self.only(change))

    def only(self, change: str | None) -> list[ExampleDiff]:
        """The rows a filter keeps: None keeps all; 'better' counts fixed ones too, 'worse' broke ones."""
        if change is None:
            return self.rows
        if change == "better":
            return [r for r in self.rows if (r.delta or 0) > EPS]
        if change == "worse":
            return [r for r in self.rows if (r.delta or 0) < -EPS]
        return [r for r in self.rows if r.change == change]

    @property
    def better(self) -> int:
        return self.count("better")

    @property
    def worse(self) -> int:
        return self.count("worse")


def compare_groups(a: Sequence[GroupRow], b: Sequence[GroupRow]) -> Comparison:
    means_a = {g.example_id: g.mean for g in a}
    means_b = {g.example_id: g.mean for g in b}
    ids = sorted(set(means_a) | set(means_b))
    return Comparison([ExampleDiff(i, means_a.get(i), means_b.get(i)) for i in ids])


def _config(run: RunInfo) -> dict[str, Any]:
    config = run.metadata.get("config")
    return config if isinstance(config, dict) else {}


def _question(index: RolloutIndex, example_id: int) -> Any:
    """The example's prompt without system messages: two runs of one example set with different
    system prompts (before and after prompt optimization) are what compare is for."""
    group = index.group(example_id)
    if group is None or not group.size:
        return None
    prompt = index.record(example_id, index.rollout_index_at(group, 0)).get("prompt")
    if not isinstance(prompt, list):
        return prompt
    return [m for m in prompt if not (isinstance(m, dict) and m.get("role") == "system")]


def mismatch(a: RunInfo, b: RunInfo, index_a: RolloutIndex, index_b: RolloutIndex) -> str | None:
    """Why A and B cannot be compared example by example (one line), or None when they can.
    The indexes must be refreshed."""
    if a.env != b.env:
        return f"A is a {a.env} eval and B a {b.env} eval: their example ids name different examples"
    if _config(a).get("env_args", {}) != _config(b).get("env_args", {}):
        return f"A and B ran {a.env} with different environment args, so their examples may differ"
    ids_a = {g.example_id for g in index_a.groups()}
    shared = sorted(ids_a & {g.example_id for g in index_b.groups()})
    if not shared:
        return "A and B have no example in common"
    step = max(1, len(shared) // PROMPTS_CHECKED)
    for example_id in shared[::step][:PROMPTS_CHECKED]:
        if _question(index_a, example_id) != _question(index_b, example_id):
            return f"example {example_id} asks something else in A than in B: they ran different example sets"
    return None
