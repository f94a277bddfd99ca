"""A resolved run plan as data: what `--dry-run` prints for training and GEPA (and what a real
run shows before it starts). Services build it; front ends render it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PlanSection:
    title: str
    rows: list[tuple[str, str]] = field(default_factory=list)

    def add(self, label: str, value: object) -> None:
        self.rows.append((label, str(value)))


@dataclass
class Plan:
    sections: list[PlanSection]
    notes: list[str]  # informational: translations, defaults, keys ignored on this machine
    warnings: list[str]  # what stops a real run (a missing env_file), shown but not fatal here
