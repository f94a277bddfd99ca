"""What a training run holds while it runs, split by who changes it.

- `TrainContext`: fixed for the run once `setup.build_context` has made it: the config, this
  process's rank, the environments and how they are sampled, the SFT data, the distillation
  teacher, the run's files (`RunFiles`) and where rollouts come from (`Inference`).
- `Learner`: what every optimizer step changes: the policy's weights, the optimizer's and the
  schedule's state and the adaptive KL coefficient. All of it is in a checkpoint, and nothing
  else is needed to resume (besides the RNG state and the step).

The RL step (`rl_step.py`) reads the first and updates the second; the run loop (`loop.py`) owns
both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.envs.environment import Environment
from workbench.inference.client import Client
from workbench.store.runs import RunLog, TrainRun, write_run_metadata
from workbench.train.distributed import DistInfo
from workbench.train.policy import Policy
from workbench.train.publish import WeightPublisher
from workbench.train.rollout_source import PolicyClock, RolloutSource
from workbench.train.schema import TrainConfig
from workbench.train.shared_source import SharedSource
from workbench.train.teacher import Teacher
from workbench.types import SamplingParams

if TYPE_CHECKING:
    from torch.optim import Optimizer
    from torch.optim.lr_scheduler import LRScheduler

    from workbench.train.setup import SFTData


@dataclass
class EvalEnv:
    """One `[[eval.env]]`: evaluated on its own, logged as eval/<name>/reward_mean."""

    name: str
    env: Environment
    sampling: SamplingParams  # the environment's own sampling_args < [sampling]


@dataclass
class RunFiles:
    """What the run writes besides checkpoints and metrics.jsonl. Rank 0 writes; on the other
    ranks of a multi-process run the log is quiet and the metadata stays in memory."""

    run_dir: Path
    log: RunLog  # run.log: one line per step, checkpoint, start and end
    metadata: TrainRun  # metadata.json: status, step, latest rewards (rewritten after every step)

    def write_metadata(self, dist: DistInfo) -> None:
        if dist.is_main:
            write_run_metadata(self.run_dir, self.metadata)


@dataclass
class Inference:
    """Where rollouts come from, and how new weights reach whoever generates them."""

    client: Client  # colocated: a LocalClient over the policy's own model; server mode: the servers
    clock: PolicyClock  # the policy version inference serves (rollout sources wait on it)
    server_mode: bool  # rollouts come from inference servers (on rank 0 only, with several ranks)
    publisher: WeightPublisher | None = None  # server mode, rank 0: pushes new weights to the servers
    source: RolloutSource | SharedSource | None = None  # RL: each step's batch (on demand, or ahead)

    async def close(self) -> None:
        """Stop generating ahead, abandon a weight push still running, close the client."""
        if self.source is not None:
            await self.source.close()
        if self.publisher is not None:
            await self.publisher.cancel()
        await self.client.close()


@dataclass
class Learner:
    """What every optimizer step changes (and a checkpoint saves)."""

    policy: Policy
    optimizer: Optimizer
    scheduler: LRScheduler
    kl_beta: float  # current KL coefficient (adapted toward kl_penalty.target_kl when set)

    @property
    def learning_rate(self) -> float:
        """The next optimizer step's (the scheduler moves on when the step is taken)."""
        return float(self.scheduler.get_last_lr()[0])


@dataclass
class TrainContext:
    """What is fixed for the run (see the module doc)."""

    config: TrainConfig
    dist: DistInfo  # this process's rank in a multi-process run (--nproc / torchrun)
    files: RunFiles
    inference: Inference
    env: Environment | None  # the [[env]]s (an EnvGroup for several); None: SFT from a data file alone
    sampling: SamplingParams  # how rollouts sample: environment < config (engine.sampling)
    eval_envs: list[EvalEnv]  # eval.env; empty: held-out eval on `env`
    sft_data: SFTData | None = None  # mode = "sft": the demonstrations
    teacher: Teacher | None = None  # mode = "distill": scores every sampled token
