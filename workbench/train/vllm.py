"""`[inference] launch = true` where vLLM runs: the vLLM server a training run starts for itself
(`launch_servers.py` chooses between it and `workbench serve` replicas).

The command comes from `inference.vllm_launch.vllm_plan` with this run's `[inference]` and
`[lora]` tables; `ManagedServer` runs it (own process group, log in the run folder, health wait)
and stops it when the run ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from workbench.errors import UserError
from workbench.inference.vllm_launch import (
    VLLM_EXECUTABLE,
    LaunchPlan,
    ManagedServer,
    free_port,
    require_vllm,
    vllm_plan,
)
from workbench.train.placement import vllm_data_parallel_size
from workbench.train.schema import TrainConfig


def plan_for_training(
    config: TrainConfig, *, port: int, host: str = "127.0.0.1", executable: Sequence[str] = VLLM_EXECUTABLE
) -> LaunchPlan:
    """`vllm_plan` for a train config: serves `inference.model` (default `model`), with LoRA
    loading on when `lora.enabled`."""
    from workbench.inference.resolve import resolve_model_path
    from workbench.models.loading import adapter_base

    name = config.inference.model or config.model
    source = resolve_model_path(name)
    if isinstance(source, Path) and adapter_base(source) is not None:  # vLLM wants a whole model folder
        raise UserError(
            f"vLLM cannot serve the LoRA checkpoint {source} as its model: export it merged "
            "(workbench train export RUN --step N --merge) and name that folder as model"
        )
    # prime-rl's inference_gpu_ids = [0, 1, 2] without a dp: three replicas (placement.py)
    inference = config.inference.model_copy(
        update={"data_parallel_size": vllm_data_parallel_size(config.inference)}
    )
    # max_async_level + 1 policy versions (one adapter each) can have rollouts in flight together
    return vllm_plan(
        inference,
        model=str(source),
        served_model_name=name,
        port=port,
        host=host,
        lora=config.lora,
        max_loras=config.max_async_level + 1,
        tokenizer=config.tokenizer,
        executable=executable,
    )


def launch_vllm(
    config: TrainConfig,
    run_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout_s: float = 900.0,
    executable: Sequence[str] | None = None,
) -> tuple[ManagedServer, LaunchPlan]:
    """The vLLM server for `config`, not started yet (enter it with `with`/`async with`);
    logs go to `run_dir/vllm.log`. UserError when vLLM cannot run here. A custom
    `executable` (e.g. a wrapper that adds routes) skips the vLLM/GPU check."""
    if executable is None:
        require_vllm()
        executable = VLLM_EXECUTABLE
    plan = plan_for_training(
        config,
        port=port or free_port(host if host not in ("0.0.0.0", "") else "127.0.0.1"),
        host=host,
        executable=executable,
    )
    server = ManagedServer(
        plan.command,
        run_dir / "vllm.log",
        plan.health_url,
        env=plan.env,
        startup_timeout_s=startup_timeout_s,
        die_with_parent=True,
    )  # also on kill -9 of the trainer
    return server, plan
