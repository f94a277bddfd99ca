"""Which process of a training run runs where — decided from the config alone, without torch,
so `--dry-run` can print it and the launcher (`launch_servers.py`) acts on the same answers.

The processes are prime-rl's: the trainer (one process, or N ranks with --nproc/torchrun), and in
server mode the inference servers. With `[inference] launch = true` the run starts them itself:

- vLLM, where vLLM is installed and a CUDA GPU is visible: one `vllm serve` on `inference.gpu_ids`
  with `--data-parallel-size` / `--tensor-parallel-size` (vLLM spreads its own replicas).
- otherwise N `workbench serve MODEL --enable-lora` replicas on this machine, one process group
  each, logging to `<run>/inference/replica_<i>.log`.

N, the number of inference replicas, is prime-rl's data-parallel degree of inference
(`[inference.parallel] dp`, vLLM's `--data-parallel-size`, here `inference.data_parallel_size`),
so a prime-rl config means the same thing on a GPU box and on a laptop. When the config does not
set it, it follows from what the config does say: `inference.gpu_ids` / tensor_parallel_size
(prime-rl's `inference_gpu_ids = [0, 1, 2]` is three replicas; on a CPU each GPU id becomes a
process), else the number of `inference.base_urls` (the servers `launch` starts in place of the
ones listed, e.g. configs/rl/reverse-text-server.toml's two), else 1.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from typing import Literal

from workbench.train.schema import InferenceConfig, TrainConfig

Backend = Literal["vllm", "workbench serve"]
INFERENCE_DIR = "inference"  # in the run folder: replica logs and replicas.json
REPLICAS_FILE = "replicas.json"
# `workbench serve --port 0` picks a free port and prints this line; its URL is read from the log.
SERVE_ANNOUNCE = r"Serving model '.*' at (http://\S+/v1)"


def replica_log_name(index: int) -> str:
    return f"replica_{index}.log"


def replica_count(inference: InferenceConfig) -> int:
    """How many inference replicas the run uses (see the module docstring for the rule)."""
    if "data_parallel_size" in inference.model_fields_set or inference.data_parallel_size > 1:
        return inference.data_parallel_size
    if inference.gpu_ids:
        return max(1, len(inference.gpu_ids) // inference.tensor_parallel_size)
    return max(1, len(inference.base_urls))


def vllm_data_parallel_size(inference: InferenceConfig) -> int:
    """`--data-parallel-size` of a launched vLLM: as `replica_count`, except that base_urls do not
    size it (one vLLM spreads its replicas over the GPUs it is given, not over URLs)."""
    if (
        "data_parallel_size" in inference.model_fields_set
        or inference.data_parallel_size > 1
        or not inference.gpu_ids
    ):
        return inference.data_parallel_size
    return max(1, len(inference.gpu_ids) // inference.tensor_parallel_size)


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def launch_backend(vllm_runs_here: bool) -> Backend:
    """vLLM where it can run (installed, a CUDA GPU visible); `workbench serve` replicas elsewhere."""
    return "vllm" if vllm_runs_here else "workbench serve"


def launch_blockers(config: TrainConfig, vllm_reason: str | None) -> list[str]:
    """Why `launch = true` cannot start here (`vllm_reason`: why vLLM cannot run, None if it can).
    A replica of `workbench serve` holds a whole model on one device, so a model split across
    GPUs (tensor_parallel_size > 1) needs vLLM; everything else runs as processes on a CPU."""
    inference = config.inference
    if not (inference.mode == "server" and inference.launch) or vllm_reason is None:
        return []
    if inference.tensor_parallel_size > 1:
        from workbench.inference.vllm_launch import INSTALL_HINT

        return [
            f"{INSTALL_HINT} ({vllm_reason}): inference.tensor_parallel_size = {inference.tensor_parallel_size} "
            "splits the model across GPUs, which a `workbench serve` replica cannot"
        ]
    if inference.dtype == "float16":
        return [
            "inference.dtype = 'float16' is for a launched vLLM; `workbench serve` replicas run "
            "'float32' or 'bfloat16' (or 'auto': float32 on a CPU)"
        ]
    return []


def replica_dtype(inference: InferenceConfig, *, gpu_count: int | None) -> str | None:
    """serve's --dtype for a launched replica: inference.dtype (None for 'auto': serve's own
    default), but float32 for 'bfloat16' on a machine without a CUDA GPU whose CPU only emulates
    bfloat16 (slower than float32 there), as optimization_dtype and autocast_dtype follow the CPU.
    float16 never gets here (launch_blockers)."""
    from workbench.inference.cpu_features import cpu_has_bf16

    if inference.dtype not in ("float32", "bfloat16"):
        return None
    if inference.dtype == "bfloat16" and gpu_count == 0 and not cpu_has_bf16():
        return "float32"
    return inference.dtype


def replica_command(
    config: TrainConfig, *, gpu_count: int | None, model: str | None = None, parent_pid: int | None = None
) -> list[str]:
    """`python -m workbench serve ...` for one replica: the served model under the name training
    requests (`inference.model`, default `model`), LoRA loading sized as for vLLM (rank rounded
    up to one vLLM accepts, max_async_level + 1 adapters), `--port 0` (the replica picks a free
    port and announces it: no race with other programs), and `--parent-pid` so the replica
    exits if the trainer dies without stopping it (kill -9). `model`: the resolved model path;
    `gpu_count`: CUDA GPUs here (`replica_dtype`)."""
    from workbench.inference.vllm_launch import vllm_lora_rank

    name = config.inference.model or config.model
    command = [
        sys.executable,
        "-m",
        "workbench",
        "serve",
        model or name,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--served-model-name",
        name,
    ]
    if config.lora.enabled:
        command += [
            "--enable-lora",
            "--max-lora-rank",
            str(vllm_lora_rank(config.lora.r)),
            "--max-loras",
            str(config.max_async_level + 1),
        ]
    if config.inference.reasoning_parser:
        command += ["--reasoning-parser", config.inference.reasoning_parser]
    if dtype := replica_dtype(config.inference, gpu_count=gpu_count):
        command += ["--dtype", dtype]
    if parent_pid is not None:
        command += ["--parent-pid", str(parent_pid)]
    return command


def trainer_visible_devices(config: TrainConfig) -> str | None:
    """CUDA_VISIBLE_DEVICES for the trainer's processes: `trainer_gpu_ids` (prime-rl's
    trainer_gpu_ids, physical ids as for inference.gpu_ids), so rank r runs on the r-th of them
    and never on an inference GPU; None when the config does not place the trainer."""
    return ",".join(map(str, config.trainer_gpu_ids)) if config.trainer_gpu_ids else None


def rank_gpu_blockers(config: TrainConfig, nproc: int, gpu_count: int | None) -> list[str]:
    """Why --nproc N ranks cannot be placed on this machine's GPUs (one GPU each, from
    trainer_gpu_ids when set): the launcher refuses the same (train.service), the dry run says it
    first. None on a CPU, where ranks are processes."""
    if nproc <= 1 or not gpu_count:
        return []
    if nproc > gpu_count:
        return [f"--nproc {nproc}: this machine has {gpu_count} GPU(s) and each process needs its own"]
    if config.trainer_gpu_ids and nproc > len(config.trainer_gpu_ids):
        return [
            f"--nproc {nproc}: trainer_gpu_ids lists {len(config.trainer_gpu_ids)} GPU(s) and each process needs its own"
        ]
    return []


def trainer_placement(config: TrainConfig, gpu_count: int | None, nproc: int = 1) -> str:
    """Where the trainer's ranks run: `nproc` is --nproc (torchrun's ranks are placed by
    whoever starts them, so a plan without --nproc says what N ranks would do)."""
    role = _orchestrator_role(config, nproc)
    if nproc > 1:
        ranks = f"{nproc} trainer ranks (--nproc {nproc}), children of this `workbench train` process"
        if gpu_count == 0:
            return f"{ranks}, each a process on the CPU (gloo){role}"
        if config.trainer_gpu_ids:
            ids = ",".join(map(str, config.trainer_gpu_ids))
            return (
                f"{ranks}: rank r on the r-th GPU of trainer_gpu_ids {_ids(config.trainer_gpu_ids)} "
                f"(CUDA_VISIBLE_DEVICES={ids}, NCCL){role}"
            )
        return f"{ranks}: rank r on CUDA GPU r of CUDA_VISIBLE_DEVICES (NCCL){role}"
    if gpu_count == 0:
        return f"rank 0 = this `workbench train` process, on the CPU (--nproc N: N processes, gloo){role}"
    if config.trainer_gpu_ids:
        ids = ",".join(map(str, config.trainer_gpu_ids))
        return (
            f"trainer_gpu_ids {_ids(config.trainer_gpu_ids)}: rank r on the r-th of them "
            f"(CUDA_VISIBLE_DEVICES={ids}; --nproc {len(config.trainer_gpu_ids)} for one rank per GPU){role}"
        )
    return f"rank r on CUDA GPU r of CUDA_VISIBLE_DEVICES (--nproc N: N ranks, NCCL){role}"


def _orchestrator_role(config: TrainConfig, nproc: int) -> str:
    """Server mode: rank 0 is the orchestrator too (workbench.train.shared_source)."""
    if config.inference.mode != "server":
        return ""
    if config.inference.launch:
        count = replica_count(config.inference)
        servers = f"{count} replica{'s' * (count != 1)}"
    else:
        count = len(config.inference.base_urls)
        servers = f"{count} server{'s' * (count != 1)}"
    if nproc > 1:
        return (
            f"; rank 0 rolls out for every rank and publishes the weights to {servers}, the others wait on it"
        )
    return f"; rank 0 also rolls out for every rank and publishes the weights to {servers}"


def rank_split(config: TrainConfig, nproc: int) -> str:
    """How --nproc N splits a step: whole groups (an example's rollouts stay together, so the
    advantages need no communication), group i to rank i % N; SFT splits demonstrations."""
    if config.on_policy:
        groups = config.batch_size // max(1, config.rollouts_per_example)
        unit, per = "group", config.rollouts_per_example
    else:
        groups, unit, per = config.batch_size, "demonstration", 1
    low, extra = divmod(groups, nproc)
    share = f"{low} {unit}{'s' * (low != 1)}" + (f" ({low * per} rollouts)" if per > 1 else "") + " per rank"
    if extra:  # the first `extra` ranks take one more
        share += f" ({'rank 0' if extra == 1 else f'ranks 0-{extra - 1}'}: {low + 1})"
    return (
        f"each step's {groups} {unit}{'s' * (groups != 1)} split by {unit}, {unit} i to rank i % {nproc}: "
        f"{share}, in micro-batches of {config.micro_batch_size}; "
        "gradients averaged over ranks (the update of one process on the whole batch)"
    )


def inference_placement(
    config: TrainConfig, gpu_count: int | None, backend: Backend | None
) -> list[tuple[str, str]]:
    """Rows saying where rollouts are generated; `backend` is the launch backend (None: no launch)."""
    inference = config.inference
    if inference.mode == "colocated":
        return [("inference", "in the trainer process(es): the trainer's own model generates")]
    if not inference.launch:
        return [
            (
                "inference",
                f"{len(inference.base_urls)} server(s) started elsewhere: {', '.join(inference.base_urls)}",
            )
        ]
    replaced = (
        f" (in place of inference.base_urls {_ids(inference.base_urls)})" if inference.base_urls else ""
    )
    if backend == "vllm":
        tp, dp = inference.tensor_parallel_size, vllm_data_parallel_size(inference)
        gpus = f"GPUs {_ids(inference.gpu_ids)}" if inference.gpu_ids else "every visible GPU"
        return [
            (
                "inference",
                f"1 `vllm serve` process group on {gpus}: {dp} replica(s) x tp {tp}, log <run>/vllm.log{replaced}",
            )
        ]
    count = replica_count(inference)
    where = (
        "the CPU"
        if gpu_count == 0 or not inference.gpu_ids
        else "the CPU (vLLM is what uses inference.gpu_ids)"
    )
    rows = [
        (
            "inference",
            f"{count} `workbench serve` replica(s), each its own process group on {where}, "
            f"health-checked, stopped with the run{replaced}",
        )
    ]
    for index in range(count):
        first = index * inference.tensor_parallel_size
        gpu = f" · stands in for GPU {inference.gpu_ids[first]}" if first < len(inference.gpu_ids) else ""
        rows.append(
            (
                f"replica {index}",
                f"127.0.0.1:<free port> · log <run>/{INFERENCE_DIR}/{replica_log_name(index)}{gpu}",
            )
        )
    return rows


def _ids(values: Sequence[object]) -> str:
    return "[" + ", ".join(map(str, values)) + "]"
