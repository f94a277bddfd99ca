"""Load a training config (any accepted style), apply `--set` overrides, validate, and save the
resolved config into the run folder. The schema itself lives in `workbench.train.schema`.

Every mistake is one `UserError` line naming where it is:

    configs/rl/rt.toml:7: unknown key 'sampling.temprature' (did you mean 'sampling.temperature'?)
    --set max_stepz: unknown key 'max_stepz' (did you mean 'max_steps'?)
    prime.toml:31: batch_size (500) must be divisible by rollouts_per_example (16)

Paths in a file (`env_file`, `sft.data_path`) are relative to that file; paths given with
`--set` are relative to the current directory. Both are stored absolute, so a run folder's
saved config.toml works from anywhere (`--resume`).
"""

from __future__ import annotations

import datetime
import os
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from workbench.config.bounds import MAX_NESTING, too_deep
from workbench.config.toml_loader import closest, key_line, read_toml
from workbench.errors import UserError
from workbench.train.schema import (
    CheckpointConfig,
    ConfigProblem,
    DifficultyFilterConfig,
    EnvConfig,
    EvalDuringTrainConfig,
    InferenceConfig,
    KLConfig,
    LoraConfig,
    SamplingConfig,
    SFTConfig,
    TrainConfig,
    WandbConfig,
)
from workbench.train.translate import TOP_LEVEL_ALIASES, Translation, TranslationError, origin, translate

__all__ = [
    "CheckpointConfig",
    "ConfigProblem",
    "DifficultyFilterConfig",
    "EnvConfig",
    "EvalDuringTrainConfig",
    "InferenceConfig",
    "KLConfig",
    "LoraConfig",
    "SFTConfig",
    "SamplingConfig",
    "TrainConfig",
    "WandbConfig",
    "apply_overrides",
    "config_for_saving",
    "load_env_files",
    "load_train_config",
    "parse_override_value",
    "model_notes",
    "run_blockers",
    "save_resolved_config",
]

CONFIG_FILENAME = "config.toml"


class _Source:
    """Where the values came from, to point errors at a file line or a --set flag."""

    def __init__(self, path: Path, text: str, translation: Translation | None, overrides: list[str]) -> None:
        self.path, self.text, self.overrides = path, text, overrides
        self.moves = translation.moves if translation else []

    def shown(self, canonical: str) -> str:
        """The key as the user wrote it (the file's own name for translated keys)."""
        return canonical if self._override(canonical) else origin(self.moves, canonical)

    def where(self, canonical: str) -> str:
        if (flag := self._override(canonical)) is not None:
            return f"--set {flag}"
        line = source_line(self.text, origin(self.moves, canonical)) if canonical else None
        return f"{self.path}:{line}" if line else str(self.path)

    def _override(self, canonical: str) -> str | None:
        for key in reversed(self.overrides):  # the last --set of a key wins
            if key == canonical or key.startswith(canonical + ".") or canonical.startswith(key + "."):
                return key
        return None


def load_train_config(path: Path | str, overrides: list[str] | None = None) -> tuple[TrainConfig, list[str]]:
    """Read `path` (any accepted style), translate, apply `--set KEY=VALUE` overrides, validate.

    Returns the config and notes for the plan (style translation, defaults worth knowing).
    Raises `UserError` with one line naming the file and line (or the --set flag).
    """
    path = Path(path)
    raw, text = read_toml(path)
    try:
        translation = translate(raw)
    except TranslationError as exc:
        where = _Source(path, text, None, []).where(exc.key) if exc.key else str(path)
        raise UserError(f"{where}: {exc}") from exc
    if translation.unknown is not None:
        key, hint = translation.unknown
        suggestion = f" (did you mean '{hint}'?)" if hint else ""
        raise UserError(f"{path}:{source_line(text, key) or '?'}: unknown key '{key}'{suggestion}")
    data, notes = translation.data, list(translation.notes)
    _absolute_paths(data, path.parent)
    keys = apply_overrides(data, overrides or [])
    _absolute_paths(data, Path.cwd())  # what --set gave is relative to where the command runs
    config = validate_train_config(data, _Source(path, text, translation, keys))
    if "model" not in data:
        notes.append("model not set: using 'tiny', the embedded model")
    if overrides:
        notes.append("overrides: " + ", ".join(overrides))
    return config, notes


