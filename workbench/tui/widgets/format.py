"""Shared cell formatting: numbers, times and statuses look the same on every screen."""

from __future__ import annotations

from datetime import datetime

from rich.text import Text

STATUS_STYLES = {
    "running": "bold $success",
    "starting": "bold $warning",
    "finished": "$foreground",
    "stopped": "$warning",
    "failed": "bold $error",
    "died": "bold $error",
}
# Rich styles (no Textual variables) for Text objects inside tables.
STATUS_RICH = {
    "running": "bold green",
    "starting": "bold yellow",
    "finished": "",
    "stopped": "yellow",
    "failed": "bold red",
    "died": "bold red",
}


def num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def when(stamp: datetime | None) -> str:
    """Local start time, compact: 'MM-DD HH:MM'."""
    return "-" if stamp is None else stamp.astimezone().strftime("%m-%d %H:%M")


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_RICH.get(status, "dim"))


def clip(text: str, width: int) -> str:
    """Shorten to `width` characters with an ellipsis (table cells keep their width)."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def reward_color(value: float) -> str:
    """Red below 0.3, yellow below 0.7, green above: rewards are read at a glance."""
    return "green" if value >= 0.7 else "yellow" if value >= 0.3 else "red"


def reward_text(value: float | None) -> Text:
    """A reward cell, colored by `reward_color`."""
    if value is None:
        return Text("-", style="dim")
    return Text(f"{value:.3f}", style=reward_color(value))


def clip_head(text: str, width: int) -> str:
    """Like `clip`, but a checkpoint label ('<run> step 12', '<run> base') keeps its step, which
    is what tells two of them apart: the run name is shortened instead."""
    if len(text) <= width:
        return text
    run, sep, tail = text.rpartition(" step ")
    if not sep:
        run, sep, tail = text.rpartition(" base")
    if sep and len(sep) + len(tail) < width - 1:
        suffix = sep + tail
        return run[: width - len(suffix) - 1] + "…" + suffix
    return clip(text, width)
