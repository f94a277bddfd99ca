"""One training curve (or a few on shared axes) drawn in the terminal with textual-plotext.

Several curves are told apart by a legend in the title line ("reward 0.45  ━ mean  ━ std"), each
mark in its curve's colour, never by plotext's legend: that one is drawn inside the plot area
and, in a narrow chart (a 100-column monitor), covers the curves it names.
"""

from __future__ import annotations

import math
from typing import cast

from rich.color import Color
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import RenderResult
from textual_plotext import PlotextPlot

from workbench.tui.widgets.format import clip

Line = tuple[str, list[float], list[float]]  # (legend label, steps, values)
# Curve colours in order, as RGB (plotext draws them exactly, and the legend marks match).
LINE_COLORS: tuple[tuple[int, int, int], ...] = ((0, 175, 255), (255, 135, 0), (95, 215, 95), (215, 95, 215))
LEGEND_MARK = "━"


def legend_text(labels: list[str]) -> str:
    """The legend part of the title line: a coloured mark before each curve's label."""
    return "  ".join(f"{LEGEND_MARK} {label}" for label in labels)


class MetricPlot(PlotextPlot):
    """Set the curves with `show(title, lines)`; redraws only when the data changed."""

    def __init__(self, title: str, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="metric-plot")
        self.title = title
        self.lines: list[Line] = []

    def on_mount(self) -> None:
        self._draw()

    def on_resize(self, event: events.Resize) -> None:
        self._draw()  # the title is fitted to the width (plotext drops a title that does not fit)

    def show(self, lines: list[Line]) -> None:
        lines = [line for line in lines if line[1]]
        if lines == self.lines:
            return
        self.lines = lines
        self._draw()

    def _draw(self) -> None:
        plt = self.plt
        plt.clear_data()
        latest = ""
        if self.lines:
            label, _, values = self.lines[0]
            latest = f" {values[-1]:.4g}"
        title = f"{self.title}{latest}" if self.lines else f"{self.title} (no data yet)"
        if len(self.lines) > 1:
            title = f"{title}  {legend_text([label for label, _, _ in self.lines])}"
        # plotext drops a title wider than its canvas: the widget less the y-axis labels, which
        # grow for small values (a mismatch KL's "0.00600┤" against a reward's "0.50┤").
        margin = max(4, y_label_width([v for _, _, values in self.lines for v in values]))
        plt.title(clip(title, max(self.size.width - margin, 8)) if self.size.width else title)
        for number, (_, steps, values) in enumerate(self.lines):
            marker = "braille" if len(steps) > 1 else "dot"
            plt.plot(steps, values, marker=marker, color=LINE_COLORS[number % len(LINE_COLORS)])
        steps = sorted({s for _, xs, _ in self.lines for s in xs})
        if steps:
            ticks: list[float] = list(step_ticks(steps))  # ints: plotext labels them "2", not "2.0"
            plt.xticks(ticks)
        self.refresh()

    def render(self) -> RenderResult:
        """The plot, with the title line's legend marks in their curves' colours."""
        text = cast(Text, super().render())
        if len(self.lines) > 1:
            first_line = text.plain.split("\n", 1)[0]
            at = 0
            for number, (label, _, _) in enumerate(self.lines):
                found = first_line.find(f"{LEGEND_MARK} {label}", at)
                if found < 0:
                    break  # clipped off the title line
                rgb = LINE_COLORS[number % len(LINE_COLORS)]
                text.stylize(Style(color=Color.from_rgb(*rgb), bold=True), found, found + 1)
                at = found + 1
        return text


def y_label_width(values: list[float]) -> int:
    """About how wide plotext writes the y-axis labels for `values`, as seen in its charts: two
    decimals ("0.50", "26.00"), three digits after the leading zeros of a small value ("0.00600")."""
    finite = [abs(v) for v in values if math.isfinite(v)]
    high = max(finite, default=1.0) or 1.0
    sign = 1 if any(v < 0 for v in values) else 0
    if high >= 1:
        return sign + len(str(int(high))) + 3
    zeros = max(0, -math.floor(math.log10(high)) - 1)
    return sign + 2 + (zeros + 3 if zeros else 2)


def step_ticks(steps: list[float], most: int = 4) -> list[int]:
    """A few whole-number step ticks spanning the data (plotext would label 2.2, 3.5 ...)."""
    low, high = int(steps[0]), int(steps[-1])
    if high - low < most:
        return list(range(low, high + 1))
    stride = max(1, -(-(high - low) // most))
    return list(range(low, high + 1, stride))
