"""Multi-process (data parallel) training: every process holds the policy, takes a slice of each step.

    workbench train configs/rl/reverse-text.toml --nproc 2
    torchrun --nproc-per-node 2 -m workbench train configs/rl/reverse-text.toml
    torchrun --nnodes 2 --nproc-per-node 8 --node-rank K --master-addr HEAD --master-port 29500 -m workbench train CONFIG
                                                          # on each node K = 0, 1 (docs/distributed.md)

Each process (rank) reads RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT (set by
`--nproc`, see `workbench.train.launch`, or by torchrun) and joins one process group: gloo on
CPU, NCCL with CUDA (rank r on cuda:LOCAL_RANK). RANK is global and LOCAL_RANK is per node, so
nothing here assumes one machine: several nodes are torchrun's rendezvous, then the same code
(tests/test_train_multinode.py runs 2 "nodes" on 127.0.0.1). Across nodes the run folder must be
on a filesystem every node sees at the same path: rank 0 writes it, every rank reads the
checkpoint it resumes from. Semantics:

- The global batch stays `batch_size`. Every rank draws the same examples for a step (the
  step's seeded rng) and rolls out and trains only its slice (`shard`: item i goes to rank
  i % world_size); SFT slices the step's demonstrations the same way.
- The loss is divided by the GLOBAL loss-token count, and each rank's loss is multiplied by
  world_size because DDP/FSDP average gradients over ranks: the averaged gradient is then the
  single-process gradient of the same global batch. Micro-batches before the last skip the
  gradient all-reduce (`no_sync`); ranks with fewer micro-batches run empty ones (all tokens
  masked: zero gradient) so every rank takes part in every all-reduce.
- Clipping, AdamW and the learning rate then act on identical gradients on every rank.
- `data_parallel = "ddp"` (default) keeps a full replica per rank; `"fsdp"` shards parameters,
  gradients and optimizer state (FSDP2 `fully_shard`, one unit per decoder layer). FSDP
  gathers the full weights for colocated generation and for checkpoints.
- Metrics are computed from every rank's groups (all-gathered without token data) and the
  training stats are summed over ranks; held-out evaluation splits its examples the same way.
- Rank 0 alone writes the run folder (checkpoints, metrics, rollouts, metadata, run.log, W&B);
  the others write nothing there. The run folder is chosen once (`agreed_run_dir`); resume
  loads the same checkpoint on every rank.
- A Ctrl-C that reaches any rank stops every rank after the same step (`DistInfo.any`).

Simplifications: Workbench starts ranks on one machine only (`--nproc`); several nodes are
started by torchrun (its rendezvous, its restarts), one torchrun per node. FSDP runs in the policy's loaded dtype (no mixed-precision policy) and each rank first loads
the whole model; a single process (WORLD_SIZE unset or 1) never touches torch.distributed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

RUN_DIR_ENV = "WORKBENCH_TRAIN_RUN_DIR"  # the launcher's choice of run folder, for every rank
PEER_LOST_EXIT = 75  # a rank that stopped because another rank died (not the culprit)
STRATEGIES = ("ddp", "fsdp")


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"
    # (pid, host) of every rank, in rank order (empty for one process): the run's metadata
    # names them all, so a reader can tell that a rank died while the others were still up
    processes: tuple[tuple[int, str], ...] = ()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        """More than one process: the collectives below communicate."""
        return self.world_size > 1

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's slice of a list every rank holds in the same order (i % world_size == rank)."""
        return list(items[self.rank :: self.world_size])

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks (float64, so token counts stay exact)."""
        if not self.active:
            return [float(v) for v in values]
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._comm_device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def max(self, value: int) -> int:
        if not self.active:
            return value
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.int64, device=self._comm_device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on one (e.g. a Ctrl-C that reached one rank)."""
        return bool(self.max(int(flag)))

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's `obj` (picklable), in rank order."""
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as dist

            dist.barrier()

    @property
    def _comm_device(self) -> str:
        return self.device  # NCCL only moves CUDA tensors; gloo CPU ones


