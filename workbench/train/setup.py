"""Everything a training run needs before its first step: run folder, envs, policy, optimizer,
client, rollout source, data (`build_context`; the parts are described in `context.py`)."""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from workbench import __version__
from workbench.engine.sampling import resolve_sampling
from workbench.envs import EnvGroup, load_environment
from workbench.envs.environment import Environment
from workbench.errors import UserError
from workbench.inference.client import Client
from workbench.inference.passing_thread import in_passing_thread
from workbench.store.checkpoints import CHECKPOINTS
from workbench.store.lock import claim_run
from workbench.store.runs import (
    RUN_LOG,
    QuietLog,
    RankProcess,
    RunLog,
    TrainRun,
    create_run_dir,
    read_saved,
)
from workbench.train.context import EvalEnv, Inference, Learner, RunFiles, TrainContext
from workbench.train.distributed import SINGLE, DistInfo, wrap_model
from workbench.train.optimize import make_optimizer
from workbench.train.policy import load_policy
from workbench.train.publish import WeightPublisher, server_client
from workbench.train.rollout_source import PolicyClock, RolloutSource
from workbench.train.samples import Sample
from workbench.train.schema import TRAIN_SAMPLING_DEFAULTS, EnvConfig, TrainConfig
from workbench.train.shared_source import SharedSource
from workbench.train.teacher import load_teacher
from workbench.types import Messages, SamplingParams
from workbench.workspace import model_label, new_run_id, runs_dir


def new_run_dir(config: TrainConfig) -> Path:
    if config.output_dir:
        return Path(config.output_dir)
    env_part = "+".join(e.id.split("/")[-1] for e in config.env) or "sft"
    name = config.run_name or f"{env_part}--{model_label(config.model)}--{new_run_id()}"
    return runs_dir() / name


def training_sampling(config: TrainConfig, env: Environment | None) -> SamplingParams:
    """How this run samples: built-in defaults < the environment's own sampling_args < [sampling]
    (and its --set overrides). The seed is the run's; each step derives its own from it."""
    env_defaults = env.sampling_args if env is not None else {}
    return resolve_sampling(TRAIN_SAMPLING_DEFAULTS, env_defaults, config.sampling.layer(), seed=config.seed)


def env_names(envs: Sequence[EnvConfig]) -> list[str]:
    """A short, unique name per environment: the id without its owner ('-<index>' where ids repeat)."""
    names = [e.id.split("/")[-1] for e in envs]
    if len(set(names)) != len(names):
        names = [f"{n}-{i}" for i, n in enumerate(names)]
    return names


def load_envs(config: TrainConfig) -> Environment:
    envs = [load_environment(e.id, **e.args) for e in config.env]
    if len(envs) == 1:
        return envs[0]
    return EnvGroup(envs, env_names=env_names(config.env), weights=[e.weight for e in config.env])


def load_eval_envs(config: TrainConfig) -> list[EvalEnv]:
    """`eval.env`, loaded like the training environments; [] when held-out eval uses those (or is off)."""
    if not config.on_policy or config.eval.interval == 0:
        return []
    loaded = []
    for name, e in zip(env_names(config.eval.env), config.eval.env, strict=True):
        env = load_environment(e.id, **e.args)
        loaded.append(EvalEnv(name, env, training_sampling(config, env)))
    return loaded


