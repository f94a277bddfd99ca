"""Configs: view and edit any TOML under configs/, checked as you type, saved with ctrl+s, started
with ctrl+l.

The check has two stages, both a moment after the last keystroke: the TOML syntax (tomllib, here),
then the config's dry run (`workbench train CONFIG --dry-run`, `gepa run CONFIG --dry-run`) in a
child process — the dry run loads the environments a config names, which the TUI never does. The
side pane shows the verdict, each problem with its line, and the plan; a line with a problem is
marked in the editor's gutter, and ctrl+g moves the cursor to the first. A newer edit cancels a
dry run still going. Unsaved text is checked as a dot-file beside the config (`data.configs`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.geometry import Offset
from textual.strip import Strip
from textual.timer import Timer
from textual.widgets import Footer, OptionList, Static, TextArea
from textual.widgets.option_list import Option

from workbench.tui.data.configs import (
    DryRun,
    Problem,
    check_path,
    config_files,
    dry_run_args,
    read_dry_run,
    run_spec,
    syntax_problem,
)
from workbench.tui.launcher import start_task
from workbench.tui.screens.base import WorkbenchScreen

CHECK_DELAY_S = 0.6  # after the last keystroke: typing never waits on a check
DRY_RUN_TIMEOUT_S = 300
ERROR_GUTTER = Style(color="white", bgcolor="red", bold=True)


class ConfigTextArea(TextArea):
    """A TOML TextArea whose gutter marks the lines that have a problem (`error_lines`, 0-based)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error_lines: set[int] = set()

    def mark(self, lines: set[int]) -> None:
        if lines != self.error_lines:
            self.error_lines = lines
            self.refresh()

    def render_line(self, y: int) -> Strip:
        strip = super().render_line(y)
        gutter = self.gutter_width
        row = y + self.scroll_offset.y
        if not self.error_lines or not gutter or row >= self.wrapped_document.height:
            return strip
        line, _ = self.wrapped_document.offset_to_location(Offset(0, row))
        if line not in self.error_lines:
            return strip
        marked = Strip(Segment.apply_style(list(strip.crop(0, gutter)), post_style=ERROR_GUTTER), gutter)
        return Strip.join([marked, strip.crop(gutter, strip.cell_length)])