def validate_train_config(data: dict[str, Any], source: _Source) -> TrainConfig:
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # an unknown key explains more than what its absence leaves missing ('idd' vs missing 'id')
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        raise UserError(_describe(first, source)) from exc


def _describe(err: Any, source: _Source) -> str:
    """One validation error as one line: where, which key (as written), what is wrong."""
    loc = [str(p) for p in err["loc"]]
    problem = (err.get("ctx") or {}).get("error")
    if isinstance(problem, ConfigProblem):
        loc += problem.key.split(".")
    canonical = ".".join(loc)
    where = source.where(canonical)
    if err["type"] == "extra_forbidden":
        owner = _owner(loc)
        valid = list(owner.model_fields) if owner else []
        if len(loc) == 1:
            valid += TOP_LEVEL_ALIASES
        hint = closest(loc[-1], valid)
        suggestion = f" (did you mean '{source.shown('.'.join([*loc[:-1], hint]))}'?)" if hint else ""
        return f"{where}: unknown key '{source.shown(canonical)}'{suggestion}"
    if isinstance(problem, ConfigProblem):
        return f"{where}: {problem}"
    if err["type"] == "missing":
        return f"{where}: missing required key '{source.shown(canonical)}'"
    return f"{where}: key '{source.shown(canonical)}': {err['msg'].removeprefix('Value error, ')}"


def _owner(loc: list[str]) -> type[BaseModel] | None:
    """The model that owns the last key of `loc` (for suggestions)."""
    model: type[BaseModel] | None = TrainConfig
    for part in loc[:-1]:
        if part.isdigit() or model is None:
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        candidates = (field.annotation, *get_args(field.annotation))
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


def source_line(text: str, dotted: str) -> int | None:
    """1-based line of a dotted key in the file: each part searched after the previous one."""
    line: int | None = None
    for part in dotted.split("."):
        if part.isdigit():
            continue
        found = key_line(text, part, after_line=(line - 1) if line else 0)
        if found is None:
            break
        line = found
    return line


