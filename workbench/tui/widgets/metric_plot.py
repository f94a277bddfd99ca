"""One training curve (or a few on shared axes) drawn in the terminal with textual-plotext."""

from __future__ import annotations

from textual import events
from textual_plotext import PlotextPlot

from workbench.tui.widgets.format import clip

Line = tuple[str, list[float], list[float]]  # (legend label, steps, values)


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
        plt.title(clip(title, max(self.size.width - 4, 8)) if self.size.width else title)
        for label, steps, values in self.lines:
            marker = "braille" if len(steps) > 1 else "dot"
            plt.plot(steps, values, marker=marker, label=label if len(self.lines) > 1 else None)
        steps = sorted({s for _, xs, _ in self.lines for s in xs})
        if steps:
            ticks: list[float] = list(step_ticks(steps))  # ints: plotext labels them "2", not "2.0"
            plt.xticks(ticks)
        self.refresh()


def step_ticks(steps: list[float], most: int = 4) -> list[int]:
    """A few whole-number step ticks spanning the data (plotext would label 2.2, 3.5 ...)."""
    low, high = int(steps[0]), int(steps[-1])
    if high - low < most:
        return list(range(low, high + 1))
    stride = max(1, -(-(high - low) // most))
    return list(range(low, high + 1, stride))
