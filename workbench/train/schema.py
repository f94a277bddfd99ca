"""`TrainConfig`: the one validated schema behind `workbench train CONFIG.toml`.

The field descriptions are the reference documentation. A config file may be written in the
hosted style (these names, the canonical one), or in the self-hosted or minimal trainer's
styles; `workbench.train.translate` maps those onto these names before validation.

    model = "tiny"
    max_steps = 20
    batch_size = 64
    rollouts_per_example = 8

    [[env]]
    id = "reverse-text"

Cross-field rules (batch divisibility, gradient accumulation) are checked here, so every
`TrainConfig` — loaded from a file, a run folder or built in code — is consistent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from workbench.config.bounds import Bounded
from workbench.config.secrets import key_variable_name

DEFAULT_MICRO_BATCH_SIZE = 16


class ConfigProblem(ValueError):
    """A value that cannot work, raised from a validator; `key` names the field to point at."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class Section(Bounded):
    # coerce_numbers_to_str: `--set run_name=123` and `name = 2024` mean the string
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


class EnvConfig(Section):
    id: str = Field(description="Environment id: 'reverse-text', 'owner/name', or a module name.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the environment's load_environment."
    )
    weight: float = Field(
        1.0,
        gt=0,
        description="Relative share of each step's examples drawn from this environment (weights are normalized).",
    )


# Training rollouts' sampling where neither the config nor the environment says otherwise.
TRAIN_SAMPLING_DEFAULTS: dict[str, Any] = {"max_tokens": 128, "temperature": 1.0, "top_p": 1.0, "top_k": -1}


class SamplingConfig(Section):
    """How training rollouts are sampled. A field left unset takes the environment's own
    `sampling_args` (e.g. gsm8k's longer max_tokens), else the default named in its description
    (engine.sampling: environment < config < --set)."""

    max_tokens: int | None = Field(
        None,
        ge=1,
        description="Max tokens per model turn during training rollouts. Default: the environment's, else 128.",
    )
    temperature: float | None = Field(
        None,
        ge=0,
        description="Sampling temperature. RL needs diversity within a group, so 1.0 is the usual choice. Default: the environment's, else 1.0.",
    )
    top_p: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Nucleus sampling; 1.0 keeps the full distribution (the importance ratio assumes the sampler's own distribution). Default: the environment's, else 1.0.",
    )
    top_k: int | None = Field(
        None, ge=-1, description="Top-k sampling; -1 disables it. Default: the environment's, else -1."
    )
    stop: list[str] = Field(
        default_factory=list, description="Strings that end a turn. Default: the environment's, else none."
    )
    min_p: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Drop tokens whose probability is below min_p x the most likely token's (vLLM's min_p); 0 or unset keeps all. Logprobs stay those of the untruncated distribution, which the trainer recomputes.",
    )
    repetition_penalty: float | None = Field(
        None,
        gt=0,
        description="Penalize tokens already in the prompt or the completion (vLLM's and transformers' rule: a positive logit is divided by it, a negative one multiplied); 1.0 or unset is off. Logprobs stay those of the unpenalized distribution, which the trainer recomputes.",
    )

    def layer(self) -> dict[str, Any]:
        """The settings this config gives (unset ones are left to the environment)."""
        values = self.model_dump(exclude_none=True)
        if not self.stop:
            values.pop("stop")
        return values


class LoraConfig(Section):
    enabled: bool = Field(
        True,
        description="Train a LoRA adapter (peft) instead of all weights: far less memory, and checkpoints are small adapters loadable on their base model.",
    )
    r: int = Field(8, ge=1, description="LoRA rank.")
    alpha: float = Field(16, gt=0, description="LoRA alpha; the update is scaled by alpha / r.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA path.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Module names that get adapters (attention projections by default).",
    )


class KLConfig(Section):
    enabled: bool = Field(
        False,
        description="Add a KL penalty (k3 estimator) against the reference model: the base model, or for LoRA the same model with the adapter disabled. Off by default: the clipped ratio already limits drift, and the reference costs an extra forward pass.",
    )
    beta: float = Field(0.05, ge=0, description="Weight of the KL term in the loss.")
    target_kl: float | None = Field(
        None, gt=0, description="If set, beta adapts each step to keep the measured KL near this value."
    )


