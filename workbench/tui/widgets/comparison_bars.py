"""An optimizer comparison as bars (`workbench gepa compare`): per arm, the rollouts it spent
against the budget and the held-out gain it bought, side by side, with gain per 100 rollouts
and per minute. Text bars stay readable at 80 columns and in tests."""

from __future__ import annotations

from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from workbench.store.comparisons import Comparison, ComparisonRow

BAR = "█"
ROLLOUT_BAR = 10
GAIN_BAR = 8  # each side of zero


def rollout_bar(spent: int | None, budget: int | None) -> Text:
    if spent is None or not budget:
        return Text("-", style="dim")
    length = min(ROLLOUT_BAR, round(ROLLOUT_BAR * spent / budget))
    return Text.assemble((BAR * length, "cyan"), ("·" * (ROLLOUT_BAR - length), "dim"), f" {spent}")


def gain_bar(diff: float, peak: float) -> Text:
    """A bar left of zero (red) for a loss, right of it (green) for a gain, scaled to `peak`."""
    length = min(GAIN_BAR, round(GAIN_BAR * abs(diff) / peak)) if peak > 0 else 0
    left = (BAR * length if diff < 0 else "").rjust(GAIN_BAR)
    right = (BAR * length if diff > 0 else "").ljust(GAIN_BAR)
    return Text.assemble((left, "red"), ("│", "dim"), (right, "green"), f" {diff:+.3f}")


def _rate(value: float | None) -> Text:
    return Text("-", style="dim") if value is None else Text(f"{value:+.4f}")


def comparison_view(comparison: Comparison, this_run: Path | None = None) -> Group:
    """The title line and one row per arm; the row of `this_run` (a run folder) in bold."""
    budget = comparison.budget or max((r.max_calls for r in comparison.rows), default=0)
    peak = max((abs(r.diff) for r in comparison.rows), default=0.0)
    title = Text.assemble(
        ("comparison ", "bold"),
        (comparison.folder.name, "bold"),
        f" · {comparison.env_id} · {comparison.model} · budget {budget} rollouts · held-out "
        f"{comparison.heldout} rows × {comparison.rollouts}",
    )
    table = Table(box=None, padding=(0, 1), show_edge=False)
    table.add_column("arm", style="bold", no_wrap=True)
    table.add_column("rollouts spent", no_wrap=True)
    table.add_column("held-out gain", no_wrap=True)
    table.add_column("/100 rollouts", justify="right", no_wrap=True)
    table.add_column("/minute", justify="right", no_wrap=True)
    for row in comparison.rows:
        table.add_row(
            row.optimizer,
            rollout_bar(row.rollouts_spent, budget),
            gain_bar(row.diff, peak),
            _rate(row.gain_per_100_rollouts),
            _rate(row.gain_per_minute),
            style="reverse" if _is(row, this_run) else "",
        )
    notes = Text(
        "\nheld-out gain: best − seed on the same rows (prompt arms: best prompt vs the seed prompt; "
        "rl: final checkpoint vs the starting model); per minute of the arm's own wall time",
        style="dim",
    )
    return Group(title, Text(""), table, notes)


def _is(row: ComparisonRow, run: Path | None) -> bool:
    return run is not None and Path(row.run_dir).parts[-2:] == run.parts[-2:]


class ComparisonBars(Static):
    """`show(comparison, this_run)` draws the comparison; `rows` is what it shows (for tests)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows: list[ComparisonRow] = []

    def show(self, comparison: Comparison, this_run: Path | None = None) -> None:
        self.rows = comparison.rows
        self.update(comparison_view(comparison, this_run))