def build_context(
    config: TrainConfig,
    run_dir: Path,
    checkpoint: Path | None,
    dist: DistInfo = SINGLE,
    *,
    launched_urls: Sequence[str] = (),
) -> tuple[TrainContext, Learner]:
    """The run's fixed parts and its learner, fresh: a resumed run then loads the optimizer,
    schedule and KL coefficient from its checkpoint (`loop.py`); the LoRA adapter is loaded here."""
    import torch

    from workbench.inference.local_client import LocalClient
    from workbench.inference.resolve import describe_model, resolve_model_path
    from workbench.models.hub import require_hub_model
    from workbench.train.config import config_for_saving, save_resolved_config

    random.seed(config.seed)
    torch.manual_seed(config.seed)  # LoRA init and anything else drawn from torch's global RNG
    if dist.device == "cpu":
        # The same config and seed give the same run, bit for bit, however loaded the machine is:
        # without this, 3-step tiny runs on 2 threads under load differed in every run (loss ~1e-7,
        # adapter sha256), idle ones did not; with it, 4 of 4 loaded runs matched the idle one, at
        # no measurable cost (6.1 vs 6.5 s). GPUs keep their fast kernels (they would need
        # CUBLAS_WORKSPACE_CONFIG and lose speed).
        torch.use_deterministic_algorithms(True, warn_only=True)
    env = load_envs(config) if config.env else None  # a bad env or model fails before the run folder exists
    eval_envs = load_eval_envs(config)
    # What `model` names, resolved once when the run starts and kept: `outputs/runs/latest` (or a
    # run folder) means its newest checkpoint *now*; a resume must start from that same one.
    saved = read_saved(run_dir, "train")
    resolved = (
        saved.resolved_model if saved is not None and saved.resolved_model else describe_model(config.model)
    )
    source = resolve_model_path(resolved.path if resolved is not None else config.model)
    if isinstance(source, str):  # a hub id: cached, or the hub answers; one line otherwise
        require_hub_model(source)
    if dist.is_main:  # rank 0 alone writes the run folder, and owns it while it runs
        claim_run(run_dir)
        create_run_dir(run_dir / CHECKPOINTS)
        if checkpoint is None:
            save_resolved_config(config, run_dir)
    need_reference = config.on_policy and config.kl_penalty.enabled
    # In a passing thread: merging a checkpoint's adapter and converting dtypes would leave a
    # thread team here that slows the colocated client's decode thread (`passing_thread`).
    policy = in_passing_thread(
        lambda: load_policy(
            source, config, need_reference=need_reference, adapter_dir=checkpoint, on_gpu=dist.device != "cpu"
        ),
        device=dist.device,
    )
    wrap_model(
        policy, config.data_parallel, dist, cpu_offload=config.fsdp_cpu_offload
    )  # multi-process only: device, DDP/FSDP wrapper
    log = RunLog(run_dir / RUN_LOG) if dist.is_main else QuietLog(run_dir / RUN_LOG)
    clock = PolicyClock()
    client: Client
    if config.inference.mode == "server":
        refuse_server_mode_ranks(config, dist)
        servers = server_client(config, extra_urls=list(launched_urls), tokenizer=policy.tokenizer)
        # Several ranks: rank 0 alone rolls out and publishes (workbench.train.shared_source).
        publisher = (
            WeightPublisher(policy, run_dir, config, servers, clock, log=log.write) if dist.is_main else None
        )
        client = servers
    else:
        local = LocalClient.from_model(
            policy.model,
            policy.tokenizer,
            model_name=config.model,
            max_batch_size=max(64, config.batch_size),
            reasoning_parser=config.inference.reasoning_parser or "auto",
        )
        # Interleaved: later turns continue the exact ids sampled so far (see inference/chat_tokens).
        local.tokens_in = config.trajectory_strategy == "interleaved"
        client, publisher = local, None
    log.write(f"{'resume from ' + checkpoint.name if checkpoint else 'start'} pid={os.getpid()}")
    metadata = TrainRun(
        run_id=run_dir.name,
        model=config.model,
        mode=config.mode,
        env_ids=[e.id for e in config.env],
        env_id="+".join(e.id for e in config.env),
        max_steps=config.max_steps,
        workbench_version=__version__,
        config=config_for_saving(config),
        world_size=dist.world_size,
        ranks=[RankProcess(rank=r, pid=pid, host=host) for r, (pid, host) in enumerate(dist.processes)],
        resolved_model=resolved,
    )
    if saved is not None:
        metadata.created_at = saved.created_at or metadata.created_at
    sft_data = SFTData.from_config(config, env, policy.tokenizer) if config.mode == "sft" else None
    if config.on_policy and env is None:
        raise UserError("RL training needs at least one [[env]]")
    teacher = (
        load_teacher(config.distill, policy.tokenizer, dist.device) if config.mode == "distill" else None
    )
    optimizer, scheduler = make_optimizer(policy, config)
    server_mode = config.inference.mode == "server"
    ctx = TrainContext(
        config,
        dist,
        RunFiles(run_dir, log, metadata),
        Inference(client, clock, server_mode, publisher),
        env,
        training_sampling(config, env),
        eval_envs,
        sft_data,
        teacher,
    )
    if env is not None:
        ctx.inference.source = rollout_source(ctx)
    return ctx, Learner(policy, optimizer, scheduler, kl_beta=config.kl_penalty.beta)