class ConfigEditorScreen(WorkbenchScreen):
    """`ConfigEditorScreen(path=None)`: the configs on the left, the text, the check on the right.
    Dismisses with the `Launch` when ctrl+l started the config, else None."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (130, "-wide")]  # the side panes narrow at 100 columns
    BINDINGS = [
        Binding("ctrl+s", "save", "Save", priority=True),
        Binding("ctrl+l", "launch", "Launch"),
        Binding("ctrl+g", "goto_error", "Go to error"),
        Binding("ctrl+o", "files", "Open config"),
    ]

    def __init__(self, path: Path | None = None) -> None:
        super().__init__()
        self.path: Path | None = path.resolve() if path is not None else None
        self.saved_text = ""  # the file's text as last read or saved: what "edited" compares with
        self.result: DryRun | None = None  # the newest finished dry run
        self.problems: list[Problem] = []  # syntax problem, else the dry run's
        self.checking = False
        self.check_command = ""  # the dry run that checks this config, as a user would type it
        self._timer: Timer | None = None
        self._generation = 0  # bumped by every edit: a check of older text is dropped
        self._proc: subprocess.Popen[str] | None = None  # the dry run in flight

    def compose(self) -> ComposeResult:
        yield Static(id="editor-title", classes="screen-title")
        with Horizontal(id="editor-body"):
            yield OptionList(id="editor-files")
            yield ConfigTextArea(
                id="editor-text",
                language=self._toml(),
                show_line_numbers=True,
                soft_wrap=False,
                tab_behavior="focus",  # escape leaves the screen (after asking), tab the editor
            )
            with VerticalScroll(id="editor-check"):
                yield Static(id="check-verdict")
                yield Static(id="check-problems")
                yield Static(id="check-plan", markup=False)
        yield Footer()

    @staticmethod
    def _toml() -> str | None:
        """TOML highlighting where the tree-sitter grammar is installed (a core dependency), plain
        text where it is not."""
        try:
            import tree_sitter_toml  # noqa: F401
        except ImportError:
            return None
        return "toml"

    def on_mount(self) -> None:
        files = config_files(self.wb.root)
        olist = self.query_one("#editor-files", OptionList)
        olist.add_options([Option(str(p.relative_to(self.wb.root / "configs")), id=str(p)) for p in files])
        if self.path is None and files:  # the first config a command runs (not endpoints.toml)
            self.path = next((p for p in files if run_spec(p, self.wb.root) is not None), files[0])
        if self.path is not None:
            self.load(self.path)
            self.query_one(ConfigTextArea).focus()
        else:
            self._title()
            self.query_one("#check-verdict", Static).update(
                "No configs under configs/: `workbench setup` writes them."
            )

    # ----- files ------------------------------------------------------------------------------
    @property
    def edited(self) -> bool:
        return self.query_one(ConfigTextArea).text != self.saved_text

    @property
    def shown_path(self) -> str:
        if self.path is None:
            return "-"
        return (
            str(self.path.relative_to(self.wb.root))
            if self.path.is_relative_to(self.wb.root)
            else str(self.path)
        )

    def load(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.notify(f"cannot read {path}: {exc}", severity="error")
            return
        self.path = path
        self.saved_text = text
        self.query_one(ConfigTextArea).load_text(text)
        olist = self.query_one("#editor-files", OptionList)
        try:
            olist.highlighted = olist.get_option_index(str(path))
        except Exception:  # a config outside configs/ (opened by path): not in the list
            pass
        self._title()
        self._schedule(at_once=True)

    def _title(self) -> None:
        state = " · [yellow]modified[/]" if self.path is not None and self.edited else ""
        self.query_one("#editor-title", Static).update(
            f"[b]Config[/b] · {self.shown_path}{state} · ctrl+s save · ctrl+l launch"
        )

    def action_files(self) -> None:
        self.query_one("#editor-files").focus()

    @on(OptionList.OptionSelected, "#editor-files")
    def _open_selected(self, event: OptionList.OptionSelected) -> None:
        path = Path(str(event.option.id))
        if path == self.path:
            self.query_one(ConfigTextArea).focus()
            return

        def switch(yes: object = True) -> None:
            if yes is True:
                self.load(path)
                self.query_one(ConfigTextArea).focus()

        if self.edited:
            self._ask_discard(f"Discard your edits to {self.shown_path} and open {path.name}?", switch)
        else:
            switch()

    def action_save(self) -> bool:
        if self.path is None:
            return False
        text = self.query_one(ConfigTextArea).text
        try:
            tmp = self.path.with_name(f".{self.path.name}.saving")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, self.path)  # a crash mid-write never leaves half a config
        except OSError as exc:
            self.notify(f"cannot save {self.shown_path}: {exc}", severity="error")
            return False
        self.saved_text = text
        self._title()
        self.notify(f"saved {self.shown_path}", title="config")
        return True

    # ----- checking ---------------------------------------------------------------------------
    @on(TextArea.Changed, "#editor-text")
    def _changed(self) -> None:
        self._title()
        self._schedule()

    def _schedule(self, at_once: bool = False) -> None:
        """Check the text a moment after the last edit (`at_once`: now, the file just opened)."""
        self._generation += 1
        if self._timer is not None:
            self._timer.stop()
        self._stop_dry_run()
        if at_once:
            self.check()
        else:
            self._timer = self.set_timer(CHECK_DELAY_S, self.check)

    def check(self) -> None:
        if self.path is None:
            return
        text = self.query_one(ConfigTextArea).text
        problem = syntax_problem(text)
        spec = run_spec(self.path, self.wb.root)
        args = dry_run_args(spec, self.shown_path) if spec is not None else None
        self.check_command = shlex.join(["workbench", *args]) if args else ""
        if problem is not None:
            self.result, self.problems, self.checking = None, [problem], False
        elif spec is None:
            self.result, self.problems, self.checking = DryRun("unsupported"), [], False
        else:
            self.problems, self.checking = [], True
            self.dry_run(text, self._generation, self._plan_width())
        self._show()

    @work(group="dry-run", thread=True)
    def dry_run(self, text: str, generation: int, columns: int) -> None:
        """The config's dry run in a child, on the text as it is (a check file when it is edited)."""
        assert self.path is not None
        path, spec = self.path, run_spec(self.path, self.wb.root)
        edited = text != self.saved_text
        checked = check_path(path, f"{os.getpid()}-{generation}") if edited else path
        shown = self.shown_path
        rel = str(checked.relative_to(self.wb.root)) if checked.is_relative_to(self.wb.root) else str(checked)
        try:
            if edited:
                checked.write_text(text, encoding="utf-8")
            args = dry_run_args(spec, rel) if spec is not None else None
            if args is None:
                return
            proc = start_task(self.wb.launcher, args, columns=columns)
            self._proc = proc
            if generation != self._generation:  # edited while it started: `_schedule` missed it
                proc.kill()
            try:
                output, _ = proc.communicate(timeout=DRY_RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                output = proc.communicate()[0] + f"\nerror: the dry run took over {DRY_RUN_TIMEOUT_S} s"
        except OSError as exc:
            output, proc = f"error: cannot run the dry run: {exc}", None
        finally:
            if edited:
                checked.unlink(missing_ok=True)
        code = proc.returncode if proc is not None else 1
        if code is not None and code < 0:  # killed: a newer edit superseded it
            return
        result = read_dry_run(output, code if code is not None else 1, rel, shown)
        try:
            self.app.call_from_thread(self._dry_run_done, result, generation)
        except RuntimeError:  # the app has quit
            pass

    def _plan_width(self) -> int:
        return max(40, self.query_one("#editor-check").size.width - 2)

    def _dry_run_done(self, result: DryRun, generation: int) -> None:
        if generation != self._generation or self.closing:
            return
        self.result, self.problems, self.checking = result, list(result.problems), False
        self._show()

    def _stop_dry_run(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()

    def on_unmount(self) -> None:
        self._stop_dry_run()

    def _show(self) -> None:
        verdict = Text()
        if self.problems and self.result is None:
            verdict.append("✗ invalid TOML", style="bold red")
        elif self.checking:
            verdict.append("… checking (dry run)", style="dim")
        elif self.result is not None:
            mark, style = {
                "valid": ("✓", "bold green"),
                "cannot-start": ("!", "bold yellow"),
                "invalid": ("✗", "bold red"),
                "unsupported": ("·", "dim"),
            }[self.result.verdict]
            verdict.append(f"{mark} {self.result.summary}", style=style)
        if self.check_command:
            verdict.append(f"\n$ {self.check_command}", style="dim")
        self.query_one("#check-verdict", Static).update(verdict)
        problems = Text()
        for problem in self.problems:
            where = f"line {problem.line}: " if problem.line else ""
            problems.append(f"\n{where}", style="bold red")
            problems.append(problem.message)
        if any(p.line for p in self.problems):
            problems.append("\nctrl+g: go to the line", style="dim")
        self.query_one("#check-problems", Static).update(problems)
        plan = self.result.plan if self.result is not None and not self.checking else ""
        # The CLI lays a plan out as aligned columns, wider than this pane: two spaces between a
        # row's label and value read as well and wrap far less.
        self.query_one("#check-plan", Static).update(re.sub(r"(?<=\S) {3,}", "  ", plan))
        self.query_one(ConfigTextArea).mark({p.line - 1 for p in self.problems if p.line})

    def action_goto_error(self) -> None:
        line = next((p.line for p in self.problems if p.line), None)
        if line is None:
            self.notify("no problem with a line", severity="information")
            return
        area = self.query_one(ConfigTextArea)
        area.move_cursor((line - 1, 0), center=True)
        area.focus()

    # ----- launching and leaving --------------------------------------------------------------
    def action_launch(self) -> None:
        """ctrl+l: start the config as `launcher.config_spec` runs it (saving edits first), after asking."""
        if self.path is None:
            return
        spec = run_spec(self.path, self.wb.root)
        if spec is None:
            self.notify(f"{self.shown_path} is not a config a command runs", severity="warning")
            return
        save = self.edited
        question = ("Save your edits and start" if save else "Start") + f" `{spec.command}`?"

        def answered(yes: object) -> None:
            if yes is not True or (save and not self.action_save()):
                return
            start = run_spec(self.path, self.wb.root) if self.path is not None else None
            try:
                launch = self.wb.launcher.start(start or spec)  # saved: its first line may have changed
            except OSError as exc:
                self.notify(f"could not start: {exc}", severity="error")
                return
            self.notify(f"started: {launch.command}", title="launched")
            self.dismiss(launch)

        self.open("confirm", question, title="Launch config", yes="Start", no="Not now", callback=answered)

    def action_back(self) -> None:
        if self.path is not None and self.edited:
            self._ask_discard(f"Discard your edits to {self.shown_path}?", lambda yes: self._leave(yes))
            return
        super().action_back()

    def _leave(self, yes: object) -> None:
        if yes is True:
            super().action_back()

    def _ask_discard(self, question: str, callback: Any) -> None:
        self.open(
            "confirm", question, title="Unsaved edits", yes="Discard", no="Keep editing", callback=callback
        )