SINGLE = DistInfo()


def launched_world_size() -> int:
    """WORLD_SIZE from the environment (1 when not launched by --nproc or torchrun)."""
    return _env_int("WORLD_SIZE", 1)


def launched_rank() -> int:
    """This process's RANK before the process group exists (0 when not launched)."""
    return _env_int("RANK", 0)


def resume_hint(run_dir: Path, world_size: int) -> str:
    """How to continue a stopped run with as many processes as it had: `--nproc N` when Workbench
    started the ranks (its launcher sets RUN_DIR_ENV), else the user's own torchrun command."""
    if world_size <= 1:
        return f"`workbench train --resume {run_dir}`"
    if os.environ.get(RUN_DIR_ENV):
        return f"`workbench train --resume {run_dir} --nproc {world_size}`"
    return f"the same torchrun command on every node, with `-m workbench train --resume {run_dir}`"


def init_distributed() -> DistInfo:
    """Join the process group the environment describes; single process when WORLD_SIZE <= 1."""
    world = launched_world_size()
    if world <= 1:
        return SINGLE
    import datetime

    import torch
    import torch.distributed as dist

    rank, local_rank = launched_rank(), _env_int("LOCAL_RANK", 0)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = f"cuda:{local_rank}", "nccl"
    else:
        device, backend = "cpu", "gloo"
    if not dist.is_initialized():
        # a generous timeout: rank 0 writes checkpoints and evaluates while the others wait
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(minutes=60))
    info = DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=device)
    processes = info.all_gather((os.getpid(), socket.gethostname()))
    return dataclasses.replace(info, processes=tuple(processes))


def close(info: DistInfo) -> None:
    if info.active:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def agreed_run_dir(info: DistInfo, propose: Callable[[], Path]) -> Path:
    """The run folder, the same on every rank: the --nproc launcher's choice, else rank 0's."""
    chosen = os.environ.get(RUN_DIR_ENV)
    if chosen:
        return Path(chosen)
    return Path(info.broadcast(str(propose()) if info.is_main else ""))  # rank 0's choice


def wrap_model(policy: Any, strategy: str, info: DistInfo, *, cpu_offload: bool = False) -> None:
    """Move the policy to this rank's device and wrap it for data-parallel training.
    `cpu_offload` (FSDP on a GPU): the shards rest in CPU memory between uses.

    Sets `policy.wrapped`, the module training passes go through. Generation and saving keep
    using `policy.model` (for DDP the plain module; FSDP2 shards `policy.model` in place).
    """
    if not info.active:
        return
    if strategy not in STRATEGIES:
        from workbench.errors import UserError

        raise UserError(f"data_parallel must be one of {', '.join(STRATEGIES)}, got '{strategy}'")
    if info.device != "cpu":
        policy.model.to(info.device)
        if policy.reference is not None:
            policy.reference.to(info.device)
    if strategy == "fsdp":
        policy.wrapped = shard_fsdp(policy.model, cpu_offload=cpu_offload and info.device != "cpu")
        return
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [info.local_rank] if info.device != "cpu" else None
    # the buffers (rotary tables) are constants, the same on every rank: no broadcast before each forward
    if _knows_forward_sync_buffers():
        policy.wrapped = DistributedDataParallel(
            policy.model, device_ids=device_ids, forward_sync_buffers=False
        )
    else:
        policy.wrapped = DistributedDataParallel(policy.model, device_ids=device_ids, broadcast_buffers=False)


