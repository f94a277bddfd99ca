"""Turn the user's `-m/-b/-k/-e` into a `Client`, with one clear error line for each mistake.

Order: an explicit base URL (-b) → an endpoint id from the registry → 'tiny' / 'tiny-qwen' → a
local model folder → a Hugging Face hub id (loaded in-process; needs the hub or its cache).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from workbench.config.secrets import key_variable_name
from workbench.errors import UserError
from workbench.inference.client import Client
from workbench.inference.passing_thread import in_passing_thread
from workbench.models.hub import HUB_ID
from workbench.store.checkpoints import (
    CHECKPOINTS,
    STEP_PREFIX,
    checkpoint_step,
    newest_checkpoint,
    resolve_latest_run,
    training_run_checkpoint,
)
from workbench.store.runs import ResolvedModel
from workbench.types import MODEL_DTYPES
from workbench.workspace import (
    NAMED_MODELS,
    SMOLLM2_MODEL_NAME,
    TINY_MODEL_NAME,
    endpoints_path,
    named_model_dir,
)

DTYPE_ON_SERVER = "--dtype applies to a model run in this process; a server picks its own (vLLM: --dtype)"


def resolve_model_path(model: str) -> Path | str:
    """A local folder for a named model ('tiny', 'tiny-qwen', 'smollm2-135m') and paths; the id
    itself for hub ids. UserError otherwise."""
    if (
        model in NAMED_MODELS
    ):  # the CLI builds tiny-qwen and fetches smollm2-135m on first use (cli/embedded.py)
        path = named_model_dir(model)
        if not (path / "config.json").is_file():
            how = "workbench setup" + ("" if model == TINY_MODEL_NAME else f" --model {model}")
            verb = "fetched" if model == SMOLLM2_MODEL_NAME else "built"
            raise UserError(f"the {model} model is not {verb} yet ({path}); run `{how}` first")
        return path
    path = training_run_checkpoint(Path(model).expanduser())
    if path.exists():
        if not ((path / "config.json").is_file() or (path / "adapter_config.json").is_file()):
            raise UserError(
                f"'{model}' is a folder but not a model (no config.json or adapter_config.json in it)"
            )
        return path.resolve()
    if HUB_ID.match(model) and not model.startswith((".", "/")):
        return model
    if "/" in model or model.startswith((".", "~")):  # a path that is not there (a run not made yet?)
        raise UserError(f"no model folder at '{model}' (a training run's folder exists once it has run)")
    raise UserError(
        f"unknown model '{model}': not {', '.join(repr(m) for m in NAMED_MODELS)}, a local model folder, an endpoint id "
        f"in {endpoints_path()}, or a Hugging Face id (owner/name)"
    )


def describe_model(model: str) -> ResolvedModel | None:
    """What a local `-m` path means right now, for the run's metadata: the checkpoint a training
    run folder or `outputs/runs/latest` resolves to (with its run and step), or the model folder a
    path names. None for a named model, a hub id or an endpoint id (their name says what they
    are), and where there is nothing to load (`resolve_model_path` says why). The same choice as
    `training_run_checkpoint`, without hashing the weights a second time (loading checks them)."""
    if model in NAMED_MODELS or not ("/" in model or model.startswith((".", "~"))):
        return None
    try:
        path: Path | None = resolve_latest_run(Path(model).expanduser())
    except UserError:
        return None
    if path is not None and (path / CHECKPOINTS).is_dir() and not (path / "config.json").is_file():
        try:
            path = newest_checkpoint(path)  # a newer damaged one: loading says what is wrong
        except UserError:
            return None
    if path is None or not path.exists():
        return None
    path = path.resolve()
    if path.name.startswith(STEP_PREFIX) and path.parent.name == CHECKPOINTS:
        return ResolvedModel(path=str(path), run=path.parent.parent.name, step=checkpoint_step(path))
    return ResolvedModel(path=str(path))


def api_key(var: str | None) -> str | None:
    """The key held by the environment variable `var` (-k names it). A value that cannot be a
    variable name is most likely the key itself: refused, and never echoed."""
    if var is None:
        return None
    try:
        key_variable_name(var)
    except ValueError as exc:
        raise UserError(f"-k/--api-key-var {exc}") from None
    value = os.environ.get(var)
    if not value:
        raise UserError(f"environment variable {var} (named by -k/--api-key-var) is not set")
    return value


def make_client(
    model: str,
    *,
    base_url: str | None = None,
    api_key_var: str | None = None,
    endpoints_file: str | None = None,
    return_tokens: bool = False,
    timeout_s: float | None = None,
    tries: int | None = None,
    reasoning_parser: str | None = "auto",
    dtype: str = "auto",
) -> Client:
    """The client for these settings (not yet connected: HTTP sessions open on first use).
    `timeout_s`/`tries` (None: the endpoint's own, else the defaults) apply to servers only;
    `dtype` to an in-process model only (a server with another dtype than "auto": UserError).
    `reasoning_parser` (see `inference.reasoning`): how an in-process model's `<think>` is split
    off; for a server, only a parser named here splits `<think>` left inline in its replies
    ("auto" leaves that to the server, which knows its model)."""
    from workbench.inference.endpoints import client_for_endpoint, load_endpoints
    from workbench.inference.openai_client import DEFAULT_TIMEOUT_S, DEFAULT_TRIES, OpenAIClient

    if base_url:
        if dtype != "auto":
            raise UserError(DTYPE_ON_SERVER)
        if not re.match(r"^https?://", base_url):
            raise UserError(f"base URL must start with http:// or https://, got '{base_url}'")
        return OpenAIClient(
            base_url,
            model,
            api_key=api_key(api_key_var),
            return_tokens=return_tokens,
            timeout_s=timeout_s or DEFAULT_TIMEOUT_S,
            tries=tries or DEFAULT_TRIES,
            reasoning_parser=_server_parser(reasoning_parser),
        )
    registry_path = Path(endpoints_file) if endpoints_file else endpoints_path()
    if endpoints_file and not registry_path.is_file():
        raise UserError(f"endpoint registry not found: {registry_path}")
    endpoints = load_endpoints(registry_path)
    if model in endpoints:
        if dtype != "auto":
            raise UserError(DTYPE_ON_SERVER)
        return client_for_endpoint(
            endpoints[model],
            return_tokens=return_tokens,
            timeout_s=timeout_s,
            tries=tries,
            reasoning_parser=_server_parser(reasoning_parser),
        )
    return local_client(model, resolve_model_path(model), reasoning_parser=reasoning_parser, dtype=dtype)


def check_dtype(dtype: str) -> None:
    """UserError (one line) unless `dtype` is one an in-process model loads in."""
    if dtype not in MODEL_DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(MODEL_DTYPES)}, got '{dtype}'")


def _server_parser(setting: str | None) -> str | None:
    """A server splits thinking itself (vLLM --reasoning-parser, `workbench serve`); the client
    splits only when told which parser, since it cannot see the server's vocabulary."""
    return None if setting == "auto" else _checked_parser(setting)


def _checked_parser(setting: str | None) -> str | None:
    """`setting` ("auto", a parser name or None), or a UserError naming the choices."""
    from workbench.inference.reasoning import check_reasoning_parser

    try:
        return setting if setting == "auto" else check_reasoning_parser(setting)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def local_client(
    name: str,
    source: Path | str,
    max_batch_size: int = 64,
    *,
    reasoning_parser: str | None = "auto",
    dtype: str = "auto",
) -> Client:
    """An in-process client for a model folder, a checkpoint (adapter onto its base) or a hub id,
    its weights in `dtype` (`MODEL_DTYPES`; "auto": float32 on the CPU, as `LocalClient` loads)."""
    from workbench.errors import InferenceError
    from workbench.inference.local_client import LocalClient
    from workbench.models.hub import require_hub_model
    from workbench.models.loading import adapter_base, load_merged_adapter

    reasoning_parser = _checked_parser(reasoning_parser)
    check_dtype(dtype)
    if isinstance(source, str):
        require_hub_model(source)

    def load() -> Client:
        if isinstance(source, Path) and adapter_base(source) is not None:
            model, tokenizer = load_merged_adapter(source)  # float32, as "auto" loads on the CPU
            if dtype != "auto":
                import torch

                model = model.to(getattr(torch, dtype))
            return LocalClient.from_model(
                model,
                tokenizer,
                model_name=name,
                max_batch_size=max_batch_size,
                reasoning_parser=reasoning_parser,
            )
        return LocalClient(
            source,
            model_name=name,
            max_batch_size=max_batch_size,
            dtype=dtype,
            reasoning_parser=reasoning_parser,
        )

    try:
        return in_passing_thread(load)
    except (OSError, InferenceError) as exc:  # hub unreachable, missing or broken files
        raise UserError(f"could not load model '{name}': {str(exc).splitlines()[0]}") from exc