def rollout_source(ctx: TrainContext) -> RolloutSource | SharedSource:
    """Colocated: every rank rolls out its share on demand. Server mode: generated ahead of the
    trainer; with several ranks by rank 0 alone, which hands each rank its share."""
    config, env, dist, inference = ctx.config, ctx.env, ctx.dist, ctx.inference
    assert env is not None

    def sampling_for(step: int) -> SamplingParams:
        """The run's sampling (environment < config) with a seed of its own for every step."""
        return dataclasses.replace(ctx.sampling, seed=step_seed(config, step))

    if not (inference.server_mode and dist.active):
        return RolloutSource(
            env,
            inference.client,
            config,
            inference.clock,
            sampling_for,
            asynchronous=inference.server_mode,
            dist=dist,
        )
    own = (
        RolloutSource(env, inference.client, config, inference.clock, sampling_for, asynchronous=True)
        if dist.is_main
        else None
    )
    return SharedSource(own, dist)


def step_seed(config: TrainConfig, step: int) -> int:
    """The sampling seed of a step's rollouts: the run's seed and the step, so a resumed run draws
    what the uninterrupted one would have."""
    return config.seed * 100_003 + step


def refuse_server_mode_ranks(config: TrainConfig, dist: DistInfo) -> None:
    """Server mode with several ranks writes the servers' weights from rank 0's copy of the model;
    FSDP shards it (a full gather on every rank per step), so that pairing is refused."""
    if config.inference.mode == "server" and dist.world_size > 1 and config.data_parallel == "fsdp":
        raise UserError(
            "server mode with several trainer processes needs data_parallel = 'ddp' (FSDP shards the "
            "weights rank 0 publishes to the servers): set data_parallel = 'ddp', or train colocated"
        )


class SFTData:
    """Demonstrations (chat conversations) as tokenized samples, cycled in a seeded order."""

    def __init__(self, samples: list[Sample], seed: int) -> None:
        if not samples:
            raise UserError(
                "no SFT demonstrations: set sft.data_path or sft.from_env with an env that has reference answers"
            )
        self.samples = samples
        self.seed = seed
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.samples)))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._orders[epoch] = order
        return self._orders[epoch]

    @classmethod
    def from_config(cls, config: TrainConfig, env: Environment | None, tokenizer: Any) -> SFTData:
        """Every assistant turn of every conversation trained exactly once, in the context it is
        generated in (`encode_conversation`: a chat template that rewrites earlier turns, as
        Qwen3's drops their thinking, gives a conversation several samples), with the tools the
        conversation offers rendered into its prompt."""
        from workbench.models.sft_data import IGNORE_INDEX, encode_conversation

        conversations = list(_read_jsonl_messages(Path(config.sft.data_path))) if config.sft.data_path else []
        if config.sft.from_env and env is not None:
            for example in env.get_examples(-1, split="train"):
                reference = env.reference_completion(example)
                if reference:
                    conversations.append((example.prompt + reference, env.oai_tools))
        max_len = config.seq_len or 4096
        samples = []
        for messages, tools in conversations:
            for demo in encode_conversation(tokenizer, messages, max_len, tools):
                mask = [int(label != IGNORE_INDEX) for label in demo.labels]
                if any(mask):  # a sequence cut before its turn (max_len) has nothing to train
                    samples.append(Sample(demo.input_ids, mask, [0.0] * len(mask), 0.0))
        return cls(samples, config.seed)

    def batch(self, step: int, size: int) -> list[Sample]:
        """The step's samples: epoch e is a seeded shuffle; steps walk through it."""
        start = (step - 1) * size
        out = []
        for position in range(start, start + size):
            epoch, index = divmod(position, len(self.samples))
            out.append(self.samples[self._order(epoch)[index]])
        return out


def _read_jsonl_messages(path: Path) -> Iterator[tuple[Messages, list[dict[str, Any]] | None]]:
    """(messages, tools) of each line: prime-rl's SFT format, `{"messages": [...], "tools": [...]}`
    (tools optional)."""
    import orjson

    if not path.is_file():
        raise UserError(f"sft.data_path not found: {path}")
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
            messages, tools = record["messages"], record.get("tools")
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise UserError(f"{path}:{number}: expected a JSON object with 'messages'") from exc
        if not isinstance(messages, list) or (tools is not None and not isinstance(tools, list)):
            raise UserError(f"{path}:{number}: 'messages' (and 'tools', when given) must be lists")
        yield messages, tools