class DifficultyFilterConfig(Section):
    enabled: bool = Field(
        False,
        description="Online difficulty filtering: drop groups that cannot teach the policy anything and sample more examples to refill the batch.",
    )
    min_reward_variance: float = Field(
        0.0,
        ge=0,
        description="Drop groups whose reward variance is below this; zero-variance groups (all rollouts scored the same, so every advantage is 0) are always dropped when enabled.",
    )
    max_reward: float = Field(1.0, description="Drop groups whose mean reward is above this (too easy).")
    min_reward: float = Field(0.0, description="Drop groups whose mean reward is below this (too hard).")
    oversampling_factor: float = Field(
        2.0,
        ge=1,
        description="At most this many examples are sampled per needed example before the step goes ahead with a partly filled batch.",
    )

    @model_validator(mode="after")
    def _range(self) -> DifficultyFilterConfig:
        if self.min_reward > self.max_reward:
            raise ConfigProblem(
                "min_reward",
                f"difficulty_filter.min_reward ({self.min_reward}) is above max_reward ({self.max_reward}): every group would be dropped",
            )
        return self


class CheckpointConfig(Section):
    save_every_n_steps: int = Field(
        10, ge=1, description="Write a checkpoint every N steps (and always at the last step and on Ctrl-C)."
    )
    keep_n_checkpoints: int = Field(3, ge=0, description="Keep the newest N checkpoints; 0 keeps all.")
    keep_every_n_steps: int | None = Field(
        None,
        ge=1,
        description="Also keep every checkpoint whose step is a multiple of N, permanently (besides the newest keep_n_checkpoints). Only saved steps can be kept: make it a multiple of save_every_n_steps.",
    )
    resume_step: int | None = Field(
        None,
        ge=0,
        description="With `workbench train --resume RUN`: continue from this step's checkpoint instead of the newest (prime-rl's --trainer.ckpt.resume-step); the run's later checkpoints and metrics are set aside, not deleted.",
    )


class WandbConfig(Section):
    project: str | None = Field(None, description="W&B project (default 'workbench').")
    name: str | None = Field(None, description="W&B run name (default: the run folder's name).")
    entity: str | None = Field(None, description="W&B team or user.")
    mode: Literal["offline", "online", "disabled"] | None = Field(
        None,
        description="None: offline unless WANDB_API_KEY is set (an env_file may set it), so a run never needs a login.",
    )


class EvalDuringTrainConfig(Section):
    interval: int = Field(
        0,
        ge=0,
        description="Evaluate on held-out examples every N steps (and before the first and after the last); 0 turns it off.",
    )
    num_examples: int = Field(32, ge=1, description="Held-out examples per evaluation.")
    rollouts_per_example: int = Field(
        1,
        ge=1,
        description="Rollouts per held-out example: the k of eval/avg@k (the mean over examples of their rollouts' mean reward) and eval/pass@k (the share of examples with at least one correct rollout: reward >= the environment's pass_threshold, 0.5 unless it sets one), logged as prime-rl logs its evals. prime-rl's orchestrator.eval.group_size.",
    )
    env: list[EnvConfig] = Field(
        default_factory=list,
        description="Environments for online evaluation ([[eval.env]] tables, loaded like [[env]]; weight is not used); default: the training environments. Each is evaluated on num_examples examples of its eval split and logged as eval/<env>/reward_mean, eval/<env>/avg@k and eval/<env>/pass@k, besides the overall eval/reward_mean, eval/avg@k and eval/pass@k.",
    )


class SFTConfig(Section):
    data_path: str | None = Field(
        None,
        description='Demonstrations: a JSONL file with one {"messages": [...]} per line (relative to the config file).',
    )
    from_env: bool = Field(
        False,
        description="Use the environments' own reference answers (reference_completion) as demonstrations.",
    )
    epochs: float = Field(
        1.0, gt=0, description="Passes over the demonstrations; used when max_steps would run past the data."
    )


