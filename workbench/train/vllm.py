"""`[inference] launch = true` where vLLM runs: the vLLM server a training run starts for itself
(`launch_servers.py` chooses between it and `workbench serve` replicas).

The command comes from `inference.vllm_launch.vllm_plan` with this run's `[inference]` and
`[lora]` tables; `ManagedServer` runs it (own process group, log in the run folder, health wait)
and stops it when the run ends. vLLM loads whole model folders only: a run whose `model` is a
LoRA checkpoint (RL after an SFT warm-up) has it merged once into `<run>/inference/start-model`
(the weights the trainer starts from too), and vLLM serves that.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

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

START_MODEL = Path("inference") / "start-model"
MERGED_FROM = "MERGED_FROM"  # in the start-model folder: the checkpoint it was merged from


def vllm_model(config: TrainConfig, run_dir: Path) -> tuple[Path | str, Path | None]:
    """(what the launched vLLM loads, the LoRA checkpoint to merge there first or None): the
    model (`inference.model`, default `model`) as it resolves, or for a LoRA checkpoint the
    run's `START_MODEL` folder."""
    from workbench.inference.resolve import resolve_model_path
    from workbench.models.loading import adapter_base

    source = resolve_model_path(config.inference.model or config.model)
    if isinstance(source, Path) and adapter_base(source) is not None:
        return run_dir / START_MODEL, source
    return source, None


def plan_for_training(
    config: TrainConfig,
    *,
    port: int,
    run_dir: Path,
    host: str = "127.0.0.1",
    executable: Sequence[str] = VLLM_EXECUTABLE,
) -> LaunchPlan:
    """`vllm_plan` for a train config: serves `vllm_model` under the name training requests
    (`inference.model`, default `model`), with LoRA loading on when `lora.enabled`."""
    name = config.inference.model or config.model
    model, _ = vllm_model(config, run_dir)
    # prime-rl's inference_gpu_ids = [0, 1, 2] without a dp: three replicas (placement.py)
    inference = config.inference.model_copy(
        update={"data_parallel_size": vllm_data_parallel_size(config.inference)}
    )
    # max_async_level + 1 policy versions (one adapter each) can have rollouts in flight together
    return vllm_plan(
        inference,
        model=str(model),
        served_model_name=name,
        port=port,
        host=host,
        lora=config.lora,
        max_loras=config.max_async_level + 1,
        tokenizer=config.tokenizer,
        executable=executable,
    )


def merge_start_model(config: TrainConfig, run_dir: Path) -> Path | None:
    """Write the run's start-model folder when vLLM needs one (`vllm_model`) and it is missing or
    was merged from another checkpoint; the folder, or None when vLLM loads `model` as it is."""
    from workbench.train.export import write_merged_model

    _, checkpoint = vllm_model(config, run_dir)
    if checkpoint is None:
        return None
    folder = run_dir / START_MODEL
    marker = folder / MERGED_FROM
    if marker.is_file() and marker.read_text().strip() == str(checkpoint.resolve()):
        return folder  # a resumed run: merged at its first launch
    shutil.rmtree(folder, ignore_errors=True)
    write_merged_model(checkpoint, folder)
    marker.write_text(f"{checkpoint.resolve()}\n")
    return folder


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
    merge_start_model(config, run_dir)
    plan = plan_for_training(
        config,
        port=port or free_port(host if host not in ("0.0.0.0", "") else "127.0.0.1"),
        run_dir=run_dir,
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
