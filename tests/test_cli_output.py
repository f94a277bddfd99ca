"""Output to a file or pipe is never folded (whole lines, whole paths, no ANSI codes); a terminal
keeps rich's wrapping and styles (workbench/cli/render.py: CliConsole)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import cli
from tests.conftest import FIXTURES

SEEDS = FIXTURES / "seed-configs"
LONG_PATH = "/tmp/" + "/".join(f"a-rather-long-folder-name-{i:02d}" for i in range(12))  # > 300 characters
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Variables that decide terminal-ness, colour and width; each test sets what it means to test.
CONSOLE_ENV = (
    "FORCE_COLOR",
    "NO_COLOR",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "COLUMNS",
    "LINES",
    "TERM",
    "WORKBENCH_WORKSPACE",
)


def run_python(
    code: str, cwd: Path, env_extra: dict[str, str] | None = None, *args: str
) -> subprocess.CompletedProcess:
    """Run `python -c code` (or `python -m workbench args` when code is empty) with stdout and
    stderr to pipes: not a terminal."""
    env = {k: v for k, v in os.environ.items() if k not in CONSOLE_ENV}
    env.update(env_extra or {})
    command = (
        [sys.executable, "-c", textwrap.dedent(code)] if code else [sys.executable, "-m", "workbench", *args]
    )
    result = cli.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr + result.stdout
    return result


def lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


PRINT_ALL = f"""
    from rich.panel import Panel
    from rich.table import Table

    from workbench.cli.render import console, err_console, summary_table
    from workbench.train.metrics import step_line

    path = {LONG_PATH!r}
    console.print(f"[dim]saved to {{path}}[/]")
    err_console.print(f"[yellow]stopped with a checkpoint; continue with `workbench train --resume {{path}}`[/]")
    metrics = {{"reward/mean": 0.123456, "eval/reward_mean": 0.654321, "train/loss": -0.0123456, "policy/entropy": 1.23456,
               "policy/kl": 0.000123456, "filter/dropped_groups": 12, "time/step": 123.456, "time/weight_sync": 1.5,
               "policy/lag": 3}}
    err_console.print(step_line(123456, metrics, total=999999))
    summary = {{"num_rollouts": 8, "num_groups": 2, "reward_mean": 0.5, "reward_std": 0.25,
               "reward_funcs": {{"a_reward_function_with_a_rather_long_name_" * 3: 0.5}},
               "pass_at_k": {{}}, "group_std_quantiles": {{"p10": 0.0, "p50": 0.1, "p90": 0.2}}, "group_std_mean": 0.1,
               "group_std_histogram": {{"0.0": 1, "0.1-0.2": 1}}, "zero_variance_frac": 0.5, "verdict": "good: mixed",
               "prompt_tokens_mean": 10.0, "completion_tokens_mean": 20.0, "num_turns_mean": 1.0, "truncated_frac": 0.0,
               "errors": 2, "error_types": {{f"model error at {{path}}": 2}}}}
    console.print(summary_table(summary, f"reverse-text · {{path}}"))
    table = Table(title="environments", show_lines=True)
    table.add_column("id", no_wrap=True)
    table.add_column("description", ratio=1, min_width=20)
    table.add_column("arguments", overflow="fold")
    table.add_row("reverse-text", "Reverse the text: " + "word " * 30, path)
    console.print(table)
    console.print(Panel("a short prompt", title="best prompt", title_align="left"))
    console.print(Panel("a long prompt line " * 10, title="best prompt", title_align="left"))
