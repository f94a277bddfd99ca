"""The TUI in a real terminal (issue 35, acceptance): `python -m workbench tui` in a 160x45 tmux
window, driven with keys and read from the captured screen, through a day's work on the tiny model:

1. launch: `l`, the Configs tab lists the workspace's RL config; Enter shows the whole command,
   a second Enter starts it and Runs lists the run;
2. monitor: Enter on the run opens its training monitor, which reaches "step 2/2", finished;
3. checkpoints: `K` lists both checkpoints (one per step);
4. sweep: `s` asks for examples and rollouts, then for a confirmation naming the rollouts it will
   run; the base model's and each checkpoint's reward appear in the table's `evaluated` column;
5. compare: two of those evals marked with space, `c` compares them (earlier step as A);
6. environments: `E` lists them; reverse-text shows the sweep's last eval and reward;
7. config edit: ctrl+o opens the config; a misspelt key gets the dry run's verdict at its line,
   the fix gets "valid", ctrl+s saves it (checked on disk), ctrl+l starts it once confirmed;
8. resume: `x` stops that run (confirmed, named by its id), `R` resumes it in the same folder and
   it goes on past the step where it stopped; no bare launch row is left beside it; `x` again;
9. archive: `A` (confirmed) moves its folder under outputs/archive/ (checked on disk) and its row
   goes; `q` quits.

Every wait polls the screen (tests/tmux.py) with a deadline and fails with the last screen. The
fixture ends the tmux server and every process left in the workspace (runs started from the TUI
have sessions of their own), and fails if one survives. Skipped only where tmux is missing
(`.ci/run` installs it with apt-get when it can)."""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tmux import TMUX, Tmux

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        TMUX is None,
        reason="tmux is not installed (.ci/run installs it with apt-get when it runs as root); "
        "this test drives the TUI in a real terminal",
    ),
]

CONFIG = "configs/rl/tiny-rl.toml"
# Two steps of RL on the tiny model, a checkpoint after each (the monitor and sweep stages).
TINY_RL = f"""# workbench train {CONFIG}
model = "tiny"
max_steps = 2
batch_size = 8
rollouts_per_example = 4
micro_batch_size = 8
learning_rate = 3e-3
seed = 1
[sampling]
max_tokens = 32
temperature = 1.0
[[env]]
id = "reverse-text"
[lora]
r = 4
alpha = 8
[checkpointing]
save_every_n_steps = 1
[wandb]
mode = "disabled"
"""
LONG = 100_000  # max_steps of the run that is stopped and resumed: it never ends on its own
RUN_ROW = r"^ +(?P<id>\S+) +train +reverse-text +tiny +{status} +(?P<step>\d+)/{total}\b"
REWARD = r"\d\.\d{3}"


@pytest.fixture
def tui(tiny_workspace: Path) -> Iterator[Tmux]:
    """The TUI in a 160x45 tmux window on a workspace with the tiny model and CONFIG."""
    (tiny_workspace / CONFIG).parent.mkdir(parents=True)
    (tiny_workspace / CONFIG).write_text(TINY_RL)
    env = {**os.environ, "WORKBENCH_WORKSPACE": str(tiny_workspace)}
    for name in ("COLUMNS", "LINES"):  # the window's size, not the test runner's
        env.pop(name, None)
    env.setdefault("OMP_NUM_THREADS", "1")  # the runs it starts share the machine with other tests
    term = Tmux(f"wb-walk-{os.getpid()}-{uuid.uuid4().hex[:8]}", width=160, height=45)
    try:
        term.start([sys.executable, "-m", "workbench", "tui"], cwd=tiny_workspace, env=env)
        yield term
    finally:
        left = term.close()
    assert not left, f"processes still running in the workspace after the test: {left}"


def run_row(status: str, total: int) -> re.Pattern[str]:
    return re.compile(RUN_ROW.format(status=status, total=total), re.MULTILINE)


def checkpoint_row(step: int, evaluated: str = r"\S+") -> re.Pattern[str]:
    """A row of the checkpoint table: step, saved, reward, eval, size, evaluated."""
    return re.compile(
        rf"^ {step} +\d\d-\d\d \d\d:\d\d +\S+ +\S+ +[\d.]+ [KMG]?B +(?P<evaluated>{evaluated})", re.MULTILINE
    )


EVAL_ROW = re.compile(r"^ (?P<mark>[● ]) +(?P<label>base|step \d+) +finished +8/8 +" + REWARD, re.MULTILINE)


def marked(screen: str) -> list[str]:
    return [m["label"] for m in EVAL_ROW.finditer(screen) if m["mark"] == "●"]


def step_order(label: str) -> int:
    return -1 if label == "base" else int(label.removeprefix("step "))


