"""Option aliases shared by commands (`eval run`, later `gepa run`), so flags mean one thing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from workbench.config.bounds import MAX_NESTING, too_deep
from workbench.errors import REDACTED, UserError

if TYPE_CHECKING:
    from pydantic import BaseModel

Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="'tiny', a model folder or checkpoint, a Hugging Face id, an endpoint id from configs/endpoints.toml, or the model name a -b server serves.",
        show_default=False,
    ),
]
NumExamples = Annotated[
    int | None,
    typer.Option(
        "--num-examples",
        "-n",
        help="Examples from the eval split (-1: all). \\[default: 5]",
        show_default=False,
    ),
]
RolloutsPerExample = Annotated[
    int | None,
    typer.Option(
        "--rollouts-per-example",
        "-r",
        help="Rollouts per example; a group's spread is what RL learns from. \\[default: 3]",
        show_default=False,
    ),
]
MaxConcurrent = Annotated[
    int | None,
    typer.Option(
        "--max-concurrent", "-c", help="Rollouts in flight at once. \\[default: 32]", show_default=False
    ),
]
MaxTokens = Annotated[
    int | None,
    typer.Option(
        "--max-tokens", "-t", help="Max tokens per model turn. \\[default: 256]", show_default=False
    ),
]
Temperature = Annotated[
    float | None,
    typer.Option("--temperature", "-T", help="Sampling temperature. \\[default: 1.0]", show_default=False),
]
SamplingArgs = Annotated[
    str | None,
    typer.Option(
        "--sampling-args",
        "-S",
        help='Sampling settings as JSON, e.g. \'{"top_p": 0.9, "stop": ["</answer>"]}\'.',
        show_default=False,
    ),
]
EnvArgs = Annotated[
    str | None,
    typer.Option(
        "--env-args",
        "-a",
        help="Arguments for the environment as JSON, e.g. '{\"max_turns\": 3}'.",
        show_default=False,
    ),
]
BaseUrl = Annotated[
    str | None,
    typer.Option(
        "--api-base-url",
        "-b",
        help="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1.",
        show_default=False,
    ),
]
ApiKeyVar = Annotated[
    str | None,
    typer.Option(
        "--api-key-var",
        "-k",
        help="NAME of the environment variable that holds the API key (the key itself is never saved).",
        show_default=False,
    ),
]
EndpointsPath = Annotated[
    str | None,
    typer.Option(
        "--endpoints-path",
        "-e",
        help="Endpoint registry file. \\[default: configs/endpoints.toml]",
        show_default=False,
    ),
]
Timeout = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        help="Seconds a model server may stay silent (answering no request at all) before a request is retried; raise it for slow one-at-a-time generations. \\[default: the endpoint's, else 60]",
        show_default=False,
    ),
]
Tries = Annotated[
    int | None,
    typer.Option(
        "--tries",
        help="Tries per model request (connection errors, timeouts, 429/5xx) before the rollout counts as a server failure. \\[default: the endpoint's, else 5]",
        show_default=False,
    ),
]
Dtype = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        metavar="auto|float32|bfloat16",
        help="Weights' dtype for a model run in this process (as vLLM's --dtype): auto is float32 on CPU; bfloat16 is faster on a CPU with native bf16 (AMX, AVX512-BF16). A server picks its own. \\[default: auto]",
        show_default=False,
    ),
]
SaveResults = Annotated[
    bool, typer.Option("--save-results", "-s", help="Accepted for compatibility: results are always saved.")
]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Print every rollout.")]
StateColumns = Annotated[
    list[str] | None,
    typer.Option(
        "--state-columns",
        "-C",
        help="Rollout state keys to save with each rollout (repeat or comma-separate).",
        show_default=False,
    ),
]
Sets = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override a config key (repeatable), value as TOML, as `workbench train --set` does: --set num_examples=10 --set 'sampling_args.stop=[\"</a>\"]'. Flags win over it.",
        show_default=False,
    ),
]
Seed = Annotated[
    int | None,
    typer.Option(
        "--seed",
        help="Sampling seed; each rollout gets its own seed derived from it. \\[default: 0]",
        show_default=False,
    ),
]


def parse_json_object(value: str | None, flag: str) -> dict[str, Any] | None:
    """JSON from a flag, as a dict; a clear UserError otherwise."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise UserError(f"{flag} is not valid JSON ({exc.msg} at column {exc.colno}): {value[:200]}") from exc
    except RecursionError:
        parsed = None
    if parsed is None or too_deep(parsed):
        raise UserError(f"{flag}: lists or objects nest too deeply (at most {MAX_NESTING} levels)")
    if not isinstance(parsed, dict):
        raise UserError(f"{flag} must be a JSON object like '{{\"key\": 1}}', got: {value}")
    return parsed


def split_columns(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    return [c.strip() for v in values for c in v.split(",") if c.strip()]


def given(**flags: object) -> dict[str, Any]:
    """The flags the user gave (not None), by config field: they override a TOML config's values."""
    return {name: value for name, value in flags.items() if value is not None}


ConfigT = TypeVar("ConfigT", bound="BaseModel")


def build_config(
    model_cls: type[ConfigT],
    target: str | None,
    flags: dict[str, Any],
    resume: str | None,
    sets: list[str] | None = None,
) -> ConfigT:
    """The run's config: an env id or a config .toml (TARGET) with the `--set KEY=VALUE` overrides
    and then the given flags on top, or, with only `-R RUN_FOLDER`, the config saved in that run.
    Errors name the file, line and key."""
    from workbench.config.toml_loader import read_toml, validate

    if target is None:
        if resume is None or resume == "latest":
            raise UserError("give an environment id or a config file (or -R RUN_FOLDER to resume a run)")
        from workbench.store.runs import read_run_metadata

        try:
            saved = read_run_metadata(Path(resume)).config
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot read the run's metadata.json in {resume}: {exc}") from exc
        merged = {**_overridden(saved, sets), **flags}
        for key, value in merged.items():
            if isinstance(value, str) and f"{REDACTED}@" in value:  # redact_credentials left it so
                flag = "-b/--api-base-url" if key == "api_base_url" else f"--set {key}=..."
                raise UserError(
                    f"this run's {key} held a password, which is never saved: resume with {flag} again"
                )
        return _validated(model_cls, merged)
    if target.endswith(".toml"):
        data, text = read_toml(Path(target))
        validate(model_cls, data, Path(target), text)  # file errors name the file and line
        return _validated(model_cls, {**_overridden(data, sets), **flags})
    return _validated(model_cls, {**_overridden({"env_id": target}, sets), **flags})


def _overridden(data: dict[str, Any], sets: list[str] | None) -> dict[str, Any]:
    """`data` with the `--set KEY.PATH=VALUE` overrides applied, parsed as `workbench train --set`
    parses them (values as TOML; unknown keys are left for validation to name)."""
    if not sets:
        return data
    import copy

    from workbench.train.config import apply_overrides

    data = copy.deepcopy(data)
    apply_overrides(data, sets)
    return data


def _validated(model_cls: type[ConfigT], data: dict[str, Any]) -> ConfigT:
    from pydantic import ValidationError

    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserError(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from exc
