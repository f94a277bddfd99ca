"""How a checkpoint sweep is shown: a table of reward by step, then a bar per step (a terminal
plot that also reads in a log file: one whole line per step)."""

from __future__ import annotations

from rich.console import JustifyMethod
from rich.table import Table

from workbench.store.sweeps import BASE, SweepPoint, step_label

BAR_WIDTH = 40
EIGHTHS = " ▏▎▍▌▋▊▉█"


def sweep_table(points: list[SweepPoint], title: str) -> Table:
    base = next((p.reward_mean for p in points if p.step == BASE), None)
    table = Table(title=title, title_justify="left", box=None, padding=(0, 2))
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("step", "right"),
        ("reward", "right"),
        ("± std", "right"),
        ("vs base", "right"),
        ("eval run", "left"),
    )
    for column, justify in columns:
        table.add_column(column, justify=justify)
    best = max(points, key=lambda p: p.reward_mean) if points else None
    for point in points:
        delta = "" if base is None or point.step == BASE else f"{point.reward_mean - base:+.3f}"
        std = "" if point.reward_std is None else f"{point.reward_std:.3f}"
        reward = f"{point.reward_mean:.3f}" + (" *" if point is best and len(points) > 1 else "")
        table.add_row(step_label(point.step), reward, std, delta, point.eval_run)
    return table


def bar(value: float, top: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of `value` on a scale where `top` fills `width` characters (1/8 steps)."""
    eighths = round(max(0.0, value) / top * width * 8) if top > 0 else 0
    full, part = divmod(min(eighths, width * 8), 8)
    return ("█" * full + (EIGHTHS[part] if part else "")).ljust(width)


def reward_bars(points: list[SweepPoint]) -> list[str]:
    top = max((p.reward_mean for p in points), default=0.0)
    return [f"{step_label(p.step):>6}  {bar(p.reward_mean, top)}  {p.reward_mean:.3f}" for p in points]
