"""The reward panel under the Rollouts groups: how rewards are distributed over the run's rollouts
(a histogram) and pass@k / pass^k for k = 1..n over its n rollouts per example
(`workbench.tui.data.reward_stats`: the eval summary's and verifiers' definition, a rollout is
correct from the environment's pass threshold up, 0.5 unless it sets one).

It takes about 15 lines, so it shows itself only on a screen tall enough to keep the groups table
usable (`fit`), unless the user toggled it (`d`).
"""

from __future__ import annotations

from rich.console import Group as RichGroup
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from workbench.tui.data.reward_stats import PassAtK, RewardStats
from workbench.tui.widgets.format import num
from workbench.tui.widgets.histogram import BarChart

MIN_SCREEN_HEIGHT = 32  # below this the panel starts hidden: the groups table needs the rows
MOST_KS = 8  # with more rollouts per example, k = powers of two and n (a row each)


def shown_ks(n: int) -> list[int]:
    """The k of the pass@k table: every k up to MOST_KS rollouts, else powers of two and n."""
    if n <= MOST_KS:
        return list(range(1, n + 1))
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def pass_table(pass_k: PassAtK | None) -> RichGroup | Text:
    if pass_k is None:
        return Text("pass@k: needs 2 or more rollouts per example", style="dim")
    table = Table.grid(padding=(0, 2))
    for _ in range(3):
        table.add_column(justify="right")
    table.add_row(Text("k", style="bold"), Text("pass@k", style="bold"), Text("pass^k", style="bold"))
    for k in shown_ks(pass_k.n):
        table.add_row(str(k), f"{pass_k.pass_at[k]:.3f}", f"{pass_k.pass_all[k]:.3f}")
    # examples × rollouts each; wide enough for the 36-column left pane
    note = Text(f"pass: reward ≥ {pass_k.threshold:g} · {pass_k.examples} × {pass_k.n}", style="dim")
    return RichGroup(note, table)


class RewardPanel(Vertical):
    """`show(stats)` draws the histogram and the pass@k table."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.stats: RewardStats | None = None
        self.chosen: bool | None = None  # the user's `d` (None: decided by the screen's height)

    def compose(self) -> ComposeResult:
        yield BarChart(id="reward-histogram", bar_width=12)
        yield Static(id="pass-at-k")

    def show(self, stats: RewardStats) -> None:
        self.stats = stats
        pass_k = stats.pass_k
        self.border_title = (
            f"rewards · avg@{pass_k.n} {num(pass_k.avg)}" if pass_k else f"rewards · mean {num(stats.mean)}"
        )
        chart = self.query_one(BarChart)
        chart.show(stats.histogram)
        self.query_one("#pass-at-k", Static).update(pass_table(stats.pass_k))

    def fit(self, screen_height: int) -> None:
        """Shown on a tall enough screen, unless the user said otherwise."""
        self.display = self.chosen if self.chosen is not None else screen_height >= MIN_SCREEN_HEIGHT

    def toggle(self) -> None:
        self.chosen = not self.display
        self.display = self.chosen