"""


def check_unfolded(result: subprocess.CompletedProcess, fill_width: int = 80) -> None:
    out, err = result.stdout, result.stderr
    assert not ANSI.search(out) and not ANSI.search(err), (out, err)
    assert lines_with(out, "saved to ") == [f"saved to {LONG_PATH}"]
    assert lines_with(err, "continue with") == [
        f"stopped with a checkpoint; continue with `workbench train --resume {LONG_PATH}`"
    ]
    step = lines_with(err, "step 123456/999999")
    assert len(step) == 1 and len(step[0]) > 100, err
    assert step[0].endswith("s/step 123.5") and "lag 3" in step[0] and "entropy 1.235" in step[0]
    # summary_table: the title, the long reward function's row and the errors row each on one line
    assert [line.rstrip() for line in out.splitlines() if line.startswith("reverse-text · ")] == [
        f"reverse-text · {LONG_PATH}"
    ], out
    assert len(lines_with(out, "a_reward_function_with_a_rather_long_name_" * 3)) == 1, out
    assert len(lines_with(out, f"model error at {LONG_PATH}: 2")) == 1, out
    # a bordered table: the path and the long description in one row, on one line
    row = lines_with(out, f"│ {LONG_PATH} │")
    assert len(row) == 1 and ("word " * 30).strip() in row[0], out
    # a panel keeps its usual width (COLUMNS, else 80), or is as wide as its longest line
    short = lines_with(out, "a short prompt")
    assert len(short) == 1 and len(short[0]) == fill_width, out
    long = lines_with(out, "a long prompt line")
    assert len(long) == 1 and ("a long prompt line " * 10).strip() in long[0], out


def test_pipe_output_is_not_folded(tmp_path: Path):
    check_unfolded(run_python(PRINT_ALL, tmp_path))


def test_pipe_output_is_not_folded_whatever_columns_says(tmp_path: Path):
    """COLUMNS (often exported from the terminal a command was started in) does not fold a pipe's
    lines; it is only the width of what fills the line (a panel)."""
    check_unfolded(run_python(PRINT_ALL, tmp_path, {"COLUMNS": "40", "NO_COLOR": "1"}), fill_width=40)


def test_terminal_still_wraps_and_styles(tmp_path: Path):
    """FORCE_COLOR says the stream is a terminal: rich's behaviour, folded at COLUMNS with styles."""
    result = run_python(PRINT_ALL, tmp_path, {"FORCE_COLOR": "1", "COLUMNS": "60"})
    assert ANSI.search(result.stdout) and ANSI.search(result.stderr)
    out, err = ANSI.sub("", result.stdout), ANSI.sub("", result.stderr)
    assert all(len(line) <= 60 for line in (out + err).splitlines()), out + err
    assert not lines_with(out, LONG_PATH) and not lines_with(err, LONG_PATH)
    assert "".join(out.split()).count(LONG_PATH) >= 1  # the path is all there, folded over lines


def test_progress_and_step_lines_to_a_pipe(tmp_path: Path):
    """Training's progress bar to a pipe: a line when it starts, one whole line per step as it
    happens, the bar's last state once at the end, no cursor movement or carriage returns."""
    code = f"""
        from workbench.cli.render import RichReporter
        from workbench.train.metrics import step_line

        reporter = RichReporter(unit="steps")
        reporter.start("train " + {LONG_PATH!r}, 3, 0)
        for step in (1, 2, 3):
            reporter.step_done(step, {{"reward/mean": 0.5, "train/loss": 0.25, "policy/entropy": 1.5, "policy/kl": 0.001,
                                       "eval/reward_mean": 0.75, "filter/dropped_groups": 1234567, "time/step": 12345.678}})
        reporter.message("note: " + {LONG_PATH!r})
        reporter.finish()
    """
    result = run_python(code, tmp_path)
    assert result.stdout == ""
    err = result.stderr
    assert "\r" not in err and not ANSI.search(err), repr(err)
    lines = err.splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1", "2", "3"], err
    assert all(line.endswith("s/step 1.235e+04") and "dropped 1.235e+06" in line for line in steps), err
    assert lines_with(err, "note: ") == [f"note: {LONG_PATH}"]
    bar = lines_with(err, f"train {LONG_PATH} ")
    assert len(bar) == 2 and "0/3 steps" in bar[0] and "3/3 steps" in bar[1] and "reward 0.500" in bar[1], err
    assert lines[0] == bar[0] and lines[-1] == bar[1] and len(lines) == 6, err