def parse_override_value(text: str) -> Any:
    """A --set value as a TOML value (20, 0.8, false, ["a"], {k = 1}); otherwise the string."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        raise UserError(f"--set value nests too deeply (at most {MAX_NESTING} levels)") from None
    if too_deep(value):
        raise UserError(f"--set value nests too deeply (at most {MAX_NESTING} levels)")
    return text if isinstance(value, (datetime.date, datetime.time)) else value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> list[str]:
    """Set each `KEY.PATH=VALUE` on the canonical dict (list items by index: env.0.weight=2).
    Returns the keys set. Unknown keys are left for validation to report."""
    keys = []
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise UserError(f"--set expects KEY=VALUE (e.g. --set max_steps=20), got '{item}'")
        _set_path(data, key, parse_override_value(value.strip()))
        keys.append(key)
    return keys


def _set_path(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node: Any = data
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        here = ".".join(parts[:depth])
        if isinstance(node, list):
            if not part.isdigit() or int(part) > len(node):
                raise UserError(
                    f"--set {key}: '{here}' is a list; give an index 0..{len(node)}, e.g. {here}.0.{'.'.join(parts[depth:])}"
                )
            if int(part) == len(node):
                node.append({})  # --set env.0.id=reverse-text on a config without envs
            index: Any = int(part)
        elif isinstance(node, dict):
            index = part
            if not last and not isinstance(node.get(part, {}), (dict, list)):
                raise UserError(f"--set {key}: '{'.'.join(parts[: depth + 1])}' is a value, not a table")
            if not last:
                node.setdefault(part, {})
        else:
            raise UserError(f"--set {key}: '{here}' is a value, not a table")
        if last:
            node[index] = value
        else:
            node = node[index]


def _absolute_paths(data: dict[str, Any], base: Path) -> None:
    """env_file entries and sft.data_path, made absolute against `base` where relative."""
    if isinstance(data.get("env_file"), str):
        data["env_file"] = [data["env_file"]]
    if isinstance(data.get("env_file"), list):
        data["env_file"] = [os.path.abspath(base / p) if isinstance(p, str) else p for p in data["env_file"]]
    sft = data.get("sft")
    if isinstance(sft, dict) and isinstance(sft.get("data_path"), str):
        sft["data_path"] = os.path.abspath(base / sft["data_path"])


def config_source(config: Path | None, resume: Path | None) -> Path:
    """The config file a run loads: CONFIG, or the saved config.toml of the run being resumed."""
    if resume is None:
        if config is None:
            raise UserError("give a training config (workbench train CONFIG.toml) or --resume RUN_FOLDER")
        return config
    if config is not None:
        raise UserError(
            "--resume continues a run with its saved config.toml: drop CONFIG (use --set to change values)"
        )
    saved = resume / CONFIG_FILENAME
    if not saved.is_file():
        raise UserError(f"{resume} is not a training run folder (no {CONFIG_FILENAME})")
    return saved


def run_blockers(config: TrainConfig, *, resuming: bool = False) -> list[str]:
    """Problems that stop a real run but not a dry run: environments (training and eval.env),
    files the config names that are not here, a resume step without a run to resume."""
    problems = _env_problems(config.env, "")
    if config.checkpointing.resume_step is not None and not resuming:
        problems.append(
            f"checkpointing.resume_step = {config.checkpointing.resume_step} (prime-rl: trainer.ckpt.resume_step) "
            "continues a run: name it with --resume RUN"
        )
    problems += _env_problems(config.eval.env, "eval.env: ", skip=config.env)
    if (problem := model_problem(config.model)) is not None and producing_config(config.model) is None:
        problems.append(problem)  # (a run another config makes first is a note: model_notes)
    if config.mode == "distill" and config.distill.teacher_model and not config.distill.teacher_base_url:
        if (problem := model_problem(config.distill.teacher_model)) is not None:
            problems.append(problem.replace("model: ", "distill.teacher_model: ", 1))
    problems += [f"env_file '{p}' does not exist" for p in config.env_file if not Path(p).is_file()]
    if config.mode == "sft" and config.sft.data_path and not Path(config.sft.data_path).is_file():
        problems.append(f"sft.data_path '{config.sft.data_path}' does not exist")
    if config.inference.mode == "server" and config.inference.launch:
        # vLLM where it runs, `workbench serve` replicas elsewhere: only a model split across GPUs needs vLLM
        from workbench.inference.vllm_launch import vllm_unavailable_reason
        from workbench.train.placement import launch_blockers

        problems += launch_blockers(config, vllm_unavailable_reason())
    return problems


def rank_blockers(config: TrainConfig, nproc: int) -> list[str]:
    """What stops `--nproc N` before any process starts: ranks that would have no group of a
    step to train on."""
    groups = config.batch_size // max(1, config.rollouts_per_example)
    if nproc > 1 and config.on_policy and nproc > groups:
        return [
            f"--nproc {nproc} is more than the {groups} group(s) of a step (batch_size {config.batch_size} / "
            f"rollouts_per_example {config.rollouts_per_example}): each rank needs at least one"
        ]
    return []


def _env_problems(envs: list[EnvConfig], label: str, skip: Sequence[EnvConfig] = ()) -> list[str]:
    """Each environment is loaded with its args, as the run will (its data files, its imports),
    so a run that passes these checks can start; environments in `skip` were checked already."""
    from workbench.envs.loader import load_environment, unknown_environment

    problems, seen = [], {_env_key(env) for env in skip}
    for env in envs:
        if _env_key(env) in seen:
            continue
        seen.add(_env_key(env))
        if (problem := unknown_environment(env.id)) is not None:
            problems.append(label + problem)
            continue
        try:
            load_environment(env.id, **env.args)
        except UserError as exc:
            problems.append(f"{label}{exc}")
    return problems


def _env_key(env: EnvConfig) -> str:
    return env.id + repr(sorted(env.args.items()))


def model_problem(model: str) -> str | None:
    """Why `model` cannot be loaded here, if that is known: a local folder that is missing or
    is no model, a checkpoint without adapter weights or whose base model is not here. A hub id counts as loadable (see `model_notes` for whether that was checked);
    the named models are built or fetched on first use."""
    from workbench.inference.resolve import resolve_model_path
    from workbench.models.loading import adapter_chain
    from workbench.workspace import NAMED_MODELS

    if model in NAMED_MODELS:
        return None
    try:
        adapter_chain(resolve_model_path(model))  # a checkpoint: every base model down its chain is here
    except UserError as exc:
        return f"model: {exc}"
    return None


def producing_config(model: str) -> Path | None:
    """The workspace config whose run makes the model folder `model` (`outputs/runs/NAME` that
    does not exist yet, and a config under configs/ with `run_name = "NAME"`): a pipeline's next
    stage, e.g. configs/rl/reverse-text-smollm2.toml starting from its SFT run. None otherwise."""
    import re

    from workbench.workspace import configs_dir

    path = Path(model).expanduser()
    if path.exists() or path.parent.name != "runs":
        return None
    wanted = re.compile(rf"""^\s*run_name\s*=\s*["']{re.escape(path.name)}["']""", re.MULTILINE)
    for config in sorted(configs_dir().rglob("*.toml")):
        try:
            if wanted.search(config.read_text(encoding="utf-8", errors="replace")):
                return config
        except OSError:
            continue
    return None


def model_notes(model: str) -> list[str]:
    """For a Hugging Face id: whether it is in the local cache or the hub answers; a dry run
    lists it as unchecked (not failed) when neither can be told. For a run another config makes
    first: which one to run."""
    from workbench.models.hub import HUB_ID, hub_offline, hub_reachable, is_cached

    if (producer := producing_config(model)) is not None:
        return [
            f"model '{model}' is made by `workbench train {producer.relative_to(Path.cwd()) if producer.is_relative_to(Path.cwd()) else producer}`: run that first"
        ]

    if not HUB_ID.match(model) or Path(model).expanduser().exists():
        return []
    if is_cached(model):
        return [f"model '{model}' is in the local Hugging Face cache"]
    if not hub_offline() and hub_reachable():
        return [f"model '{model}' will be downloaded from the Hugging Face hub when the run starts"]
    return [
        f"model '{model}' is unchecked: the Hugging Face hub is unreachable and it is not in the local cache "
        "(a real run here stops; use a local model folder or --set model=tiny)"
    ]


def load_env_files(config: TrainConfig, config_path: Path | str | None = None) -> list[str]:
    """Load each env_file's KEY=VALUE lines into os.environ; returns the names set, never values.

    Variables already set in the environment win (as with dotenv and docker compose), so a
    shell `export` can override a shared secrets file. Relative names (a config built in code)
    are resolved against `config_path`'s folder. A missing file raises a one-line UserError.
    """
    from dotenv import dotenv_values

    base = Path(config_path).parent if config_path else Path.cwd()
    loaded: list[str] = []
    for name in config.env_file:
        file = base / name
        if not file.is_file():
            raise UserError(f"env_file '{name}' does not exist ({file})")
        for key, value in dotenv_values(file).items():
            if value is not None and key not in os.environ:
                os.environ[key] = value
                loaded.append(key)
    return loaded


def config_for_saving(config: TrainConfig) -> dict[str, Any]:
    """The resolved config as plain TOML-ready data. env_file keeps file names only: secret
    values live in os.environ and are never part of the config. checkpointing.resume_step is
    left out: it says where one resume starts, and a later --resume continues from the newest."""
    return _drop_none(config.model_dump(mode="json", exclude={"checkpointing": {"resume_step"}}))


def save_resolved_config(config: TrainConfig, run_dir: Path | str) -> Path:
    """Write `run_dir/config.toml` (atomically), first line the command that continues the run."""
    import tomli_w

    run_dir = Path(run_dir)
    target = run_dir / CONFIG_FILENAME
    header = (
        f"# workbench train --resume {run_dir}\n"
        f"# Resolved config of this run (env_file values are never saved). "
        f"A new run with these settings: workbench train {target} --set run_name=NEW\n"
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{CONFIG_FILENAME}.tmp")
    temporary.write_text(header + tomli_w.dumps(config_for_saving(config)), encoding="utf-8")
    temporary.replace(target)
    return target


def _drop_none(value: Any) -> Any:
    """TOML has no null: unset optional values are left out (they load back as None)."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value if v is not None]
    return value
