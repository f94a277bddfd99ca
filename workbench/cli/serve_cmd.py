"""`workbench serve MODEL`: a model behind an OpenAI-compatible HTTP API (as vLLM would serve it)."""

from __future__ import annotations

from typing import Annotated

import typer

from workbench.errors import UserError
from workbench.inference.adapters import VLLM_LORA_RANKS as _LORA_RANKS  # light: no torch import
from workbench.inference.reasoning import REASONING_PARSERS as REASONING_CHOICES


def parse_lora_modules(specs: list[str]) -> dict[str, str]:
    """`name=path` pairs (vLLM's `--lora-modules` short form) → {name: path}."""
    modules: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--lora-modules takes NAME=PATH, got '{spec}'")
        modules[name] = path
    return modules


def serve(
    model: Annotated[
        str, typer.Argument(help="'tiny', a local model folder or checkpoint, or a Hugging Face id.")
    ] = "tiny",
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on.")] = 8000,
    served_model_name: Annotated[
        str | None,
        typer.Option(
            "--served-model-name", help="Model name clients ask for. \\[default: MODEL]", show_default=False
        ),
    ] = None,
    max_batch_size: Annotated[
        int, typer.Option("--max-batch-size", help="Most sequences generated together.")
    ] = 64,
    enable_lora: Annotated[
        bool,
        typer.Option(
            "--enable-lora",
            help='Serve LoRA adapters: /v1/load_lora_adapter and /v1/unload_lora_adapter, then "model": NAME in requests (as vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).',
        ),
    ] = False,
    max_lora_rank: Annotated[
        int,
        typer.Option(
            "--max-lora-rank",
            help=f"Largest adapter rank accepted; one of {', '.join(map(str, _LORA_RANKS))} (as vLLM).",
        ),
    ] = 16,
    max_loras: Annotated[
        int,
        typer.Option(
            "--max-loras",
            min=1,
            help="Accepted for vLLM compatibility; here each batch uses one adapter and any number may be loaded.",
        ),
    ] = 1,
    lora_modules: Annotated[
        list[str] | None,
        typer.Option(
            "--lora-modules",
            help="NAME=PATH adapter to load at startup (repeatable; needs --enable-lora).",
            show_default=False,
        ),
    ] = None,
    reasoning_parser: Annotated[
        str,
        typer.Option(
            "--reasoning-parser",
            help="Split <think>…</think> out of replies into message.reasoning_content (as vLLM): qwen3, deepseek_r1, none, or auto (qwen3 when the vocabulary has <think> and </think> tokens).",
        ),
    ] = "auto",
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype",
            metavar="auto|float32|bfloat16",
            help="Weights' dtype (as vLLM's --dtype): auto is float32 on CPU; bfloat16 is faster on a CPU with native bf16 (AMX, AVX512-BF16).",
        ),
    ] = "auto",
    parent_pid: Annotated[
        int | None,
        typer.Option(
            "--parent-pid",
            metavar="PID",
            help="Exit when process PID is gone (a training run that launched this server passes its own pid, so the server never outlives it, even after kill -9).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve a model with /v1/chat/completions, /v1/models and /health (OpenAI-compatible),
    plus /update_weights {"weight_dir": FOLDER} to reload full weights in place.

    Example: workbench serve tiny --port 8000, then
    workbench eval run reverse-text -m tiny -b http://127.0.0.1:8000/v1
    """
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be between 0 and 65535 (0: any free port), got {port}")
    if max_lora_rank not in _LORA_RANKS:
        raise UserError(
            f"--max-lora-rank must be one of {', '.join(map(str, _LORA_RANKS))}, got {max_lora_rank}"
        )
    if reasoning_parser not in (*REASONING_CHOICES, "auto", "none"):
        raise UserError(
            f"--reasoning-parser must be one of {', '.join(REASONING_CHOICES)}, auto or none, got '{reasoning_parser}'"
        )
    from workbench.inference.resolve import check_dtype

    check_dtype(dtype)  # before the model loads (or the embedded one is built)
    if parent_pid is not None and parent_pid <= 0:
        raise UserError(f"--parent-pid must be a process id (a positive number), got {parent_pid}")
    modules = parse_lora_modules(lora_modules or [])
    if modules and not enable_lora:
        raise UserError("--lora-modules needs --enable-lora")
    if parent_pid is not None:  # first: loading the model takes seconds, and the parent may die meanwhile
        from workbench.inference.parent_watch import watch_parent

        watch_parent(parent_pid)
    from workbench.cli.crash import one_line_logging
    from workbench.cli.embedded import ensure_embedded_model
    from workbench.cli.render import err_console
    from workbench.inference.cpu_features import dtype_hint
    from workbench.inference.resolve import local_client, resolve_model_path
    from workbench.inference.server import run_server

    one_line_logging()  # a backend bug the server lives on: one line, its traceback in a file
    ensure_embedded_model(model)
    name = served_model_name or model
    parser = None if reasoning_parser == "none" else reasoning_parser
    client = local_client(
        name, resolve_model_path(model), max_batch_size=max_batch_size, reasoning_parser=parser, dtype=dtype
    )
    hint = dtype_hint(dtype)
    if hint:
        err_console.print(f"[yellow]{hint}[/]")
    run_server(
        client,
        host=host,
        port=port,
        served_model_name=name,
        enable_lora=enable_lora,
        max_lora_rank=max_lora_rank,
        lora_modules=modules,
    )