class DistillConfig(Section):
    teacher_model: str | None = Field(
        None,
        description="The teacher for mode = 'distill': a local model folder, a training run (its newest checkpoint) or checkpoint folder, 'tiny', or a Hugging Face id. It must share the student's tokenizer; it is frozen and scores every token the student samples.",
    )
    teacher_base_url: str | None = Field(
        None,
        description="A teacher behind an OpenAI-compatible server that scores prompts (vLLM, `workbench serve`): its base URL ('http://host:8000/v1'); teacher_model is then the name it serves. Scored at temperature 1.",
    )
    teacher_api_key_var: str | None = Field(
        None, description="Environment variable holding the teacher server's API key."
    )
    kl_weight: float = Field(
        1.0,
        gt=0,
        description="Weight of the per-token reverse KL to the teacher: each sampled token's advantage gets kl_weight x (teacher logprob - student logprob).",
    )
    reward_weight: float = Field(
        0.0,
        ge=0,
        description="Weight of the environment's reward (the RL advantage, reward minus the group mean) mixed in; 0 is pure distillation. With a weight above 0, rollouts_per_example must be at least 2.",
    )

    _key_name = field_validator("teacher_api_key_var")(
        classmethod(lambda cls, value: key_variable_name(value))
    )

    @field_validator("teacher_base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got '{value}'")
        return value


class InferenceConfig(Section):
    mode: Literal["colocated", "server"] = Field(
        "colocated",
        description="'colocated': the trainer's own model generates rollouts (one machine, CPU or GPU). 'server': rollouts come from OpenAI-compatible (vLLM) servers that receive weight updates.",
    )
    base_urls: list[str] = Field(
        default_factory=list,
        description="Server mode: inference servers, each a base URL ('http://host:8000/v1') or an endpoint id from configs/endpoints.toml; requests are spread over all of them and every one receives the weight updates.",
    )
    api_key_var: str | None = Field(
        None,
        description="Server mode: environment variable holding the servers' API key (endpoint ids carry their own).",
    )
    launch: bool = Field(
        False,
        description="Server mode: the run starts its own inference servers, uses them in place of base_urls and stops them when it ends (also on Ctrl-C, an error, or kill -9 of the trainer): `vllm serve` on inference.gpu_ids where vLLM and a CUDA GPU are present, otherwise data_parallel_size `workbench serve` replicas on this machine (logs in <run>/inference/). `--dry-run` shows which process runs where.",
    )
    gpu_ids: list[int] = Field(
        default_factory=list,
        description="GPUs for the launched inference server (prime-rl's inference_gpu_ids). Without data_parallel_size, len(gpu_ids) / tensor_parallel_size replicas.",
    )
    tensor_parallel_size: int = Field(
        1, ge=1, description="vLLM tensor parallel size (GPUs per replica; above 1 a launch needs vLLM)."
    )
    data_parallel_size: int = Field(
        1,
        ge=1,
        description="Inference replicas (vLLM's --data-parallel-size, prime-rl's inference.parallel.dp). With launch = true and no vLLM here: that many `workbench serve` processes. When not set: len(gpu_ids) / tensor_parallel_size, else the number of base_urls (the servers the launch stands in for), else 1.",
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Fraction of GPU memory vLLM may use (vLLM's default when unset)."
    )
    max_model_len: int | None = Field(
        None, ge=1, description="vLLM max context length (default: the model's)."
    )
    enable_auto_tool_choice: bool = Field(False, description="vLLM: let the model call tools.")
    tool_call_parser: str | None = Field(None, description="vLLM tool call parser, e.g. 'hermes'.")
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        "auto",
        description="--dtype for the weights of a launched server. vLLM: 'auto' is FP16 for FP32/FP16 models and BF16 for BF16 models. `workbench serve` replicas (no vLLM here): 'float32' or 'bfloat16' ('auto': float32 on a CPU; bfloat16 is faster on a CPU with AMX or AVX512-BF16). Colocated generation uses the trainer's model as it is.",
    )
    reasoning_parser: Literal["qwen3", "deepseek_r1"] | None = Field(
        None,
        description="Thinking models: split `<think>...</think>` out of each reply into `reasoning_content`, so parsers and rubrics score the answer, not the thinking (vLLM's --reasoning-parser; the in-process model splits on its own when its vocabulary has <think>).",
    )
    model: str | None = Field(
        None, description="Model name served for inference when it differs from `model`."
    )

    _key_name = field_validator("api_key_var")(classmethod(lambda cls, value: key_variable_name(value)))

    @model_validator(mode="after")
    def _server_source(self) -> InferenceConfig:
        if self.mode == "server" and not self.base_urls and not self.launch:
            raise ConfigProblem(
                "mode", "inference.mode = 'server' needs inference.base_urls or inference.launch = true"
            )
        if self.launch and self.mode != "server":
            raise ConfigProblem(
                "launch",
                "inference.launch = true needs inference.mode = 'server' (the launched vLLM server generates the rollouts)",
            )
        return self


