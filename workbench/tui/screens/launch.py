"""Launch: start an eval, a training run or a GEPA run as a child `workbench` process — from a
config in configs/{eval,rl,gepa}, or from a form — with extra `--set KEY=VALUE` overrides.

Nothing starts on the first Enter / ctrl+s: the screen shows the whole command first, and a second
Enter / ctrl+s (or the Start button) starts it; escape goes back to editing. The screen closes with
the `Launch`, and Runs shows it at once. What the commands look like is `launcher`'s business.

A model field's ctrl+l (or its ▾ button) picks from the workspace's models, training runs and
their checkpoints, and the endpoints (the `model_picker` screen); f4 opens the highlighted config
(Configs or Train tab) in the config editor. Escape on a form with edits asks before discarding them."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path
from typing import Any, Literal

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Button, Footer, Input, Label, OptionList, Select, Static, TabbedContent, TabPane
from textual.widgets.option_list import Option

from workbench.config.optimizers import DSPY_OPTIMIZERS, OPTIMIZERS
from workbench.tui.launcher import (
    Launch,
    LaunchSpec,
    config_spec,
    eval_args,
    extra_args,
    gepa_args,
    list_configs,
    set_args,
    start_task,
    with_args,
)
from workbench.tui.screens.base import WorkbenchScreen

TABS = ("configs", "eval", "train", "gepa")
MODEL_FIELDS = ("eval-model", "gepa-model", "gepa-reflection")  # the fields a picker fills
ESTIMATE_DELAY_S = 0.5  # after the last change to the form: typing never starts a dry run per key
ESTIMATE_ROW = re.compile(r"^\s*estimate\s{2,}(\S.*?)\s*$", re.MULTILINE)  # train/plan.py's row


def estimate_row(dry_run_output: str) -> str | None:
    """The 'estimate' row of a training dry run's plan ('about 3 minutes, 250k tokens (from ...)')."""
    found = ESTIMATE_ROW.search(dry_run_output)
    return found.group(1) if found else None


def optimizer_choices() -> list[tuple[str, str]]:
    """(label, value) of each optimizer `gepa run --optimizer` takes (GepaConfig's own list);
    a DSPy one says when the dspy extra is not installed."""
    names = OPTIMIZERS
    has_dspy = importlib.util.find_spec("dspy") is not None
    return [
        (f"{name} (needs the dspy extra)" if name in DSPY_OPTIMIZERS and not has_dspy else name, name)
        for name in names
    ]


def environment_ids() -> list[str]:
    """Workspace and bundled environments, dashed ids (what `eval run` takes)."""
    from workbench.envs.loader import available_environments

    return [source.name.replace("_", "-") for source in available_environments()]


def config_path(spec: LaunchSpec) -> str:
    """The config file a config's command runs (its first line may add flags after it)."""
    return next((arg for arg in spec.args if arg.endswith(".toml")), spec.args[-1])


def positive(text: str, what: str, *, allow_all: bool = False) -> int:
    """A count typed in a form: a positive integer (or -1 for all). ValueError naming the field."""
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{what}: a whole number, got '{text}'") from None
    if value >= 1 or (allow_all and value == -1):
        return value
    raise ValueError(f"{what} must be at least 1" + (" (or -1 for all)" if allow_all else ""))