def test_a_day_in_the_tui_in_a_real_terminal(tui: Tmux, tiny_workspace: Path):
    term = tui
    runs = tiny_workspace / "outputs" / "runs"

    # ----- 1. launch -------------------------------------------------------------------------
    term.wait_for("No runs yet", "the empty Runs screen")
    term.press("l")
    term.wait_for(f"train {CONFIG}", "the Launch screen's Configs tab listing the config")
    term.press("Enter")  # shows the whole command; nothing starts yet
    term.wait_for("Start this?", "the launch confirmation")
    launches = tiny_workspace / "outputs" / "tui" / "launches"
    assert f"$ workbench train {CONFIG}" in term.screen and not list(launches.glob("*.json"))
    term.press("Enter")  # the focused Start button
    first = term.wait_for(run_row("(running|finished)", 2), "the training run's row in Runs")
    first_id = first["id"]
    assert " Runs · " in term.screen

    # ----- 2. monitor ------------------------------------------------------------------------
    term.press("Enter")
    term.wait_for("Training · reverse-text · tiny", "the training monitor")
    term.wait_for(
        lambda s: "Training · reverse-text · tiny · finished" in s and "step 2/2" in s,
        "the monitor at its last step, finished",
    )
    assert "reverse-text--tiny--" in term.screen and "Curves" in term.screen  # run folder name, tabs
    (run_dir,) = [p for p in runs.iterdir() if p.name.endswith(first_id)]

    # ----- 3. checkpoints --------------------------------------------------------------------
    term.press("K")
    term.wait_for(
        lambda s: checkpoint_row(1).search(s) and checkpoint_row(2).search(s), "checkpoints of steps 1 and 2"
    )
    assert f"Checkpoints · reverse-text · tiny · {run_dir.name}" in term.screen
    assert "no evals of these checkpoints yet" in term.screen

    # ----- 4. sweep --------------------------------------------------------------------------
    term.press("s")
    term.wait_for("Sweep: the base model and every checkpoint", "the sweep form")
    for field, value in (("examples (-n)", "4"), ("rollouts (-r)", "2")):
        term.press("Tab")  # the next field; typing replaces its text (selected on focus)
        term.wait_for(lambda s, field=field: field in term.cursor_line, f"the cursor in {field}")
        term.type(value)
        term.wait_for(re.compile(rf"{re.escape(field)} +{value} "), f"{field} {value}")
    term.press("C-s")
    term.wait_for("Sweep checkpoints", "the sweep's confirmation")
    assert "(24 rollouts)" in term.screen and "--checkpoints all" in term.screen  # 3 evals x 4 x 2
    term.press("y")
    term.wait_for(
        lambda s: (
            checkpoint_row(1, REWARD).search(s)
            and checkpoint_row(2, REWARD).search(s)
            and re.search(rf"base model {REWARD} \(its newest eval\)", s)
        ),
        "the sweep's rewards in the checkpoint rows and for the base model",
        timeout=300,
    )
    term.wait_for(lambda s: len(EVAL_ROW.findall(s)) == 3, "the sweep's three evals listed")
    assert "Evals of these checkpoints and the base model" in term.screen
    assert "no evals of these checkpoints yet" not in term.screen
    assert sorted(m["label"] for m in EVAL_ROW.finditer(term.screen)) == ["base", "step 1", "step 2"]

    # ----- 5. compare ------------------------------------------------------------------------
    # The evals table's cursor stays on the row it was on as rows come in, so where it is depends on
    # whether the sweep's evals were listed at once or one by one (under load). Space marks the
    # eval under it and focuses the table; Space again unmarks it; `g` goes to the first row.
    term.press("Space")
    term.wait_for(lambda s: len(marked(s)) == 1, "one eval marked")
    term.press("Space")
    term.wait_for(lambda s: not marked(s), "that eval unmarked")
    term.press("g", "Space")
    term.wait_for(lambda s: marked(s) == [next(EVAL_ROW.finditer(s))["label"]], "the first eval marked")
    term.press("Down")
    term.press("Space")
    pair = term.wait_for(lambda s: len(marked(s)) == 2 and marked(s), "two evals marked")
    a, b = sorted(pair, key=step_order)
    term.press("c")
    term.wait_for("shared examples", "the Compare screen")
    title = term.screen
    assert re.search(rf"Compare · reverse-text · A: {a} \({REWARD}\) → B: {b} \({REWARD}\)", title), title
    assert "4 shared examples" in title and "B - A" in title

    # ----- 6. environments -------------------------------------------------------------------
    for screen in ("Checkpoints · ", "Training · ", " Runs · "):
        term.press("Escape")
        term.wait_for(screen, f"back on {screen.strip(' ·')}")
    term.press("E")
    row = term.wait_for(
        re.compile(rf"^ reverse-text +SingleTurnEnv +bundled +({REWARD})", re.MULTILINE),
        "reverse-text listed with its last eval's reward",
    )
    listed = re.findall(
        r"^ ([a-z][\w-]*) +\w+Env +(?:workspace|bundled|installed) ", term.screen, re.MULTILINE
    )
    assert re.search(r"Environments · \d+: ", term.screen) and {"alphabet-sort", "gsm8k"} <= set(listed)
    for _ in range(listed.index("reverse-text")):
        term.press("Down")
    term.wait_for("reverse-text  SingleTurnEnv · bundled", "reverse-text's details")
    term.wait_for(re.compile(rf"model .* · reward {row[1]} · 8/8"), "its last eval: the sweep's")

    # ----- 7. config edit --------------------------------------------------------------------
    term.press("Escape")
    term.wait_for(" Runs · ", "back on Runs")
    term.press("C-o")
    term.wait_for(f"Config · {CONFIG}", "the config editor")
    term.wait_for(
        lambda s: "✓ valid" in s and " 1  # workbench train" in term.cursor_line,
        "the dry run's verdict on the config as it is, and the cursor in its text",
    )
    term.press("Down", "Down")
    term.wait_for(lambda s: " 3  max_steps = 2 " in term.cursor_line, "the cursor on line 3")
    term.press("End", "C-u")  # delete the line's text
    term.wait_for(lambda s: "max_steps" not in term.cursor_line, "line 3 emptied")
    term.type(f"max_stepz = {LONG}")
    term.wait_for("line 3: unknown key 'max_stepz' (did you mean", "the misspelt key, at its line")
    assert "✗ invalid" in term.screen and "modified" in term.screen
    term.press("C-u")
    term.wait_for(lambda s: "max_stepz" not in term.cursor_line, "line 3 emptied again")
    term.type(f"max_steps = {LONG}")
    term.wait_for(
        lambda s: "✓ valid" in s and f"max_steps  {LONG}" in s, "valid again, with the new max_steps"
    )
    term.press("C-s")
    term.wait_for(f"Config · {CONFIG} · ctrl+s save", "saved: the title no longer says modified")
    saved = (tiny_workspace / CONFIG).read_text()
    assert f"\nmax_steps = {LONG}\n" in saved and "max_stepz" not in saved
    term.press("C-l")
    term.wait_for(f"Start `workbench train {CONFIG}`?", "the launch confirmation")
    term.press("y")
    term.wait_for(" Runs · ", "back on Runs")

    # ----- 8. resume -------------------------------------------------------------------------
    running = term.wait_for(
        lambda s: (m := run_row("running", LONG).search(s)) and int(m["step"]) >= 1 and m,
        "the new run past its first step",
    )
    long_id = running["id"]
    term.press("g")  # the newest row
    term.press("x")
    term.wait_for("Stop run", "the stop confirmation")
    assert f"Stop training reverse-text {long_id} (pid" in term.screen
    term.press("y")
    stopped = term.wait_for(run_row("stopped", LONG), "the run stopped")
    assert stopped["id"] == long_id
    term.wait_for("R resume · A archive", "the stopped run's keys in the footer")  # drawn a frame later
    (long_dir,) = [p for p in runs.iterdir() if p.name.endswith(long_id)]
    assert list((long_dir / "checkpoints").glob("step_*")), "stopping writes a checkpoint"
    term.press("R")
    term.wait_for("Resume a training run (reverse-text, tiny, stopped)?", "the resume confirmation")
    assert "workbench train --resume" in term.screen
    term.press("y")
    term.wait_for(
        lambda s: (m := run_row("running", LONG).search(s)) and int(m["step"]) > int(stopped["step"]) and m,
        f"the same run going on past step {stopped['step']}",
    )
    bare_launch = re.compile(r"^ +\S+ +train +reverse-text +.+ +(stopped|finished) +- ", re.MULTILINE)
    assert not bare_launch.search(term.screen), "a launch row left beside its resumed run"
    assert sorted(p.name for p in runs.iterdir() if p.is_dir()) == sorted([run_dir.name, long_dir.name])
    term.press("x")
    term.wait_for(f"Stop training reverse-text {long_id} (pid", "the stop confirmation of the resumed run")
    term.press("y")
    term.wait_for(run_row("stopped", LONG), "the resumed run stopped")

    # ----- 9. archive ------------------------------------------------------------------------
    term.press("A")
    term.wait_for(f"Archive a training run (reverse-text, tiny, {long_id})?", "the archive confirmation")
    assert "outputs/archive/outputs/runs/" in term.screen
    term.press("y")
    term.wait_for(f"archived train {long_id}", "the archive's notification")
    term.wait_for(
        lambda s: not re.search(rf"^ +{long_id} ", s, re.MULTILINE) and " 4/4 runs · 0 running" in s,
        "its row gone: the first run and the sweep's three evals left",
    )
    assert not bare_launch.search(term.screen), "a launch row left behind by the archived run"
    archived = tiny_workspace / "outputs" / "archive" / "outputs" / "runs" / long_dir.name
    assert (archived / "metadata.json").is_file() and not long_dir.exists()
    assert sorted(p.name for p in runs.iterdir() if p.is_dir()) == [run_dir.name]

    term.press("q")  # nothing is running: it quits without asking
    term.wait_for_exit()
