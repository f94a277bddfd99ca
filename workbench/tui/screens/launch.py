"""Launch: start a config from configs/{eval,rl,gepa}, or an eval from env + model + n + r, as a
child `workbench` process. The screen closes with the `Launch`, and Runs shows it at once."""

from __future__ import annotations

import shlex

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Footer, Input, Label, OptionList, Select, Static, TabbedContent, TabPane
from textual.widgets.option_list import Option

from workbench.tui.launcher import LaunchSpec, config_spec, eval_args, list_configs
from workbench.tui.screens.base import WorkbenchScreen


def environment_ids() -> list[str]:
    """Workspace and bundled environments, dashed ids (what `eval run` takes)."""
    from workbench.envs.loader import available_environments

    return [source.name.replace("_", "-") for source in available_environments()]


class LaunchScreen(WorkbenchScreen):
    BINDINGS = [
        Binding("ctrl+s", "launch", "Launch", priority=True),
        Binding("ctrl+o", "tab('configs')", "Configs tab", show=False),
        Binding("ctrl+e", "tab('eval')", "Eval tab", show=False),
    ]

    def compose(self) -> ComposeResult:
        configs = list_configs(self.wb.root)
        self.specs = [config_spec(path, self.wb.root) for path in configs]
        yield Static("[b]Launch[/b] · start a run as a child process (it keeps running if you quit)",
                     classes="screen-title")
        with TabbedContent(id="launch-tabs", initial="configs" if configs else "eval"):
            with TabPane("Configs", id="configs"):
                if configs:
                    yield OptionList(*[Option(f"{spec.kind:<5} {spec.args[-1]}", id=str(i))
                                       for i, spec in enumerate(self.specs)], id="config-list")
                else:
                    yield Static("No configs in configs/{eval,rl,gepa}/. Use the Eval tab, or add a TOML "
                                 "whose first line is the command that runs it.", classes="empty")
            with TabPane("Eval", id="eval"):
                with Vertical(id="eval-form"):
                    envs = environment_ids()
                    with Horizontal(classes="field"):
                        yield Label("environment", classes="field-label")
                        default = "reverse-text" if "reverse-text" in envs else envs[0] if envs else Select.BLANK
                        yield Select([(e, e) for e in envs], value=default,
                                     allow_blank=not envs, id="eval-env", compact=True)
                    yield from self._field("model", "eval-model", "tiny", "tiny, a model folder or checkpoint, an endpoint id")
                    yield from self._field("examples (-n)", "eval-n", "20", "", type_="integer")
                    yield from self._field("rollouts (-r)", "eval-r", "4", "", type_="integer")
                    yield from self._field("more args", "eval-extra", "", "e.g. -b http://127.0.0.1:8000/v1 -t 64")
                    yield Button("Launch eval (ctrl+s)", id="eval-launch", variant="primary", compact=True)
        yield Static(id="launch-preview", classes="preview")
        yield Footer()

    @staticmethod
    def _field(label: str, id: str, value: str, placeholder: str, type_: str = "text") -> ComposeResult:
        with Horizontal(classes="field"):
            yield Label(label, classes="field-label")
            yield Input(value, placeholder=placeholder, id=id, type=type_, compact=True)  # type: ignore[arg-type]

    def on_mount(self) -> None:
        self._preview()
        if self.specs:
            self.query_one("#config-list", OptionList).focus()
        else:
            self.query_one("#eval-env").focus()

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        self._preview()

    # ----- building the command -----------------------------------------------------------
    def eval_spec(self) -> LaunchSpec:
        env = self.query_one("#eval-env", Select).value
        if env is Select.BLANK or not isinstance(env, str):
            raise ValueError("pick an environment")
        model = self.query_one("#eval-model", Input).value.strip() or "tiny"
        n = int(self.query_one("#eval-n", Input).value or 0)
        r = int(self.query_one("#eval-r", Input).value or 0)
        if n == 0 or n < -1 or r < 1:
            raise ValueError("examples must be positive (or -1 for all) and rollouts at least 1")
        extra = shlex.split(self.query_one("#eval-extra", Input).value)
        return LaunchSpec("eval", eval_args(env, model, n, r, extra), env, model)

    def config_spec(self) -> LaunchSpec | None:
        if not self.specs:
            return None
        index = self.query_one("#config-list", OptionList).highlighted
        return self.specs[index] if index is not None else None

    def current_spec(self) -> LaunchSpec | None:
        if self.query_one(TabbedContent).active == "configs":
            return self.config_spec()
        return self.eval_spec()

    def _preview(self) -> None:
        try:
            spec = self.current_spec()
            text = f"$ {spec.command}" if spec else "pick a config"
        except ValueError as exc:
            text = f"[red]{exc}[/]"
        self.query_one("#launch-preview", Static).update(text)

    @on(Input.Changed)
    @on(Select.Changed)
    @on(OptionList.OptionHighlighted)
    @on(TabbedContent.TabActivated)
    def _changed(self) -> None:
        self._preview()

    # ----- starting it ----------------------------------------------------------------------
    @on(OptionList.OptionSelected, "#config-list")
    @on(Button.Pressed, "#eval-launch")
    @on(Input.Submitted)
    def action_launch(self) -> None:
        try:
            spec = self.current_spec()
        except ValueError as exc:
            self.notify(str(exc), severity="error")
            return
        if spec is None:
            return
        try:
            launch = self.wb.launcher.start(spec)
        except OSError as exc:
            self.notify(f"could not start: {exc}", severity="error")
            return
        self.dismiss(launch)
