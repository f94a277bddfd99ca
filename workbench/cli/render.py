"""Rich rendering for the CLI: a progress bar reporter and the eval summary table."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from rich.console import Console, ConsoleDimensions, ConsoleOptions, RenderableType
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.segment import Segment
from rich.table import Table

from workbench.errors import redact_credentials
from workbench.types import Group, Rollout

UNFOLDED_WIDTH = 100_000
"""Width of a console that writes to a file or pipe: wider than any path or log line, i.e. no folding."""


class CliConsole(Console):
    """A rich Console that never folds a line when its stream is not a terminal.

    On a terminal (or where rich's conventions say so: FORCE_COLOR=1, TTY_COMPATIBLE=1, force_terminal)
    it is a plain rich Console: the terminal's width (or COLUMNS), styles, wrapping, live progress.
    To a file or pipe it writes no ANSI styling (rich's default: NO_COLOR-free logs) and folds no line,
    so logs can be grepped and paths copied whole: the console is UNFOLDED_WIDTH columns wide and each
    renderable is laid out at its natural width (a table as wide as its longest cell needs). That width is
    at least COLUMNS, else 80, so what fills the line (a panel) keeps the size it has today. COLUMNS never
    narrows a pipe: to see a pipe's output as a terminal of N columns would, set FORCE_COLOR=1 COLUMNS=N.
    An explicit Console(width=...) is obeyed as in rich.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._fixed_width = kwargs.get("width") is not None  # rich also sets _width from COLUMNS

    @property
    def unfolded(self) -> bool:
        """True when writing to a file or pipe (and no width was given): lines are never folded."""
        return not self._fixed_width and not self.is_terminal and not self.is_jupyter

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return ConsoleDimensions(UNFOLDED_WIDTH, size.height) if self.unfolded else size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        # super() cannot set a property; mypy types `Console.size` as the getter's value, not the property.
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]
        self._fixed_width = True

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        options = options or self.options
        if options.max_width >= UNFOLDED_WIDTH and self.unfolded:
            # Lay it out at its natural width: a Panel or an expanding Table would otherwise fill all
            # UNFOLDED_WIDTH columns. What cannot be measured (rich.live's final frame) keeps the full
            # width, and its parts are measured in turn when rendered.
            natural = Measurement.get(self, options, renderable).maximum
            if natural < UNFOLDED_WIDTH:
                options = options.update_width(max(natural, self._fill_width()))
        return super().render(renderable, options)

    def _fill_width(self) -> int:
        """How wide what fills the line (a panel) is in a file or pipe: COLUMNS, else 80."""
        columns = os.environ.get("COLUMNS", "")
        return int(columns) if columns.isdigit() and int(columns) > 0 else 80


console = CliConsole(highlight=False)
err_console = CliConsole(stderr=True, highlight=False)


class LineProgress:
    """Progress for a stream that is not a terminal (a file, a pipe, the TUI's launch log).

    rich's live bar draws nothing there until it stops, so a run's log would stay silent for
    minutes. This prints whole plain lines as work happens instead: one at the start, then one
    whenever at least `every_frac` of the total or `every_s` seconds went by, and the last state
    when it closes (unless that line was already printed). Each line reads like the bar would:
    `LABEL  DONE/TOTAL UNIT  reward R  H:MM:SS`.
    """

    def __init__(
        self,
        console: Console,
        label: str,
        unit: str,
        total: int | None,
        done: int = 0,
        *,
        every_s: float = 10.0,
        every_frac: float = 0.05,
        field: str = "reward",
    ) -> None:
        self.console, self.label, self.unit, self.field = console, label, unit, field
        self.total, self.done, self.value = total, done, "-"
        self.every_s, self.every_frac = every_s, every_frac
        self._started = time.monotonic()
        self._printed: tuple[int, int | None, str] | None = None
        self._printed_at = self._started
        self._emit()

    def update(
        self,
        *,
        done: int | None = None,
        advance: int = 0,
        total: int | None = None,
        value: str | None = None,
        emit: bool = True,
    ) -> None:
        """Move to a new state; print it when it is due (not with `emit=False`: a training step
        prints its own step line, and the closing line sums up)."""
        self.done = (self.done if done is None else done) + advance
        self.total = self.total if total is None else total
        self.value = self.value if value is None else value
        if emit and self._due():
            self._emit()

    def close(self) -> None:
        if self._printed != self._state():
            self._emit()

    def line(self) -> str:
        count = f"{self.done}/{self.total}" if self.total else str(self.done)
        elapsed = timedelta(seconds=int(time.monotonic() - self._started))
        return f"{self.label}  {count} {self.unit}  {self.field} {self.value}  {elapsed}"

    def _state(self) -> tuple[int, int | None, str]:
        return self.done, self.total, self.value

    def _due(self) -> bool:
        if self._printed == self._state():
            return False
        if self.total and self.done >= self.total:
            return True
        last_done = self._printed[0] if self._printed else 0
        step = max(1.0, (self.total or 0) * self.every_frac)
        return self.done - last_done >= step or time.monotonic() - self._printed_at >= self.every_s

    def _emit(self) -> None:
        self.console.print(self.line(), markup=False, highlight=False)
        self._printed, self._printed_at = self._state(), time.monotonic()


class RichReporter:
    """Renders service events as a progress bar (to stderr, so stdout stays data).

    On a terminal: rich's live bar, with step lines and rollouts printed above it. Elsewhere (a
    file or a pipe, e.g. a run launched from the TUI, whose output goes to a log file): the same
    lines as they happen, plain, with the bar replaced by `LineProgress` lines.
    """

    def __init__(self, verbose: bool = False, unit: str = "rollouts") -> None:
        self.verbose = verbose
        self.unit = unit
        self._progress: Progress | None = None
        self._lines: LineProgress | None = None
        self._task: Any = None

    def start(self, label: str, total: int, done: int) -> None:
        if not err_console.is_interactive:
            self._lines = LineProgress(err_console, label, self.unit, total, done)
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(self.unit),
            TextColumn("reward {task.fields[reward]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err_console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(label, total=total, completed=done, reward="-")

    def group_done(self, group: Group, stats: dict[str, Any]) -> None:
        reward = f"{stats['reward_mean']:.3f}"
        if self._lines is not None:
            if self.verbose:
                for rollout in group.rollouts:
                    err_console.print(format_rollout(rollout))
            self._lines.update(advance=len(group.rollouts), value=reward)
            return
        if self._progress is None:
            return
        self._progress.update(self._task, advance=len(group.rollouts), reward=reward)
        if self.verbose:
            for rollout in group.rollouts:
                self._progress.console.print(format_rollout(rollout))

    def step_done(self, step: int, metrics: dict[str, Any]) -> None:
        """Training: one console line per step above the bar, and the bar advances a step."""
        from workbench.train.metrics import step_line

        reward = metrics.get("reward/mean")
        shown = "-" if reward is None else f"{reward:.3f}"
        if self._lines is not None:
            err_console.print(step_line(step, metrics), markup=False, highlight=False)
            self._lines.update(done=step, value=shown, emit=False)  # the step line is the progress line
            return
        if self._progress is None:
            return
        self._progress.update(self._task, completed=step, reward=shown)
        self._progress.console.print(step_line(step, metrics))

    def message(self, text: str) -> None:
        from rich.markup import escape

        err_console.print(f"[yellow]{escape(redact_credentials(text))}[/]")

    def finish(self) -> None:
        if self._lines is not None:
            self._lines.close()
            self._lines = None
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def format_rollout(rollout: Rollout) -> str:
    final = next((m for m in reversed(rollout.completion) if m.get("role") == "assistant"), {})
    last = final.get("content") or ""
    # Thinking stays folded: its size is shown, the answer is what the line is for.
    thought = (
        f"[dim](thought {len(str(final['reasoning_content']).split())} words)[/] "
        if final.get("reasoning_content")
        else ""
    )
    error = f" [red]{rollout.error.where} error: {rollout.error.message[:120]}[/]" if rollout.error else ""
    scores = " ".join(f"{k}={v:.2f}" for k, v in rollout.rewards.items())
    return (
        f"[dim]#{rollout.example_id}.{rollout.rollout_index}[/] reward [bold]{rollout.reward:.3f}[/] {scores} "
        f"turns={rollout.num_turns}{error}\n  {thought}{last[:300]!r}"
    )


def server_failures(summary: dict[str, Any]) -> str:
    """One line for the rollouts whose model call failed, with the server's own first messages:
    '16 of 16 rollouts failed on the model call: HTTP 401 from URL: invalid key (16)'."""
    lost = summary.get("infrastructure_failures", 0)
    total = lost + summary.get("num_rollouts", 0)
    messages = "; ".join(
        f"{error['message'][:300]} ({error['count']})" for error in summary.get("server_errors", [])
    )
    return f"{lost} of {total} rollouts failed on the model call" + (f": {messages}" if messages else "")


def summary_table(summary: dict[str, Any], title: str) -> Table:
    table = Table(title=title, show_header=False, title_justify="left", box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    lost = summary.get("infrastructure_failures", 0)
    lost_row = (
        f"[red]{lost} rollout(s) in {summary.get('incomplete_groups', 0)} group(s)[/]: not results, "
        "left out of every number here; first messages:\n"
        + "\n".join(
            f"  {escape(e['message'][:300])} ({e['count']})" for e in summary.get("server_errors", [])
        )
    )
    if not summary.get("num_rollouts"):
        table.add_row("rollouts", "0")
        if lost:
            table.add_row("server failures", lost_row)
        return table
    table.add_row("rollouts", f"{summary['num_rollouts']} ({summary['num_groups']} groups)")
    if lost:
        table.add_row("server failures", lost_row)
    table.add_row("reward", f"{summary['reward_mean']:.4f} ± {summary['reward_std']:.4f}")
    for name, value in summary["reward_funcs"].items():
        table.add_row(f"  {name}", f"{value:.4f}")
    for name, value in summary.get("avg_at_k", {}).items():
        table.add_row(name, f"{value:.4f}")
    threshold = summary.get("pass_threshold")  # older runs' summaries: pass@k of 0/1 rewards, no threshold
    for index, (name, value) in enumerate(summary.get("pass_at_k", {}).items()):
        rule = f"  (correct: reward >= {threshold:g})" if threshold is not None and index == 0 else ""
        table.add_row(name, f"{value:.4f}{rule}")
    q = summary["group_std_quantiles"]
    table.add_row(
        "within-group std",
        f"mean {summary['group_std_mean']:.3f}  p10 {q['p10']:.3f}  p50 {q['p50']:.3f}  p90 {q['p90']:.3f}",
    )
    hist = "  ".join(f"{k}: {v}" for k, v in sorted(summary["group_std_histogram"].items()))
    table.add_row("  groups by std", hist)
    table.add_row("zero-variance groups", f"{summary['zero_variance_frac']:.0%}")
    verdict = summary["verdict"]
    color = "green" if verdict.startswith("good") else "yellow"
    table.add_row("difficulty", f"[{color}]{verdict}[/]")
    table.add_row(
        "tokens / rollout",
        f"prompt {summary['prompt_tokens_mean']:.0f}  completion {summary['completion_tokens_mean']:.0f}",
    )
    table.add_row(
        "turns / rollout", f"{summary['num_turns_mean']:.2f}  (truncated {summary['truncated_frac']:.0%})"
    )
    errors = summary["errors"]
    detail = "  " + ", ".join(f"{k}: {v}" for k, v in summary["error_types"].items()) if errors else ""
    table.add_row("errors", f"[{'red' if errors else 'green'}]{errors}[/]{detail}")
    if "elapsed_s" in summary:
        rate = summary["num_rollouts"] / summary["elapsed_s"] if summary["elapsed_s"] else 0.0
        table.add_row("time", f"{summary['elapsed_s']:.1f} s ({rate:.1f} rollouts/s)")
    return table
