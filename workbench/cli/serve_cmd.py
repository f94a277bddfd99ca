"""`workbench serve MODEL`: a model behind an OpenAI-compatible HTTP API (as vLLM would serve it)."""

from __future__ import annotations

from typing import Annotated

import typer


def serve(
    model: Annotated[str, typer.Argument(help="'tiny', a local model folder or checkpoint, or a Hugging Face id.")] = "tiny",
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on.")] = 8000,
    served_model_name: Annotated[str | None, typer.Option("--served-model-name", help="Model name clients ask for. \\[default: MODEL]", show_default=False)] = None,
    max_batch_size: Annotated[int, typer.Option("--max-batch-size", help="Most sequences generated together.")] = 64,
) -> None:
    """Serve a model with /v1/chat/completions, /v1/models and /health (OpenAI-compatible).

    Example: workbench serve tiny --port 8000, then
    workbench eval run reverse-text -m tiny -b http://127.0.0.1:8000/v1
    """
    from workbench.inference.resolve import local_client, resolve_model_path
    from workbench.inference.server import run_server

    name = served_model_name or model
    client = local_client(name, resolve_model_path(model), max_batch_size=max_batch_size)
    run_server(client, host=host, port=port, served_model_name=name)