class TrainConfig(Section):
    model: str = Field(
        "tiny",
        description="'tiny' (the embedded model), a local model folder or checkpoint, or a Hugging Face id.",
    )
    tokenizer: str | None = Field(None, description="Tokenizer to use when it differs from the model's.")
    mode: Literal["rl", "sft", "distill"] = Field(
        "rl",
        description="'rl': reinforcement learning on environments. 'sft': supervised fine-tuning on demonstrations. 'distill': online distillation: the policy samples rollouts on the environments and learns to match a teacher's log-probabilities on them (see [distill]).",
    )
    max_steps: int = Field(20, ge=1, description="Optimizer steps.")
    batch_size: int = Field(
        64,
        ge=1,
        description="Rollouts (samples) per optimizer step; batch_size / rollouts_per_example examples per step.",
    )
    rollouts_per_example: int = Field(
        8,
        ge=1,
        description="Rollouts per example. Advantages are reward minus the group mean, so a group needs at least 2.",
    )
    micro_batch_size: int = Field(
        DEFAULT_MICRO_BATCH_SIZE,
        ge=1,
        description="Samples per forward/backward pass; must divide batch_size. When not given it is batch_size / gradient_accumulation_steps, or the largest divisor of batch_size up to 16.",
    )
    pack_samples: bool = Field(
        True,
        description="Pack each step's samples end to end into rows (best-fit decreasing; position ids and attention restart per sample) instead of right-padding every sample to its micro-batch's longest: fewer padding tokens in the forward/backward passes (reverse-text: 21% -> 11%), the same loss and gradients. With eager/SDPA attention, samples that start with the same prompt (an RL group's rollouts) share it: the prompt is run once in a row followed by each completion, which attends to it (reverse-text RL: ~3x fewer tokens in the forward/backward passes, the same loss and gradients). A packed micro-batch is never larger than micro_batch_size x the longest sample's tokens. Rows are the longest sample wide with eager/SDPA attention (which computes masked scores too), seq_len wide (else one row per micro-batch) with flash-attention. false: micro-batches of micro_batch_size right-padded samples.",
    )
    gradient_accumulation_steps: int | None = Field(
        None,
        ge=1,
        description="Micro-batches per optimizer step. Derived (batch_size / micro_batch_size) when not given; must agree when both are given.",
    )
    learning_rate: float = Field(
        5e-4,
        ge=0,
        description="AdamW peak learning rate. The default suits LoRA on small models; full fine-tuning of large models wants ~1e-6..1e-5.",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps from 0 to learning_rate.")
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="Learning rate after warmup: 'constant' stays at learning_rate; 'linear' and 'cosine' decay it to min_lr by the last step (over the last lr_decay_steps steps when set).",
    )
    min_lr: float = Field(0.0, ge=0, description="Where 'linear' and 'cosine' schedules end.")
    lr_decay_steps: int | None = Field(
        None,
        ge=1,
        description="Decay over the last N steps only (warmup, stable, decay: prime-rl's decay_steps); default: every step after warmup.",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    loss: Literal["grpo", "dapo", "cispo", "dppo"] = Field(
        "grpo",
        description="'grpo': ratio clipped to [1-clip_low, 1+clip_low]. 'dapo': asymmetric clip [1-clip_low, 1+clip_high]. 'cispo': the importance weight is capped at cispo_clip and detached, so every token keeps a gradient. 'dppo': prime-rl's default loss ([trainer.loss] type = 'default'): tokens whose probability moved too far from the sampler's are masked by advantage sign (dppo_mask_low/high), the rest get adv_tau x advantage x ratio, plus kl_tau x (log ratio)^2 on every token.",
    )
    clip_low: float = Field(
        0.2, ge=0, description="Lower clip of the importance ratio (both sides for grpo)."
    )
    clip_high: float = Field(
        0.28, ge=0, description="Upper clip for dapo (a higher upper clip lets unlikely good tokens grow)."
    )
    cispo_clip: float = Field(5.0, gt=0, description="Cap on the importance weight for cispo.")
    # The four dppo defaults are prime-rl's DefaultLossConfig's (its vetted setting), so a pasted
    # `[trainer.loss] type = "default"` trains as prime-rl would.
    dppo_mask_high: float = Field(
        0.2,
        ge=0,
        description="dppo: a token with a positive advantage is left out of the policy-gradient term when the trainer's probability of it is more than this above the sampler's (p - mu > dppo_mask_high): the update already pushed it up enough (a trust region on the probability, not the ratio). prime-rl's default 0.2.",
    )
    dppo_mask_low: float = Field(
        0.2,
        ge=0,
        description="dppo: a token with a negative (or zero) advantage is left out when the trainer's probability of it is more than this below the sampler's (mu - p > dppo_mask_low). prime-rl's default 0.2.",
    )
    adv_tau: float = Field(
        1.0,
        ge=0,
        description="dppo: weight of the policy-gradient term (advantage x ratio); 0 leaves only the KL term. prime-rl's default 1.0.",
    )
    kl_tau: float = Field(
        1e-3,
        ge=0,
        description="dppo: weight of the squared log-ratio between trainer and sampler, (log p - log mu)^2, on every loss token: it pulls a drifting trainer back towards the policy that sampled (not a KL to a reference model; see [kl_penalty] for that). prime-rl's default 1e-3: small next to the advantage term; 0 turns it off.",
    )
    scale_advantages_by_std: bool = Field(
        False,
        description="Divide advantages by the group's reward std. Off by default: scaling over-weights near-uniform groups (Dr. GRPO).",
    )
    # Two knobs, as prime-rl had them until it fixed the first at 1 (May 2026): how far generation
    # may run ahead, and how stale a trained rollout may be. They are not one setting under two
    # names: an older config that sets both (configs/rl/reverse-text-server.toml: 1 and 2) means
    # both, so max_async_level keeps its old meaning and prime-rl's current dial is the second.
    max_async_level: int = Field(
        1,
        ge=0,
        description="Server mode: how many steps generation may run ahead of training (prime-rl's older knob, kept for configs that set it; current prime-rl fixes it at 1). Step s's batch starts generating once the servers hold the weights of step s-1-max_async_level, so its rollouts are at most this many steps stale. 0: synchronous, on-policy (generate, then train). Default 1, prime-rl's one-step overlap: step n+1's rollouts are generated while step n trains. Colocated runs generate on demand with the current weights (lag 0) and ignore it.",
    )
    max_off_policy_steps: int = Field(
        8,
        ge=0,
        description="Server mode: maximum staleness of a trained rollout (prime-rl's orchestrator.max_off_policy_steps): the policy version a step trains on minus the version that generated the rollout (recorded when its batch began, so time queued ahead of the trainer counts). Groups past the bound are dropped (policy/off_policy_dropped) and regenerated by the current policy. Default 8, prime-rl's. The lag a run sees is at most min(max_async_level, max_off_policy_steps); below max_async_level every batch generated ahead is dropped and generated again (set max_async_level lower instead).",
    )
    trajectory_strategy: Literal["interleaved", "branching"] = Field(
        "interleaved",
        description="How a multi-turn rollout becomes training samples. 'interleaved': one sample per rollout; each turn continues the previous turns' exact token ids (tokens in, tokens out), so the sample is exactly what the sampler saw. 'branching': one sample per model turn, each with the prompt the chat template really rendered; use it for thinking models (Qwen3), whose templates strip earlier turns' thinking.",
    )
    seq_len: int | None = Field(
        None,
        ge=1,
        description="Max tokens per training sample (prompt + completion); longer samples are truncated. Default: no limit beyond the model's.",
    )
    mask_truncated_completions: bool = Field(
        False, description="Leave completions cut by max_tokens out of the loss."
    )
    zero_truncated_completions: bool = Field(
        False, description="Give completions cut by max_tokens zero reward."
    )
    seed: int = Field(
        0, description="Seed for example order, sampling and initialization; the same seed reproduces a run."
    )
    max_concurrent: int | None = Field(
        None,
        ge=1,
        description="Rollouts in flight at once, for training steps and held-out evaluation alike (lower it for a rate-limited server). Default: a whole step at once (max(64, batch_size)) for training, 64 for evaluation.",
    )
    run_name: str | None = Field(
        None, description="Run folder name (default: generated from env, model and time)."
    )
    output_dir: str | None = Field(None, description="Run folder (default outputs/runs/<run_name>).")
    env: list[EnvConfig] = Field(
        default_factory=list, description="Training environments ([[env]] tables); required for rl."
    )
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig, description="How training rollouts are sampled."
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapter settings.")
    kl_penalty: KLConfig = Field(
        default_factory=KLConfig, description="KL penalty against the reference model."
    )
    difficulty_filter: DifficultyFilterConfig = Field(
        default_factory=DifficultyFilterConfig, description="Online difficulty filtering."
    )
    checkpointing: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoint frequency and retention."
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Weights & Biases logging.")
    eval: EvalDuringTrainConfig = Field(
        default_factory=EvalDuringTrainConfig, description="Held-out evaluation during training."
    )
    sft: SFTConfig = Field(
        default_factory=SFTConfig, description="Supervised fine-tuning data (mode = 'sft')."
    )
    distill: DistillConfig = Field(
        default_factory=DistillConfig, description="Online distillation (mode = 'distill')."
    )
    inference: InferenceConfig = Field(
        default_factory=InferenceConfig, description="Where rollouts are generated."
    )
    optimization_dtype: Literal["bfloat16", "float32"] = Field(
        "float32",
        description="Precision of the policy's weights for the forward and backward passes. 'bfloat16' halves the memory. On a CUDA GPU it is the trainer processes' weight dtype (--nproc N, torchrun). On a CPU that multiplies bfloat16 natively (AVX512-BF16 or AMX) it applies to LoRA's frozen base weights, while the adapters, which train, stay float32 (SmolLM2-135M: forward/backward ~5x faster); full fine-tuning on a CPU trains in float32.",
    )
    autocast_dtype: Literal["bfloat16", "float32"] = Field(
        "float32",
        description="Mixed precision for the training passes: 'bfloat16' runs them under torch.autocast (matmuls in bfloat16; weights, gradients and the optimizer stay float32). Fast where the hardware has bfloat16 matmuls (a CPU with AMX or AVX512-BF16, a CUDA GPU); the trainer's logprobs then differ slightly from the sampler's, which `policy/mismatch_kl` shows. 'float32' keeps every pass exact.",
    )
    reduce_dtype: Literal["bfloat16", "float32"] = Field(
        "float32",
        description="Precision of the gradient all-reduce across trainer processes. Accepted for prime-rl configs; gradients are reduced in the weights' dtype (see optimization_dtype).",
    )
    fsdp_cpu_offload: bool = Field(
        False,
        description="With data_parallel = 'fsdp' and several processes: keep sharded parameters, gradients and optimizer state in CPU memory between uses (FSDP2 CPUOffloadPolicy), trading speed for GPU memory. Has no effect with one process.",
    )
    activation_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass: less memory, ~30% more compute."
    )
    num_gpus: int | None = Field(
        None, ge=1, description="GPUs to use in all; on a machine without CUDA everything runs on the CPU."
    )
    trainer_gpu_ids: list[int] = Field(
        default_factory=list, description="GPUs for the trainer (the rest of num_gpus serve inference)."
    )
    pipeline_parallel_size: int = Field(1, ge=1, description="Pipeline parallel stages of the trainer.")
    data_parallel: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="How the processes of `workbench train --nproc N` (or torchrun) share the model. 'ddp': a full replica per process, gradients all-reduced. 'fsdp': parameters, gradients and optimizer state sharded across processes (FSDP2), for models whose training state does not fit one device; the full weights are gathered for colocated generation and checkpoints. Either way each step's batch_size rollouts are split across the processes. Ignored with one process.",
    )
    env_file: list[str] = Field(
        default_factory=list,
        description="KEY=VALUE files (relative to the config file) loaded into the environment before the run, e.g. API keys. Their values are never saved; a missing file stops a run.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.mode == "distill" and not self.distill.teacher_model:
            raise ConfigProblem(
                "mode",
                "mode = 'distill' needs distill.teacher_model (a model folder, a training run or checkpoint)",
            )
        if self.on_policy:
            if not self.env:
                raise ConfigProblem(
                    "env",
                    f'{self.mode} training needs at least one [[env]] (e.g. [[env]] id = "reverse-text")',
                )
            if self.rollouts_per_example < 2 and (self.mode == "rl" or self.distill.reward_weight > 0):
                raise ConfigProblem(
                    "rollouts_per_example",
                    "rollouts_per_example must be at least 2 for rl: advantages compare rollouts of the same example",
                )
            if self.batch_size % self.rollouts_per_example:
                raise ConfigProblem(
                    "batch_size",
                    f"batch_size ({self.batch_size}) must be divisible by rollouts_per_example ({self.rollouts_per_example})",
                )
        if self.mode == "sft" and not self.sft.data_path and not self.sft.from_env:
            raise ConfigProblem(
                "mode", "mode = 'sft' needs sft.data_path (a JSONL of chat messages) or sft.from_env = true"
            )
        if self.mode == "sft" and self.sft.from_env and not self.env:
            raise ConfigProblem(
                "sft", "sft.from_env = true needs at least one [[env]] to take reference answers from"
            )
        self._resolve_micro_batches()
        return self

    @property
    def on_policy(self) -> bool:
        """The policy samples its own rollouts on the environments (rl and distill)."""
        return self.mode in ("rl", "distill")

    def step_concurrency(self) -> int:
        """Rollouts in flight while collecting a training step."""
        return self.max_concurrent or max(64, self.batch_size)

    def eval_concurrency(self) -> int:
        """Rollouts in flight during held-out evaluation."""
        return self.max_concurrent or 64

    def _resolve_micro_batches(self) -> None:
        """Fill in micro_batch_size / gradient_accumulation_steps; explicit values must agree."""
        given = self.model_fields_set
        accum = self.gradient_accumulation_steps
        if "micro_batch_size" in given:
            if self.micro_batch_size > self.batch_size:
                raise ConfigProblem(
                    "micro_batch_size",
                    f"micro_batch_size ({self.micro_batch_size}) is larger than batch_size ({self.batch_size})",
                )
            if self.batch_size % self.micro_batch_size:
                raise ConfigProblem(
                    "micro_batch_size",
                    f"batch_size ({self.batch_size}) must be divisible by micro_batch_size ({self.micro_batch_size})",
                )
        elif accum is not None:
            if self.batch_size % accum:
                raise ConfigProblem(
                    "gradient_accumulation_steps",
                    f"batch_size ({self.batch_size}) must be divisible by gradient_accumulation_steps ({accum})",
                )
            self.micro_batch_size = self.batch_size // accum
        else:
            self.micro_batch_size = max(
                d
                for d in range(1, min(DEFAULT_MICRO_BATCH_SIZE, self.batch_size) + 1)
                if self.batch_size % d == 0
            )
        derived = self.batch_size // self.micro_batch_size
        if accum is not None and accum != derived:
            raise ConfigProblem(
                "gradient_accumulation_steps",
                f"gradient_accumulation_steps ({accum}) disagrees with batch_size / micro_batch_size ({self.batch_size} / {self.micro_batch_size} = {derived}); set one of them",
            )
        self.gradient_accumulation_steps = derived
