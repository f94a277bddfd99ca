"""The resolved plan of a training run, as data: what `workbench train CONFIG --dry-run` prints
(and what a real run shows before it starts). Also the notes about keys that cannot apply on
this machine (GPU ids, parallelism, vLLM memory, dtypes) — found without importing torch.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
from pathlib import Path

from workbench.config.plan import Plan, PlanSection
from workbench.inference.cpu_features import cpu_has_bf16
from workbench.train.estimate import estimate_text
from workbench.train.placement import (
    inference_placement,
    launch_backend,
    rank_split,
    replica_command,
    replica_count,
    replica_dtype,
    trainer_placement,
    vllm_installed,
)
from workbench.train.schema import TRAIN_SAMPLING_DEFAULTS, TrainConfig


def cuda_gpu_count() -> int | None:
    """GPUs the NVIDIA driver reports: 0 without a driver, None when present but not countable."""
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir():
        return len(list(gpus.iterdir()))
    return None if shutil.which("nvidia-smi") else 0


def machine_notes(config: TrainConfig, gpu_count: int | None = None) -> list[str]:
    """Keys set in the config that cannot apply on this machine, by name."""
    count = cuda_gpu_count() if gpu_count is None else gpu_count
    inf = config.inference
    gpu_keys = {
        "num_gpus": config.num_gpus,
        "trainer_gpu_ids": config.trainer_gpu_ids or None,
        "inference.gpu_ids": inf.gpu_ids or None,
        "inference.gpu_memory_utilization": inf.gpu_memory_utilization,
        "inference.tensor_parallel_size": inf.tensor_parallel_size if inf.tensor_parallel_size > 1 else None,
        "inference.data_parallel_size": inf.data_parallel_size if inf.data_parallel_size > 1 else None,
        "pipeline_parallel_size": config.pipeline_parallel_size
        if config.pipeline_parallel_size > 1
        else None,
    }
    set_keys: dict[str, object] = {k: v for k, v in gpu_keys.items() if v is not None}
    dtypes = {
        k: v
        for k, v in (("optimization_dtype", config.optimization_dtype), ("reduce_dtype", config.reduce_dtype))
        if v != "float32"
    }
    if count == 0:
        notes = []
        if inf.mode == "server" and inf.launch:
            # launched on a CPU, these size the `workbench serve` replicas (placement.replica_count);
            # a launch saves data_parallel_size, so "ignored" would be said, wrongly, on every resume
            set_keys.pop("inference.data_parallel_size", None)
            if (ids := set_keys.pop("inference.gpu_ids", None)) is not None:
                notes.append(
                    f"inference.gpu_ids = {_fmt(ids)}: no CUDA GPU on this machine; the launched "
                    "`workbench serve` replicas stand in for them, as processes on the CPU"
                )
        notes += [
            f"{k} = {_fmt(v)} is ignored: no CUDA GPU on this machine (everything runs on the CPU)"
            for k, v in set_keys.items()
        ]
        if dtypes.get("optimization_dtype") and config.lora.enabled and cpu_has_bf16():
            notes.append(
                "optimization_dtype = 'bfloat16': LoRA's frozen base weights are held in bfloat16 (this CPU "
                "multiplies bfloat16 natively); the adapters and the optimizer stay float32"
            )
            dtypes.pop("optimization_dtype")
        elif dtypes.get("optimization_dtype") and config.lora.enabled:
            notes.append(
                "optimization_dtype = 'bfloat16' has no effect on this machine: this CPU has no native bfloat16 "
                "matmuls (AMX or AVX512-BF16), where it would be slower than float32"
            )
            dtypes.pop("optimization_dtype")
        notes += [
            f"{k} = '{v}' has no effect on this machine: no CUDA GPU, the CPU trains in float32"
            for k, v in dtypes.items()
        ]
        if config.autocast_dtype == "bfloat16" and not cpu_has_bf16():
            notes.append(
                "autocast_dtype = 'bfloat16' has no effect on this machine: this CPU has no native bfloat16 "
                "matmuls (AMX or AVX512-BF16), where it would be slower than float32"
            )
        if config.fsdp_cpu_offload:
            notes.append(
                "fsdp_cpu_offload = true has no effect on this machine: no CUDA GPU, the weights already live in CPU memory"
            )
        replicas = replica_dtype(inf, gpu_count=0) if inf.mode == "server" and inf.launch else None
        if replicas is not None and replicas != inf.dtype:
            notes.append(
                f"inference.dtype = '{inf.dtype}': the launched `workbench serve` replicas run {replicas} on this machine: "
                "this CPU has no native bfloat16 matmuls (emulated bfloat16 decodes slower)"
            )
        if inf.dtype != "auto" and not (inf.mode == "server" and inf.launch):
            notes.append(
                f"inference.dtype = '{inf.dtype}' has no effect here: it sets the weights of launched servers "
                "(inference.launch = true); colocated generation uses the trainer's model"
            )
        if config.model != "tiny" and set_keys:
            notes.append(f"'{config.model}' on a CPU is slow; try this config with --set model=tiny")
        return notes
    notes = []
    if config.fsdp_cpu_offload and config.data_parallel != "fsdp":
        notes.append(
            "fsdp_cpu_offload = true has no effect: it offloads FSDP shards, and data_parallel is 'ddp' (set data_parallel = 'fsdp')"
        )
    elif config.fsdp_cpu_offload:
        notes.append(
            "fsdp_cpu_offload = true takes effect with several trainer processes (--nproc N, torchrun); one process does not shard"
        )
    if "optimization_dtype" in dtypes:
        notes.append(
            "optimization_dtype = 'bfloat16': trainer processes on a CUDA GPU (--nproc N, torchrun) load the "
            "policy in bfloat16; a trainer process on the CPU keeps float32"
        )
    if "reduce_dtype" in dtypes:
        notes.append(
            "reduce_dtype = 'bfloat16' is not applied on its own: gradients are all-reduced in the policy's dtype "
            "(bfloat16 with optimization_dtype = 'bfloat16')"
        )
    if inf.dtype != "auto":
        set_keys["inference.dtype"] = inf.dtype
        if inf.mode == "server" and not inf.launch:
            notes.append(
                f"inference.dtype = '{inf.dtype}' configures a launched vLLM (inference.launch = true); "
                "the servers at inference.base_urls keep their own"
            )
    if count is not None:
        for key, ids in (("trainer_gpu_ids", config.trainer_gpu_ids), ("inference.gpu_ids", inf.gpu_ids)):
            bad = [i for i in ids if i >= count]
            if bad:
                notes.append(
                    f"{key} = {_fmt(ids)}: this machine has {count} GPU(s) (ids 0..{count - 1}); {bad} do not exist"
                )
        if config.num_gpus and config.num_gpus > count:
            notes.append(f"num_gpus = {config.num_gpus}: this machine has {count} GPU(s)")
    if inf.mode == "colocated":
        vllm_only = [k for k in set_keys if k.startswith("inference.")]
        if vllm_only:
            notes.append(
                f"{', '.join(vllm_only)} configure a vLLM server; with inference.mode = 'colocated' the trainer's model generates"
            )
    return notes


def wandb_mode(config: TrainConfig) -> str:
    if config.wandb.mode:
        return config.wandb.mode
    return (
        "online (WANDB_API_KEY is set)"
        if os.environ.get("WANDB_API_KEY")
        else "offline (online when WANDB_API_KEY is set, e.g. by an env_file)"
    )


TRAJECTORY_STRATEGY_TEXT = {
    "interleaved": "interleaved: one sample per rollout; later turns continue the sampled token ids (tokens in)",
    "branching": "branching: one sample per model turn, each with the prompt the chat template rendered",
}


def build_plan(
    config: TrainConfig,
    notes: list[str],
    warnings: list[str],
    *,
    gpu_count: int | None = None,
    nproc: int = 1,
) -> Plan:
    """Sections of the resolved config, in the order a reader checks them; `nproc`: the trainer
    ranks --nproc starts (the Placement section says where they run and how a step is split)."""
    c = config
    run = PlanSection("Run")
    run.add("model", c.model + (f"  (tokenizer {c.tokenizer})" if c.tokenizer else ""))
    run.add("starts from", starting_weights(c))
    run.add("mode", {"rl": "RL", "sft": "SFT on demonstrations", "distill": "online distillation"}[c.mode])
    if c.mode == "distill":
        d = c.distill
        served = f" at {d.teacher_base_url} (scored at temperature 1)" if d.teacher_base_url else ""
        run.add(
            "teacher",
            f"{d.teacher_model}{served} · per-token reverse KL x {d.kl_weight:g}"
            + (f" + reward advantage x {d.reward_weight:g}" if d.reward_weight else " (reward not used)"),
        )
    run.add("run folder", shown_run_folder(c))
    run.add("seed", c.seed)
    if c.checkpointing.resume_step is not None:
        run.add(
            "resume",
            f"from the checkpoint of step {c.checkpointing.resume_step} (later checkpoints are set aside)",
        )

    envs = PlanSection("Environments")
    total = sum(e.weight for e in c.env) or 1.0
    for e in c.env:
        args = ", ".join(f"{k}={v!r}" for k, v in e.args.items()) or "no args"
        envs.add(e.id, f"weight {e.weight:g} ({e.weight / total:.0%} of examples) · {args}")
    if not c.env:
        envs.add("-", "none")

    steps = PlanSection("Steps")
    steps.add("max_steps", c.max_steps)
    if c.on_policy:
        examples = c.batch_size // c.rollouts_per_example
        steps.add(
            "per step",
            f"{c.batch_size} rollouts = {examples} examples x {c.rollouts_per_example} rollouts_per_example",
        )
        steps.add(
            "total", f"{c.batch_size * c.max_steps:,} rollouts over {examples * c.max_steps:,} examples"
        )
    else:
        steps.add("per step", f"{c.batch_size} demonstrations")
        steps.add("data", c.sft.data_path or "the environments' reference answers")
    steps.add("estimate", estimate_text(c, nproc=nproc))  # on this machine, from outputs/timings.jsonl
    if c.on_policy:
        steps.add("trajectory strategy", TRAJECTORY_STRATEGY_TEXT[c.trajectory_strategy])
    steps.add(
        "micro-batches",
        f"{c.gradient_accumulation_steps} x {c.micro_batch_size} samples (gradient accumulation)",
    )
    steps.add("seq_len", c.seq_len or "model maximum")
    s = c.sampling
    stop = f" · stop {s.stop}" if s.stop else ""
    given = s.layer()
    shown = [
        f"{key} {given[key]}" if key in given else f"{key} {default} (or the env's)"
        for key, default in TRAIN_SAMPLING_DEFAULTS.items()
    ]
    shown += [f"{key} {given[key]:g}" for key in ("min_p", "repetition_penalty") if key in given]
    steps.add("sampling", " · ".join(shown) + stop)
    truncated = [
        n
        for n, on in (("masked", c.mask_truncated_completions), ("zero reward", c.zero_truncated_completions))
        if on
    ]
    steps.add("truncated completions", " + ".join(truncated) or "kept as is")

    optim = PlanSection("Optimization")
    optim.add(
        "optimizer",
        f"AdamW lr {c.learning_rate:g} · weight_decay {c.weight_decay:g} · betas {tuple(c.betas)} · clip grad norm {c.max_grad_norm:g}",
    )
    optim.add("learning rate", _schedule(c))
    optim.add("loss", _loss(c))
    optim.add("advantages", "reward - group mean" + (", / group std" if c.scale_advantages_by_std else ""))
    lo = c.lora
    optim.add(
        "LoRA",
        f"r {lo.r} · alpha {lo.alpha:g} · dropout {lo.dropout:g} · {', '.join(lo.target_modules)}"
        if lo.enabled
        else "off: full fine-tuning",
    )
    kl = c.kl_penalty
    optim.add(
        "KL penalty",
        (f"beta {kl.beta:g}" + (f" · adaptive, target_kl {kl.target_kl:g}" if kl.target_kl else ""))
        if kl.enabled
        else "off",
    )
    f = c.difficulty_filter
    optim.add(
        "difficulty filter",
        f"drop variance < {f.min_reward_variance:g} (and zero), mean outside [{f.min_reward:g}, {f.max_reward:g}]; oversample up to {f.oversampling_factor:g}x"
        if f.enabled
        else "off",
    )
    optim.add("async", async_text(c))
    optim.add("activation checkpointing", "on" if c.activation_checkpointing else "off")
    optim.add(
        "dtype",
        f"optimization {c.optimization_dtype} · autocast {c.autocast_dtype} · gradient reduction {c.reduce_dtype}"
        + (" · FSDP CPU offload" if c.fsdp_cpu_offload else ""),
    )

    out = PlanSection("Outputs")
    ck = c.checkpointing
    keep = "all" if ck.keep_n_checkpoints == 0 else f"newest {ck.keep_n_checkpoints}"
    if ck.keep_every_n_steps and ck.keep_n_checkpoints:
        keep += f" + every step that is a multiple of {ck.keep_every_n_steps}, permanently"
    out.add("checkpoints", f"every {ck.save_every_n_steps} steps and at the end · keep {keep}")
    w = c.wandb
    out.add(
        "W&B",
        f"{wandb_mode(c)} · project {w.project or 'workbench'} · name {w.name or '<run folder>'}"
        + (f" · entity {w.entity}" if w.entity else ""),
    )
    ev = c.eval
    if ev.interval:
        on = "; ".join(
            f"{env.id} ({', '.join(f'{k}={v!r}' for k, v in env.args.items()) or 'no args'})"
            for env in ev.env
        )
        out.add(
            "eval",
            f"every {ev.interval} steps on {ev.num_examples} held-out examples x {ev.rollouts_per_example}"
            f" · {'envs ' + on + ', each logged as eval/<env>/...' if ev.env else 'the training envs'}"
            f" · eval/reward_mean, eval/avg@{ev.rollouts_per_example}, eval/pass@{ev.rollouts_per_example}",
        )
    else:
        out.add(
            "eval",
            "off"
            + (
                f" (eval.interval = 0; eval.env {', '.join(env.id for env in ev.env)} unused)"
                if ev.env
                else ""
            ),
        )
    out.add(
        "env_file",
        ", ".join(f"{p} ({'found' if Path(p).is_file() else 'MISSING'})" for p in c.env_file) or "none",
    )

    count = cuda_gpu_count() if gpu_count is None else gpu_count
    i = c.inference
    backend = launch_backend(vllm_installed() and count != 0) if i.mode == "server" and i.launch else None
    infra = PlanSection("Inference & hardware")
    if i.mode == "colocated":
        infra.add("inference", "colocated: the trainer's model generates the rollouts")
    else:
        if backend == "workbench serve":
            infra.add(
                "inference",
                f"server · {replica_count(i)} launched `workbench serve` replica(s) (see Placement)",
            )
        else:
            servers = ["launched vLLM"] if backend else i.base_urls
            infra.add(
                "inference",
                f"server · {', '.join(servers)} · tp {i.tensor_parallel_size} · dp {i.data_parallel_size}",
            )
        infra.add("weights", "new weights pushed to every server after each step")
        if i.launch:  # the vLLM line also on a CPU: what the same config runs on a GPU box
            infra.add(
                "vLLM command",
                _vllm_command(c) + ("" if backend == "vllm" else "  (on a machine with vLLM and a GPU)"),
            )
        if backend == "workbench serve":
            infra.add(
                "replica command",
                f"{shlex.join(replica_command(c, gpu_count=count, parent_pid=None))} --parent-pid <trainer pid>",
            )
    vllm = {
        "model": i.model,
        "gpu_ids": i.gpu_ids or None,
        "tensor_parallel_size": i.tensor_parallel_size if i.tensor_parallel_size > 1 else None,
        "gpu_memory_utilization": i.gpu_memory_utilization,
        "max_model_len": i.max_model_len,
        "tool_call_parser": i.tool_call_parser,
        "enable_auto_tool_choice": i.enable_auto_tool_choice or None,
        "reasoning_parser": i.reasoning_parser,
        "dtype": i.dtype if i.dtype != "auto" else None,
    }
    if shown_vllm := ", ".join(f"{k} {_fmt(v)}" for k, v in vllm.items() if v is not None):
        infra.add("inference settings", shown_vllm)
    infra.add(
        "this machine",
        "no CUDA GPU: CPU" if count == 0 else f"{count if count is not None else 'some'} CUDA GPU(s)",
    )
    hw = {
        "num_gpus": c.num_gpus,
        "trainer_gpu_ids": c.trainer_gpu_ids or None,
        "pipeline_parallel_size": c.pipeline_parallel_size if c.pipeline_parallel_size > 1 else None,
        "data_parallel": c.data_parallel if c.data_parallel != "ddp" else None,
    }  # used by --nproc N
    if shown_hw := ", ".join(f"{k} {_fmt(v)}" for k, v in hw.items() if v is not None):
        infra.add("requested", shown_hw)

    where = PlanSection("Placement (which process runs where)")
    where.add("trainer", trainer_placement(c, count, nproc))
    if nproc > 1:
        where.add("per rank", rank_split(c, nproc))
    for label, value in inference_placement(c, count, backend):
        where.add(label, value)

    return Plan([run, envs, steps, optim, out, infra, where], [*notes, *machine_notes(c, count)], warnings)


def starting_weights(c: TrainConfig) -> str:
    """The weights step 1 trains from: the model as it is, or a checkpoint with its chain of
    adapters merged (a run from a checkpoint starts from it, not from its base); then what trains.
    Reads folders and adapter configs only."""
    from workbench.errors import UserError
    from workbench.inference.resolve import resolve_model_path
    from workbench.models.loading import adapter_chain
    from workbench.workspace import NAMED_MODELS, named_model_dir

    trains = f"new LoRA r {c.lora.r} on top" if c.lora.enabled else "full fine-tuning"
    if c.on_policy and c.kl_penalty.enabled:
        trains += " (KL reference: these starting weights)"
    if c.model in NAMED_MODELS and not (named_model_dir(c.model) / "config.json").is_file():
        return f"{c.model} ({_relative(named_model_dir(c.model))}, made on first use), {trains}"
    try:
        chain = adapter_chain(resolve_model_path(c.model))
    except UserError as exc:
        return f"cannot tell: {exc}"
    adapters = "".join(f" + adapter {_shown(a)} (merged)" for a in chain.adapters)
    return f"{_shown(chain.base)}{adapters}, {trains}"


def _shown(where: Path | str) -> str:
    """A named model by its name and folder ('tiny (outputs/models/tiny)'), another folder by its
    path, a hub id as it is."""
    from workbench.workspace import NAMED_MODELS, named_model_dir

    if isinstance(where, str):
        return where
    named = [
        name for name in NAMED_MODELS if os.path.abspath(named_model_dir(name)) == os.path.abspath(where)
    ]
    return f"{named[0]} ({_relative(where)})" if named else str(_relative(where))


def _relative(where: Path) -> Path:
    """`where` relative to the working directory when it is under it (shorter to read)."""
    here = Path(os.path.abspath(where))
    with contextlib.suppress(ValueError):
        return here.relative_to(Path.cwd())
    return here


def _schedule(c: TrainConfig) -> str:
    warmup = f"warmup {c.warmup_steps} steps, then " if c.warmup_steps else ""
    if c.lr_scheduler == "constant":
        return f"{warmup}constant {c.learning_rate:g}"
    window = f"over the last {c.lr_decay_steps} steps" if c.lr_decay_steps else "over the remaining steps"
    return f"{warmup}{c.lr_scheduler} decay from {c.learning_rate:g} towards {c.min_lr:g} {window}"


def _loss(c: TrainConfig) -> str:
    if c.loss == "grpo":
        return f"grpo · token-level, ratio clipped to [{1 - c.clip_low:g}, {1 + c.clip_low:g}]"
    if c.loss == "dapo":
        return f"dapo · token-level, ratio clipped to [{1 - c.clip_low:g}, {1 + c.clip_high:g}]"
    if c.loss == "dppo":
        return (
            f"dppo (prime-rl's default) · tokens masked when p - mu > {c.dppo_mask_high:g} (A > 0) or "
            f"mu - p > {c.dppo_mask_low:g} (A <= 0) · adv_tau {c.adv_tau:g} · kl_tau {c.kl_tau:g} x (log p - log mu)^2"
        )
    return f"cispo · importance weight capped at {c.cispo_clip:g} (detached)"


def async_text(c: TrainConfig) -> str:
    """How the two off-policy knobs are read (schema.TrainConfig has why there are two)."""
    if c.inference.mode == "colocated":
        return (
            "on-policy: colocated generation uses the current weights (lag 0); max_async_level "
            f"({c.max_async_level}) and max_off_policy_steps ({c.max_off_policy_steps}) apply in server mode"
        )
    ahead = (
        "synchronous: each batch is generated after the previous step's weights are served"
        if c.max_async_level == 0
        else f"max_async_level {c.max_async_level}: generation runs up to {c.max_async_level} step(s) ahead of training"
    )
    bound = (
        f"max_off_policy_steps {c.max_off_policy_steps}: groups more than {c.max_off_policy_steps} step(s) "
        "stale when trained are dropped and regenerated"
    )
    wasted = (
        " (below max_async_level: every batch generated ahead is regenerated; lower max_async_level instead)"
        if c.max_off_policy_steps < c.max_async_level
        else ""
    )
    return f"{ahead} · {bound}{wasted}"


def _fmt(value: object) -> str:
    return str(list(value)) if isinstance(value, (list, tuple)) else str(value)


def shown_run_folder(config: TrainConfig) -> str:
    """The run folder as the plan shows it (the service picks a generated name at start)."""
    return config.output_dir or f"outputs/runs/{config.run_name or '<generated at start>'}"


def _vllm_command(config: TrainConfig) -> str:
    """The `vllm serve ...` line a launch would run (port chosen at launch time)."""
    from workbench.errors import UserError
    from workbench.train.vllm import plan_for_training

    try:
        plan = plan_for_training(config, port=8000, run_dir=Path(shown_run_folder(config)))
    except UserError as exc:
        return f"cannot build it: {exc}"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items()))
    return f"{env} {shlex.join(plan.command)}".strip()
