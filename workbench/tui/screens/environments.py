"""Environments: every environment this workspace can run — its own (environments/), the bundled
ones and installed packages — with its kind, its `load_environment` arguments, its README and its
newest eval; create one (`env init`), install one (`env install`), or evaluate one (Enter opens
the launcher's Eval form on it).

The list is what `workbench env list --json` prints, run as a child process (describing an
environment imports its module, which the TUI never does), so it appears a moment after the screen.
`env init` and `env install` run as children too, their output in a pane under the details; the
list is read again when one ends.
"""

from __future__ import annotations

import asyncio
import shlex
import subprocess
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Footer, Log, Markdown, Static

from workbench.store.results import RESULTS
from workbench.tui.data.environments import (
    ENV_LIST_ARGS,
    EnvEntry,
    argument_lines,
    env_list_failure,
    latest_evals,
    origin_order,
    parse_env_list,
    readme_of,
)
from workbench.tui.data.runs import RunCatalog, RunInfo
from workbench.tui.launcher import Launch, start_task
from workbench.tui.screens.base import WorkbenchScreen
from workbench.tui.widgets.format import status_text
from workbench.tui.widgets.prompt_bar import PromptBar
from workbench.tui.widgets.virtual_table import VirtualTable

COLUMNS = (("environment", 18), ("kind", 13), ("origin", 9), ("last eval", 9))
LIST_TIMEOUT_S = 300  # describing every environment imports each; a slow disk may take a while