class LaunchScreen(WorkbenchScreen):
    """Tabs: Configs (any config, by its first line), Eval, Train (an RL config), GEPA."""

    DEFAULT_CSS = """
    LaunchScreen #launch-tabs { height: 1fr; }
    LaunchScreen .launch-form { height: 1fr; padding: 0 2; }
    LaunchScreen .launch-field { height: 1; margin-top: 1; }
    LaunchScreen .launch-label { width: 18; color: $text-muted; }
    LaunchScreen .launch-field Input, LaunchScreen .launch-field Select { width: 1fr; }
    LaunchScreen .launch-form Button { margin-top: 1; }
    LaunchScreen .launch-field Button.pick-model { margin: 0 0 0 1; width: 3; min-width: 3; }
    LaunchScreen #config-pane { height: 1fr; }
    LaunchScreen #config-list { height: 1fr; }
    LaunchScreen #config-pane .launch-field { padding: 0 1; }
    LaunchScreen #launch-confirm { height: auto; padding: 0 1; border: round $warning; display: none; }
    LaunchScreen.confirming #launch-confirm { display: block; }
    LaunchScreen.confirming #launch-preview { display: none; }
    LaunchScreen #confirm-command { height: auto; text-style: bold; }
    LaunchScreen #confirm-buttons { height: auto; margin-top: 1; }
    LaunchScreen #confirm-buttons Button { margin-right: 2; }
    """

    BINDINGS = [
        Binding("ctrl+s", "launch", "Launch", priority=True),
        Binding("ctrl+o", "tab('configs')", "Configs tab", show=False),
        Binding("ctrl+e", "tab('eval')", "Eval tab", show=False),
        Binding("ctrl+t", "tab('train')", "Train tab", show=False),
        Binding("ctrl+g", "tab('gepa')", "GEPA tab", show=False),
        Binding("ctrl+l", "pick_model", "Pick model"),
        Binding("f4", "edit_config", "Edit config"),
    ]

    def __init__(self, tab: str | None = None, env: str | None = None) -> None:
        super().__init__()
        self.initial_tab = tab if tab in TABS else None
        self.initial_env = env  # the Eval and GEPA forms start on this environment
        self.confirming: LaunchSpec | None = None  # the command shown for confirmation
        self.pristine: dict[str, Any] = {}  # every field's value as the form opened: what "edited" means
        self._wanted: list[str] | None = None  # the training command whose estimate is shown

    def compose(self) -> ComposeResult:
        configs = list_configs(self.wb.root)
        self.specs = [config_spec(path, self.wb.root) for path in configs]
        self.train_specs = [spec for spec in self.specs if spec.kind == "train"]
        envs = environment_ids()
        if self.initial_env and self.initial_env not in envs:  # an installed env: found by name
            envs = sorted([*envs, self.initial_env])
        yield Static(
            "[b]Launch[/b] · start a run as a child process (it keeps running if you quit)",
            classes="screen-title",
        )
        with TabbedContent(id="launch-tabs", initial=self.initial_tab or ("configs" if configs else "eval")):
            with TabPane("Configs", id="configs"):
                with Vertical(id="config-pane"):
                    if configs:
                        yield OptionList(
                            *[
                                Option(f"{spec.kind:<5} {config_path(spec)}", id=str(i))
                                for i, spec in enumerate(self.specs)
                            ],
                            id="config-list",
                        )
                    else:
                        yield Static(
                            "No configs in configs/{eval,rl,gepa}/. Use the Eval, Train or GEPA tab, or add "
                            "a TOML whose first line is the command that runs it.",
                            classes="empty",
                        )
                    yield from self._field(
                        "overrides", "config-set", "", "KEY=VALUE ... (--set), e.g. max_steps=20"
                    )
            with TabPane("Eval", id="eval"), VerticalScroll(id="eval-form", classes="launch-form"):
                yield from self._env_field("eval-env", envs, self.initial_env)
                yield from self._model_field(
                    "model", "eval-model", "tiny", "tiny, a model folder or checkpoint, an endpoint id"
                )
                yield from self._field("examples (-n)", "eval-n", "20", "", type_="integer")
                yield from self._field("rollouts (-r)", "eval-r", "4", "", type_="integer")
                yield from self._field(
                    "overrides", "eval-set", "", "KEY=VALUE ... (--set), e.g. max_tokens=64"
                )
                yield from self._field(
                    "more args", "eval-extra", "", "e.g. -b http://127.0.0.1:8000/v1 -t 64"
                )
                yield Button("Launch eval (ctrl+s)", id="eval-launch", variant="primary", compact=True)
            with TabPane("Train", id="train"), VerticalScroll(id="train-form", classes="launch-form"):
                with Horizontal(classes="launch-field"):
                    yield Label("config", classes="launch-label")
                    options = [(config_path(spec), config_path(spec)) for spec in self.train_specs]
                    yield Select(
                        options,
                        value=options[0][1] if options else Select.NULL,
                        allow_blank=not options,
                        prompt="no configs in configs/rl/",
                        id="train-config",
                        compact=True,
                    )
                yield from self._field(
                    "overrides", "train-set", "", "KEY=VALUE ... (--set), e.g. max_steps=20 seed=1"
                )
                yield from self._field("more args", "train-extra", "", "e.g. --nproc 2")
                yield Button("Launch training (ctrl+s)", id="train-launch", variant="primary", compact=True)
            with TabPane("GEPA", id="gepa"), VerticalScroll(id="gepa-form", classes="launch-form"):
                yield from self._env_field("gepa-env", envs, self.initial_env)
                with Horizontal(classes="launch-field"):
                    yield Label("optimizer", classes="launch-label")
                    yield Select(
                        optimizer_choices(),
                        value="gepa",
                        allow_blank=False,
                        id="gepa-optimizer",
                        compact=True,
                    )
                yield from self._model_field(
                    "model (-m)", "gepa-model", "tiny", "the model whose prompt is optimized"
                )
                yield from self._model_field(
                    "reflection (-M)", "gepa-reflection", "", "reflection model (default: the model)"
                )
                yield from self._field("budget (-B)", "gepa-budget", "300", "metric calls", type_="integer")
                yield from self._field("train ex. (-n)", "gepa-n", "50", "", type_="integer")
                yield from self._field("val ex. (-N)", "gepa-val", "30", "", type_="integer")
                yield from self._field(
                    "overrides", "gepa-set", "", "KEY=VALUE ... (--set), e.g. minibatch_size=4"
                )
                yield from self._field("more args", "gepa-extra", "", "e.g. -b http://127.0.0.1:8000/v1")
                yield Button("Launch GEPA (ctrl+s)", id="gepa-launch", variant="primary", compact=True)
        yield Static(id="launch-preview", classes="preview")
        yield Static(id="launch-estimate", classes="preview")  # a training run's, from its dry run
        with Vertical(id="launch-confirm") as box:
            box.border_title = "Start this?"
            yield Static(id="confirm-command")
            with Horizontal(id="confirm-buttons"):
                yield Button("Start (enter)", id="confirm-start", variant="success", compact=True)
                yield Button("Edit (escape)", id="confirm-edit", compact=True)
        yield Footer()

    @staticmethod
    def _field(
        label: str,
        id: str,
        value: str,
        placeholder: str,
        type_: Literal["integer", "number", "text"] = "text",
    ) -> ComposeResult:
        with Horizontal(classes="launch-field"):
            yield Label(label, classes="launch-label")
            yield Input(value, placeholder=placeholder, id=id, type=type_, compact=True)

    @staticmethod
    def _model_field(label: str, id: str, value: str, placeholder: str) -> ComposeResult:
        """A model input with a ▾ button that opens the model picker (as ctrl+l does)."""
        with Horizontal(classes="launch-field"):
            yield Label(label, classes="launch-label")
            yield Input(value, placeholder=placeholder, id=id, compact=True)
            yield Button(
                "▾", id=f"{id}-pick", classes="pick-model", compact=True, tooltip="pick a model (ctrl+l)"
            )

    @staticmethod
    def _env_field(id: str, envs: list[str], env: str | None = None) -> ComposeResult:
        with Horizontal(classes="launch-field"):
            yield Label("environment", classes="launch-label")
            default = (
                env
                if env in envs
                else "reverse-text"
                if "reverse-text" in envs
                else envs[0]
                if envs
                else Select.NULL
            )
            yield Select([(e, e) for e in envs], value=default, allow_blank=not envs, id=id, compact=True)

    def on_mount(self) -> None:
        self._preview()
        self._focus_tab(self.query_one(TabbedContent).active)
        self.pristine = self._fields()

    def _fields(self) -> dict[str, Any]:
        """Every form field's value, by id."""
        return {
            widget.id: widget.value
            for widget in [*self.query(Input), *self.query(Select)]
            if widget.id is not None
        }

    @property
    def edited(self) -> bool:
        """True once a field differs from what the form opened with."""
        return self._fields() != self.pristine

    def _focus_tab(self, tab: str) -> None:
        first = {
            "configs": "#config-list" if self.specs else "#config-set",
            "eval": "#eval-model" if self.initial_env else "#eval-env",
            "train": "#train-config",
            "gepa": "#gepa-env",
        }[tab]
        self.query_one(first).focus()

    def action_tab(self, tab: str) -> None:
        if self.confirming is not None:
            return
        self.query_one(TabbedContent).active = tab
        self._focus_tab(tab)
        self._preview()

    # ----- building the command -----------------------------------------------------------
    def _value(self, id: str) -> str:
        return self.query_one(f"#{id}", Input).value.strip()

    def _env(self, id: str) -> str:
        env = self.query_one(f"#{id}", Select).value
        if env is Select.NULL or not isinstance(env, str):
            raise ValueError("pick an environment")
        return env

    def eval_spec(self) -> LaunchSpec:
        env = self._env("eval-env")
        model = self._value("eval-model") or "tiny"
        n = positive(self._value("eval-n"), "examples", allow_all=True)
        r = positive(self._value("eval-r"), "rollouts")
        extra = set_args(self._value("eval-set")) + extra_args(self._value("eval-extra"))
        return LaunchSpec("eval", eval_args(env, model, n, r, extra), env, model)

    def train_spec(self) -> LaunchSpec:
        chosen = self.query_one("#train-config", Select).value
        spec = next((spec for spec in self.train_specs if config_path(spec) == chosen), None)
        if spec is None:
            raise ValueError("no training config: add one to configs/rl/ (workbench setup writes examples)")
        extra = set_args(self._value("train-set")) + extra_args(self._value("train-extra"))
        return with_args(spec, extra)  # the config's own command, and more

    def gepa_spec(self) -> LaunchSpec:
        env = self._env("gepa-env")
        model = self._value("gepa-model") or "tiny"
        optimizer = self.query_one("#gepa-optimizer", Select).value
        chosen = ["--optimizer", optimizer] if isinstance(optimizer, str) and optimizer != "gepa" else []
        args = gepa_args(
            env,
            model,
            self._value("gepa-reflection") or None,
            positive(self._value("gepa-budget"), "budget"),
            positive(self._value("gepa-n"), "train examples", allow_all=True),
            positive(self._value("gepa-val"), "validation examples", allow_all=True),
            chosen + set_args(self._value("gepa-set")) + extra_args(self._value("gepa-extra")),
        )
        return LaunchSpec("gepa", args, env, model)

    def config_spec(self) -> LaunchSpec | None:
        if not self.specs:
            return None
        index = self.query_one("#config-list", OptionList).highlighted
        if index is None:
            return None
        return with_args(self.specs[index], set_args(self._value("config-set")))

    def current_spec(self) -> LaunchSpec | None:
        """The command of the active tab; ValueError (one line, for the user) when a field is wrong."""
        tab = self.query_one(TabbedContent).active
        if tab == "configs":
            return self.config_spec()
        return {"eval": self.eval_spec, "train": self.train_spec, "gepa": self.gepa_spec}[tab]()

    def _preview(self) -> None:
        try:
            spec = self.current_spec()
            text = f"$ {spec.command}" if spec else "pick a config"
        except ValueError as exc:
            spec, text = None, f"[red]{exc}[/]"
        self.query_one("#launch-preview", Static).update(text)
        self._wanted = spec.args if spec is not None and spec.kind == "train" else None
        self.query_one("#launch-estimate", Static).update("estimate: …" if self._wanted else "")
        if self._wanted:
            wanted = self._wanted
            self.set_timer(
                ESTIMATE_DELAY_S, lambda: self._estimate(wanted) if wanted == self._wanted else None
            )

    @work(group="estimate", thread=True, exit_on_error=False)
    def _estimate(self, args: list[str]) -> None:
        """How long the run would take here: the estimate row of its dry run, in a child (the TUI
        imports no trainer; the estimate reads outputs/timings.jsonl: workbench/train/estimate.py)."""
        output = ""
        try:
            proc = start_task(self.wb.launcher, [*args, "--dry-run"], columns=400)  # one row, unwrapped
            output = proc.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
        except OSError:
            pass
        row = estimate_row(output) or "unavailable (the dry run says why: f4 opens the config)"
        if args == self._wanted and self.is_mounted:
            self.app.call_from_thread(self.query_one("#launch-estimate", Static).update, f"estimate: {row}")

    @on(Input.Changed)
    @on(Select.Changed)
    @on(OptionList.OptionHighlighted)
    @on(TabbedContent.TabActivated)
    def _changed(self) -> None:
        self._preview()

    # ----- confirming, then starting ----------------------------------------------------------
    @on(OptionList.OptionSelected, "#config-list")
    @on(Button.Pressed, "#eval-launch, #train-launch, #gepa-launch")
    @on(Input.Submitted)
    def action_launch(self) -> None:
        """First press: show the command. Second press (or the Start button): start it."""
        if self.confirming is not None:
            self._start(self.confirming)
            return
        try:
            spec = self.current_spec()
        except ValueError as exc:
            self.notify(str(exc), severity="error")
            return
        if spec is None:
            self.notify("pick a config first", severity="warning")
            return
        self.confirming = spec
        self.query_one("#confirm-command", Static).update(f"$ {spec.command}")
        self.query_one(TabbedContent).disabled = True  # nothing changes under the shown command
        self.add_class("confirming")
        self.query_one("#confirm-start", Button).focus()

    @on(Button.Pressed, "#confirm-start")
    def _start_pressed(self) -> None:
        if self.confirming is not None:
            self._start(self.confirming)

    @on(Button.Pressed, "#confirm-edit")
    def _edit_pressed(self) -> None:
        self.action_back()

    def action_back(self) -> None:
        """Escape: from the confirmation back to editing; from editing back to Runs (after asking,
        when a field was edited: a whole form is not lost to one stray key)."""
        if self.confirming is None:
            if self.edited:
                self.open(
                    "confirm",
                    "Discard your edits to the launch form?",
                    title="Discard edits",
                    yes="Discard",
                    no="Keep editing",
                    callback=self._discard,
                )
                return
            super().action_back()
            return
        self.confirming = None
        self.remove_class("confirming")
        tabs = self.query_one(TabbedContent)
        tabs.disabled = False
        self._focus_tab(tabs.active)

    def _discard(self, yes: object) -> None:
        if yes is True:
            self.dismiss(None)

    def _start(self, spec: LaunchSpec) -> None:
        try:
            launch = self.wb.launcher.start(spec)
        except OSError as exc:
            self.notify(f"could not start: {exc}", severity="error")
            return
        self.dismiss(launch)

    # ----- the model picker and the config editor ---------------------------------------------
    @on(Button.Pressed, ".pick-model")
    def _pick_pressed(self, event: Button.Pressed) -> None:
        if event.button.id is not None:
            self._pick_into(event.button.id.removesuffix("-pick"))

    def action_pick_model(self) -> None:
        """ctrl+l: pick the focused model field's model (the Eval or GEPA form's model otherwise)."""
        if self.confirming is not None:
            return
        focused = self.focused.id if self.focused is not None else None
        tab = self.query_one(TabbedContent).active
        if focused not in MODEL_FIELDS:
            focused = {"eval": "eval-model", "gepa": "gepa-model"}.get(tab)
        if focused is None:
            self.notify("the Eval and GEPA forms have model fields (ctrl+e, ctrl+g)", severity="warning")
            return
        self._pick_into(focused)

    def _pick_into(self, field_id: str) -> None:
        field = self.query_one(f"#{field_id}", Input)

        def picked(value: object) -> None:
            if isinstance(value, str) and value:
                field.value = value
            field.focus()

        self.open("model_picker", current=field.value, callback=picked)

    def action_edit_config(self) -> None:
        """f4: the highlighted config (Configs tab) or the chosen one (Train tab) in the editor."""
        if self.confirming is not None:
            return
        tab = self.query_one(TabbedContent).active
        spec = self.config_spec() if tab == "configs" else None
        if tab == "train":
            chosen = self.query_one("#train-config", Select).value
            spec = next((s for s in self.train_specs if config_path(s) == chosen), None)
        if spec is None:
            self.notify("pick a config on the Configs or Train tab first", severity="warning")
            return
        path = Path(config_path(spec))
        self.open("config_editor", path if path.is_absolute() else self.wb.root / path, callback=self._edited)

    def _edited(self, result: object) -> None:
        """Back from the editor: a run it started closes this screen too (Runs follows it); else the
        configs are read again (a saved edit may change a config's first line: its command)."""
        if isinstance(result, Launch):
            self.dismiss(result)
            return
        for i, spec in enumerate(self.specs):
            path = Path(config_path(spec))
            self.specs[i] = config_spec(path if path.is_absolute() else self.wb.root / path, self.wb.root)
        self.train_specs = [s for s in self.specs if s.kind == "train"]
        self._preview()