def test_eval_progress_to_a_pipe_is_lines_as_groups_finish(tmp_path: Path):
    """An eval's bar to a pipe: a plain line as groups finish (at most one per 5% of the total or
    10 s), each written when it happens: the child process's own output is read while it runs."""
    code = """
        import sys
        from types import SimpleNamespace

        from workbench.cli.render import RichReporter

        reporter = RichReporter()
        reporter.start("reverse-text · tiny", 8, 0)
        for done in range(4):
            reporter.group_done(SimpleNamespace(rollouts=[0, 1]), {"reward_mean": 0.25 * done})
            print(f"after group {done + 1}", file=sys.stderr, flush=True)
        reporter.finish()
    """
    err = run_python(code, tmp_path).stderr
    assert "\r" not in err and not ANSI.search(err), repr(err)
    lines = [line.split("  ") for line in err.splitlines()]
    assert [line[:3] for line in lines] == [
        ["reverse-text · tiny", "0/8 rollouts", "reward -"],
        ["reverse-text · tiny", "2/8 rollouts", "reward 0.000"],
        ["after group 1"],
        ["reverse-text · tiny", "4/8 rollouts", "reward 0.250"],
        ["after group 2"],
        ["reverse-text · tiny", "6/8 rollouts", "reward 0.500"],
        ["after group 3"],
        ["reverse-text · tiny", "8/8 rollouts", "reward 0.750"],
        ["after group 4"],
    ], err


def test_train_dry_run_plan_rows_are_whole_lines(tmp_path: Path):
    result = run_python(
        "",
        tmp_path,
        None,
        "train",
        str(SEEDS / "prime-rl-seed004.toml"),
        "--dry-run",
        "--set",
        f"output_dir={LONG_PATH}",
    )
    out = result.stdout + result.stderr
    assert not ANSI.search(out)
    run_folder = [
        line for line in lines_with(out, "run folder") if "<run folder>" not in line
    ]  # not W&B's row
    assert len(run_folder) == 1 and LONG_PATH in run_folder[0], out
    assert lines_with(out, "note: overrides:") == [f"note: overrides: output_dir={LONG_PATH}"], out
    assert "dry run: config is valid" in out


def test_console_width_rules_in_process(monkeypatch: pytest.MonkeyPatch):
    from rich.panel import Panel

    from workbench.cli.render import UNFOLDED_WIDTH, CliConsole

    for name in CONSOLE_ENV:
        monkeypatch.delenv(name, raising=False)
    file = io.StringIO()
    pipe = CliConsole(file=file, highlight=False)
    assert not pipe.is_terminal and pipe.width == UNFOLDED_WIDTH
    pipe.print("x" * 500)
    pipe.print(Panel("p"))
    assert file.getvalue().splitlines()[0] == "x" * 500 and len(file.getvalue().splitlines()[1]) == 80

    monkeypatch.setenv("COLUMNS", "100")
    file = io.StringIO()
    CliConsole(file=file).print(Panel("p"))  # what fills the line is COLUMNS wide
    assert len(file.getvalue().splitlines()[0]) == 100

    file = io.StringIO()
    CliConsole(file=file, width=50).print("y" * 120)  # an explicit width is rich's
    assert file.getvalue().splitlines() == ["y" * 50, "y" * 50, "y" * 20]

    file = io.StringIO()
    terminal = CliConsole(file=file, force_terminal=True, width=70)
    terminal.print("[bold]" + "z" * 100 + "[/]")
    assert terminal.is_terminal and terminal.width == 70
    assert [len(ANSI.sub("", line)) for line in file.getvalue().splitlines()] == [70, 30] and ANSI.search(
        file.getvalue()
    )
