"""What the launcher's model picker offers for `-m`: the workspace's models (outputs/models), its
training runs and their checkpoints, and the endpoints of configs/endpoints.toml.

Each choice is the exact text `-m` takes, relative to the workspace where it is a folder in it.
Checkpoints are listed by the store's rule (`store.checkpoints.list_checkpoints`: complete ones
only). The endpoint registry is read for its ids only, with tomllib: its loader
(`inference.endpoints`) comes with the HTTP client, which the TUI never imports; a mistake in
the file is the run's to report, in full, when it starts.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from workbench.store.checkpoints import checkpoint_step, list_checkpoints, read_step_info
from workbench.tui.data.runs import RunInfo
from workbench.workspace import NAMED_MODELS, TINY_MODEL_NAME, endpoints_path, runs_dir

GROUPS = ("models", "runs", "checkpoints", "endpoints")


@dataclass(frozen=True)
class ModelChoice:
    """One thing `-m` can name."""

    value: str  # what goes into the model field
    group: str  # models | runs | checkpoints | endpoints
    detail: str = ""  # a few words that tell it apart (its step and reward, an endpoint's URL)

    def matches(self, query: str) -> bool:
        text = f"{self.value} {self.group} {self.detail}".lower()
        return all(word in text for word in query.lower().split())


def _shown(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def local_models(root: Path) -> list[ModelChoice]:
    """The embedded `tiny` (built on first use when it is not there yet), then every model folder
    in outputs/models: named models by name, others by path."""
    folder = root / "outputs" / "models"
    found = [p for p in sorted(folder.iterdir()) if (p / "config.json").is_file()] if folder.is_dir() else []
    choices = []
    if not any(p.name == TINY_MODEL_NAME for p in found):
        choices.append(ModelChoice(TINY_MODEL_NAME, "models", "the embedded model (built on first use)"))
    for path in found:
        name = path.name if path.name in NAMED_MODELS else _shown(path, root)
        choices.append(ModelChoice(name, "models", _shown(path, root)))
    return choices


def run_models(root: Path, runs: list[RunInfo]) -> list[ModelChoice]:
    """Training runs that have a complete checkpoint (a run folder means its newest one), newest
    run first, then `outputs/runs/latest`, then every checkpoint of each run, newest step first."""
    trained = [(run, list_checkpoints(run.path)) for run in runs if run.kind == "train" and not run.is_launch]
    trained = [(run, steps) for run, steps in trained if steps]
    choices = []
    if trained:
        latest = _shown(runs_dir(root) / "latest", root)
        choices.append(ModelChoice(latest, "runs", "the newest run's newest checkpoint, when it starts"))
    for run, steps in trained:
        detail = f"{run.env} · {run.status} · newest checkpoint step {checkpoint_step(steps[-1])}"
        choices.append(ModelChoice(_shown(run.path, root), "runs", detail))
    for run, steps in trained:
        for checkpoint in reversed(steps):
            choices.append(
                ModelChoice(_shown(checkpoint, root), "checkpoints", _checkpoint_detail(run, checkpoint))
            )
    return choices


def _checkpoint_detail(run: RunInfo, checkpoint: Path) -> str:
    words = [f"{run.path.name} step {checkpoint_step(checkpoint)}"]
    try:
        state = read_step_info(checkpoint)
    except (OSError, ValueError):
        return words[0]
    for key, label in (("reward_mean", "reward"), ("eval_reward_mean", "held out")):
        value = state.get(key)
        if isinstance(value, int | float):
            words.append(f"{label} {value:.3f}")
    return " · ".join(words)


def endpoint_models(root: Path) -> tuple[list[ModelChoice], str | None]:
    """(one choice per endpoint id, a note when configs/endpoints.toml cannot be read)."""
    path = endpoints_path(root)
    if not path.is_file():
        return [], None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return [], f"{_shown(path, root)} cannot be read ({str(exc).splitlines()[0]}): no endpoints listed"
    entries = data.get("endpoint")
    replicas: dict[str, list[dict[str, object]]] = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("endpoint_id"), str):
            replicas.setdefault(entry["endpoint_id"], []).append(entry)
    choices = []
    for endpoint_id, entries_of in replicas.items():
        first = entries_of[0]
        detail = f"{first.get('model', '?')} at {_without_credentials(str(first.get('url', '?')))}"
        if len(entries_of) > 1:
            detail += f" (+{len(entries_of) - 1} replicas)"
        choices.append(ModelChoice(endpoint_id, "endpoints", detail))
    return choices, None


def _without_credentials(url: str) -> str:
    """The URL without a `user:password@` part: a password in a URL is never shown."""
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl() if parts.netloc else url


def model_choices(root: Path, runs: list[RunInfo]) -> tuple[list[ModelChoice], list[str]]:
    """Every choice, grouped in `GROUPS` order, and notes about what could not be read."""
    endpoints, note = endpoint_models(root)
    return [*local_models(root), *run_models(root, runs), *endpoints], [note] if note else []