class EnvironmentsScreen(WorkbenchScreen):
    """The environment table on the left, the highlighted one's details on the right."""

    BINDINGS = [
        Binding("enter", "evaluate", "Evaluate"),
        Binding("n", "new", "New env"),
        Binding("i", "install", "Install"),
        Binding("r", "rollouts", "Last eval"),
        Binding("ctrl+r", "reload", "Reload"),
    ]

    def __init__(self, select: str | None = None) -> None:
        super().__init__()
        self.entries: list[EnvEntry] = []
        self.last_evals: dict[str, RunInfo] = {}
        self.loaded = False  # the first listing arrived (or failed)
        self.error: str | None = None  # why the listing failed
        self.command: subprocess.Popen[str] | None = None  # env init / env install while it runs
        self._select = select  # highlight this env id once listed

    def compose(self) -> ComposeResult:
        yield Static("[b]Environments[/b] · reading them…", id="envs-title", classes="screen-title")
        with Horizontal(id="envs-body"):
            yield VirtualTable(COLUMNS, id="envs-table", open_label="Evaluate")
            with VerticalScroll(id="env-detail"):
                yield Static(id="env-summary")
                yield Markdown(id="env-readme")
        yield Log(id="env-task-log", max_lines=2000)
        yield PromptBar(id="envs-prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#env-task-log").display = False
        self.query_one(VirtualTable).focus()
        self.reload()

    @property
    def current(self) -> EnvEntry | None:
        index = self.query_one(VirtualTable).cursor_index
        return self.entries[index] if index is not None and index < len(self.entries) else None

    # ----- reading the environments and their last evals ------------------------------------
    def action_reload(self) -> None:
        self.reload()

    @work(group="envs", exclusive=True)
    async def reload(self) -> None:
        """List the environments (a child `workbench env list --json`) and the workspace's evals."""
        listing, runs = await asyncio.gather(
            asyncio.to_thread(self._list_environments), asyncio.to_thread(RunCatalog(self.wb.root).scan)
        )
        if self.closing:
            return
        self.loaded = True
        entries, self.error = listing
        if self.error is None:
            self.entries = origin_order(entries)
        self.last_evals = latest_evals(runs)
        self._show()

    def _list_environments(self) -> tuple[list[EnvEntry], str | None]:
        try:
            proc = start_task(self.wb.launcher, ENV_LIST_ARGS)
        except OSError as exc:
            return [], f"cannot start workbench env list: {exc}"
        try:
            output, _ = proc.communicate(timeout=LIST_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return [], f"workbench env list took over {LIST_TIMEOUT_S} s"
        if proc.returncode != 0:
            return [], env_list_failure(output, proc.returncode)
        try:
            # Only the JSON: a warning an environment prints while it imports may come before it.
            return parse_env_list(output[output.index("[") :]), None
        except ValueError as exc:
            return [], f"workbench env list printed something else ({exc})"

    def _show(self) -> None:
        table = self.query_one(VirtualTable)
        rows = [self._row(entry) for entry in self.entries]
        keys = [entry.env_id for entry in self.entries]
        select = self._select or table.cursor_key
        table.set_rows(rows, keys.index(select) if select in keys else None, keys=keys)
        self._select = None
        counts = {o: sum(e.origin == o for e in self.entries) for o in ("workspace", "bundled", "installed")}
        title = f"[b]Environments[/b] · {len(self.entries)}: " + ", ".join(
            f"{n} {o}" for o, n in counts.items()
        )
        if self.error:
            title = f"[b]Environments[/b] · [red]could not list them: {self.error}[/]"
        self.query_one("#envs-title", Static).update(title)
        self._show_detail()

    def _row(self, entry: EnvEntry) -> list[str | Text]:
        run = self.last_evals.get(entry.env_id)
        reward = "-" if run is None or run.reward is None else f"{run.reward:.3f}"
        name = Text(entry.env_id, style="red") if entry.error else entry.env_id
        return [name, entry.kind, entry.origin, reward]

    @on(VirtualTable.Highlighted, "#envs-table")
    def _highlighted(self) -> None:
        self._show_detail()

    def _show_detail(self) -> None:
        entry = self.current
        summary = self.query_one("#env-summary", Static)
        readme = self.query_one("#env-readme", Markdown)
        if entry is None:
            summary.update("" if not self.loaded else "No environments. Press [b]n[/b] to create one.")
            readme.update("")
            return
        summary.update(self._summary(entry))
        text = readme_of(entry)
        readme.update(text if text is not None else "*No README.*")

    def _summary(self, entry: EnvEntry) -> Text:
        text = Text()
        text.append(entry.env_id, style="bold")
        text.append(f"  {entry.kind} · {entry.origin}\n", style="dim")
        if entry.error:
            text.append(f"{entry.error}\n", style="red")
        elif entry.description:
            text.append(f"{entry.description}\n")
        if entry.origin == "bundled":  # its folder is inside workbench's own files: not the user's
            text.append("bundled with workbench\n", style="dim")
        elif entry.location:
            text.append(f"{self._shown(entry.location)}\n", style="dim")
        text.append("\nArguments", style="bold")
        text.append("  (eval run -a '{\"name\": value}')\n", style="dim")
        for line in argument_lines(entry) or ["none"]:
            text.append(f"  {line}\n")
        text.append("\nLast eval\n", style="bold")
        run = self.last_evals.get(entry.env_id)
        if run is None:
            text.append("  none yet: press ⏎ to evaluate\n", style="dim")
        else:
            text.append(f"  {run.run_id} · ")
            text.append_text(status_text(run.status))
            reward = "-" if run.reward is None else f"{run.reward:.3f}"
            when = run.created_at.strftime("%Y-%m-%d %H:%M") if run.created_at else "-"
            text.append(f"\n  model {run.model_label} · reward {reward} · {run.progress} · {when}\n")
        return text

    def _shown(self, location: str) -> str:
        root = str(self.wb.root)
        return location[len(root) + 1 :] if location.startswith(root + "/") else location

    # ----- actions ----------------------------------------------------------------------------
    @on(VirtualTable.Selected, "#envs-table")
    def action_evaluate(self) -> None:
        """Enter: the launcher's Eval form on this environment."""
        entry = self.current
        if entry is None:
            return

        def launched(launch: Any) -> None:
            if isinstance(launch, Launch):
                self.notify(f"started: {launch.command} (Runs shows it: escape)", title="launched")

        self.open("launch", tab="eval", env=entry.env_id, callback=launched)

    def action_rollouts(self) -> None:
        entry = self.current
        run = self.last_evals.get(entry.env_id) if entry is not None else None
        if run is None:
            self.notify("no eval of this environment yet: press ⏎ to run one", severity="warning")
            return
        results = run.path / RESULTS
        if not results.is_file():
            self.notify("its newest eval has no rollouts yet", severity="warning")
            return
        self.open("rollouts", results, run=run, label="results")

    def action_new(self) -> None:
        if self._busy():
            return
        self.query_one(PromptBar).ask("init", "new environment id, e.g. my-env (workbench env init)")

    def action_install(self) -> None:
        if self._busy():
            return
        entry = self.current
        self.query_one(PromptBar).ask(
            "install",
            "env id, folder, .whl or owner/name[@version] (workbench env install)",
            entry.env_id if entry is not None and entry.origin == "workspace" else "",
        )

    @on(PromptBar.Answered)
    def _answered(self, event: PromptBar.Answered) -> None:
        value = event.value.strip()
        if not value:
            return
        if event.purpose == "init":
            self.run_task(["env", "init", value], select=value)
        elif event.purpose == "install":
            try:  # shell words: a path with spaces in quotes, or a flag (--dry-run) after the target
                words = shlex.split(value)
            except ValueError as exc:
                self.notify(f"install: {exc}", severity="error")
                return
            self.run_task(["env", "install", *words], select=None)

    def _busy(self) -> bool:
        if self.command is not None:
            self.notify("wait for the running command to end", severity="warning")
            return True
        return False

    @work(group="env-task", thread=True)
    def run_task(self, args: list[str], select: str | None) -> None:
        """Run `workbench ARGS` (env init / install), its output in the pane; then list again."""
        self._from_thread(self._task_started, args)
        try:
            proc = start_task(self.wb.launcher, args)
        except OSError as exc:
            self._from_thread(self._task_line, f"error: cannot start it: {exc}")
            return
        self.command = proc
        assert proc.stdout is not None
        for line in proc.stdout:  # read to the end even if the screen closed: pip must not block
            self._from_thread(self._task_line, line.rstrip("\n"))
        code = proc.wait()
        self.command = None
        self._from_thread(self._task_ended, args, code, select)

    def _from_thread(self, callback: Any, *args: Any) -> None:
        try:
            self.app.call_from_thread(callback, *args)
        except RuntimeError:  # the app is gone (quit): nothing left to show it on
            pass

    def _task_started(self, args: list[str]) -> None:
        log = self.query_one("#env-task-log", Log)
        log.clear()
        log.display = True
        log.border_title = "$ workbench " + " ".join(args)
        log.write_line(f"$ workbench {' '.join(args)}")

    def _task_line(self, line: str) -> None:
        if not self.closing:
            self.query_one("#env-task-log", Log).write_line(line)

    def _task_ended(self, args: list[str], code: int, select: str | None) -> None:
        if self.closing:
            return
        what = " ".join(args[:2])
        if code == 0:
            self.notify(f"{what}: done", title="environments")
            self._select = select.replace("_", "-") if select else None
            self.reload()
        else:
            self.notify(f"{what} failed (exit code {code}): see its output", severity="error")