def _knows_forward_sync_buffers() -> bool:
    """torch 2.13 renamed DDP's `broadcast_buffers` to `forward_sync_buffers` and warns about the
    old name (a FutureWarning on the user's terminal); the new one still syncs the buffers once at
    construction, which constants do not mind. Older torch (>= 2.4 is supported) knows only the
    old name. Asked of the constructor's signature, its public interface."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    return "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters


def shard_fsdp(model: Any, *, cpu_offload: bool = False) -> Any:
    """FSDP2: one unit per decoder layer (the model's `_no_split_modules`), then the root.
    `cpu_offload`: parameters, gradients and optimizer state live on the CPU and are copied to
    the GPU for each unit's compute (FSDP2's CPUOffloadPolicy)."""
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
    except ImportError as exc:  # FSDP2 became public API in torch 2.6
        from workbench.errors import UserError

        raise UserError("data_parallel = 'fsdp' needs torch >= 2.6 (FSDP2); use 'ddp'") from exc

    names = set(getattr(_base_model(model), "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    policy = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    for layer in layers:
        fully_shard(layer, offload_policy=policy)
    fully_shard(model, offload_policy=policy)
    return model


def is_fsdp(policy: Any) -> bool:
    if policy.wrapped is None:
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(policy.wrapped, FSDPModule)


def sync_gradients(policy: Any, sync: bool) -> contextlib.AbstractContextManager[Any]:
    """Inside: backward passes all-reduce gradients only when `sync` (the last micro-batch)."""
    wrapped = policy.wrapped
    if wrapped is None or sync:
        if is_fsdp(policy):
            wrapped.set_requires_gradient_sync(True)
        return contextlib.nullcontext()
    if is_fsdp(policy):
        wrapped.set_requires_gradient_sync(False)
        return contextlib.nullcontext()
    return wrapped.no_sync()


def clip_grad_norm(policy: Any, max_norm: float) -> float:
    """Clip by the global norm (gradients are already reduced; FSDP's are sharded DTensors)."""
    import torch

    norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


@contextlib.contextmanager
def generation_weights(policy: Any) -> Iterator[None]:
    """FSDP: gather the full weights on every rank for generation (a collective), so each
    rank's different number of decoding passes needs no communication; reshard after."""
    if not is_fsdp(policy):
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in policy.model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.set_reshard_after_forward(False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True)


def checkpoint_states(policy: Any, optimizer: Any) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(model state dict or None for "save the module as is", optimizer state). With FSDP this is
    a collective: every rank must call it; the full states are gathered to CPU."""
    if not is_fsdp(policy):
        return None, optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(policy.model, options=options)
    if not optimizer.state:
        # before the first update: get_optimizer_state_dict would initialize the state with a
        # zero-gradient step, which counts as an AdamW step and shrinks the real first update
        return model_state, {}
    return model_state, get_optimizer_state_dict(policy.model, optimizer, options=options)


def load_optimizer_state(policy: Any, optimizer: Any, state: dict[str, Any]) -> None:
    """Restore what `checkpoint_states` saved (FSDP: a full state, re-sharded on every rank)."""
    if not is_fsdp(policy):
        optimizer.load_state_dict(state)
        return
    if not state:  # saved before the first update: the fresh optimizer is that state
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    set_optimizer_state_dict(policy.model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def gather_groups(info: DistInfo, groups: list[Any]) -> list[Any]:
    """Every rank's groups in example order, without token data (for rank 0's rollout files
    and the step's metrics; training uses only the rank's own groups)."""
    if not info.active:
        return groups
    from dataclasses import replace

    light = [replace(g, rollouts=[replace(r, tokens=None) for r in g.rollouts]) for g in groups]
    return sorted((g for part in info.all_gather(light) for g in part), key=lambda g: g.example_id)


def is_peer_failure(exc: BaseException) -> bool:
    """An error this rank got because another rank died (a closed connection, a NCCL abort)."""
    text = str(exc)
    markers = (
        "Connection closed by peer",
        "Connection reset by peer",
        "Broken pipe",
        "NCCL communicator was aborted",
    )
    return any(marker in text for marker in markers) or type(exc).__name__ in (
        "DistNetworkError",
        "DistBackendError",
    )


def _base_model(model: Any) -> Any:
    """The transformers model inside a peft wrapper (it knows its decoder layer classes)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip().lstrip("-").isdigit() else default
