"""Map the training config styles users paste onto the workbench schema (`TrainConfig` names).

Accepted styles, detected from the keys present (a file may mix them):

- hosted (canonical): `model`, `batch_size`, `[sampling]`, `[[env]]`, `[lora]`, ... — unchanged.
- prime-rl nested: `[model] name`, `[trainer.optim] lr`, `[trainer.model.lora] rank`,
  `[orchestrator] batch_size`, `[orchestrator.buffer]`, `[[orchestrator.env]]`,
  `[orchestrator.eval]` + `[[orchestrator.eval.env]]`, `[trainer.ckpt]`, `[trainer.model] optimization_dtype`,
  `[inference.model]`, `inference_gpu_ids`, ...
- prime-rl flat: `model_name`, `use_lora`, `lora_rank`, `use_difficulty_filtering`,
  `difficulty_threshold`, `tensor_parallel_size`, ... and a single `[env]` table.
- vf-rl (the minimal trainer): `[trainer] gpus` + `[trainer.args]`, `[inference] gpus` +
  `[inference.args]` (vLLM arguments), `[env] id` + `[env.args]`.

`translate` is a pure function: raw TOML dict in, canonical dict + notes out. Keys it does not
know are left in place, so validation reports them with file, line and the closest valid key;
leftovers inside a foreign table (`[trainer.optim] lrr`) are returned in `Translation.unknown`
with the closest key that table accepts.

prime-rl's current keys that have no counterpart here (`[orchestrator.algo]`, `[[orchestrator.train.source]]`,
`renderer`, `[trainer.loss] type = "custom"`, ...: `UNSUPPORTED`) are taken out and listed in
`Translation.unsupported` and the notes as "not supported here: KEY = VALUE": the plan (and the
start of a real run) names each one, a pasted config still runs, and nothing is dropped silently.
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

NESTED, FLAT, VF = "prime-rl nested", "prime-rl flat", "vf-rl"
PRIME_RL_DEFAULT_ENV = "reverse-text"  # prime-rl's orchestrator trains on this when no env is given

# tables of the canonical schema: a rule path through them is not a foreign table
CANONICAL_TABLES = {
    "sampling",
    "lora",
    "kl_penalty",
    "difficulty_filter",
    "checkpointing",
    "wandb",
    "eval",
    "sft",
    "inference",
    "distill",
}
GEPA_KEYS = ("reflection_model", "max_calls", "num_train", "num_val", "minibatch_size", "perfect_score")


class TranslationError(ValueError):
    """A config that cannot be translated; `key` is the dotted source key to point at (or None)."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass
class Translation:
    data: dict[str, Any]  # canonical names, ready for TrainConfig validation
    style: str  # "hosted", one of the styles above, or "mixed (a + b)"
    notes: list[str] = field(default_factory=list)
    moves: list[tuple[str, str]] = field(default_factory=list)  # (source key, canonical key)
    unknown: tuple[str, str | None] | None = None  # (source key, closest valid) inside a foreign table
    unsupported: list[str] = field(default_factory=list)  # source keys read but not applied (UNSUPPORTED)


class _Builder:
    """Collects the canonical dict, remembering where each value came from."""

    def __init__(self) -> None:
        self.out: dict[str, Any] = {}
        self.moves: list[tuple[str, str]] = []
        self.notes: list[str] = []
        self.styles: list[str] = []
        self.gpus: dict[str, int] = {}
        self.unsupported: list[str] = []

    def not_supported(self, src: str, value: Any, why: str | None) -> None:
        """A key this config sets that workbench reads but cannot apply: a note that names it
        (and `why`: what workbench does instead, given once for the keys of one table)."""
        self.unsupported.append(src)
        self.notes.append(f"not supported here: {src} = {_shown_value(value)}" + (f" ({why})" if why else ""))

    def put(self, dst: str, value: Any, src: str) -> None:
        *parents, leaf = dst.split(".")
        node = self.out
        for part in parents:
            node = node.setdefault(part, {})
        if leaf in node and node[leaf] != value:
            raise TranslationError(
                src, f"'{src}' sets {dst}, which '{origin(self.moves, dst)}' already sets; keep one"
            )
        node[leaf] = value
        self.moves.append((src, dst))


Handler = Callable[[Any, str, _Builder], None]


def _to(dst: str) -> Handler:
    return lambda value, src, b: b.put(dst, value, src)


def _ac_freq(value: Any, src: str, b: _Builder) -> None:
    b.put("activation_checkpointing", bool(value), src)
    if isinstance(value, int) and value > 1:
        b.notes.append(f"{src} = {value}: workbench checkpoints activations of every layer")


def _buffer_type(value: Any, src: str, b: _Builder) -> None:
    kinds = {"online-difficulty": True, "online_difficulty": True, "simple": False, "default": False}
    if value not in kinds:
        raise TranslationError(
            src, f'{src} = {value!r} is not supported (use "online-difficulty" or "simple")'
        )
    b.put("difficulty_filter.enabled", kinds[value], src)


def _wandb_offline(value: Any, src: str, b: _Builder) -> None:
    if value:
        b.put("wandb.mode", "offline", src)  # False: leave it to WANDB_API_KEY (online when set)


def _beta(index: int) -> Handler:
    def handle(value: Any, src: str, b: _Builder) -> None:
        betas = list(b.out.get("betas", [0.9, 0.999]))
        betas[index] = value
        b.out["betas"] = betas
        b.moves.append((src, f"betas[{index}]"))

    return handle


def _scale_rewards(value: Any, src: str, b: _Builder) -> None:
    if value not in ("group", "none", True, False):
        raise TranslationError(src, f'{src} = {value!r} is not supported (use "group" or "none")')
    b.put("scale_advantages_by_std", value in ("group", True), src)


def _kl_beta(value: Any, src: str, b: _Builder) -> None:
    b.put("kl_penalty.enabled", bool(value), src)
    if value:
        b.put("kl_penalty.beta", value, src)


# Scheduler names of prime-rl ([trainer.scheduler] type) and transformers (lr_scheduler_type) -> ours.
_SCHEDULERS = {
    "constant": "constant",
    "constant_with_warmup": "constant",
    "linear": "linear",
    "wsd": "linear",
    "cosine": "cosine",
    "cosine_with_min_lr": "cosine",
}


def _scheduler(value: Any, src: str, b: _Builder) -> None:
    if value not in _SCHEDULERS:
        raise TranslationError(
            src, f'{src} = {value!r} is not supported (use "constant", "linear" or "cosine")'
        )
    b.put("lr_scheduler", _SCHEDULERS[value], src)


def _loss_type(value: Any, src: str, b: _Builder) -> None:
    """prime-rl's `[trainer.loss] type`: "default" is its DPPO + KL loss, workbench's dppo."""
    if value == "default":
        b.put("loss", "dppo", src)
    else:
        b.not_supported(
            src, value, "workbench's losses are grpo, dapo, cispo and dppo (prime-rl's \"default\")"
        )


def _bf16(value: Any, src: str, b: _Builder) -> None:
    b.put("optimization_dtype", "bfloat16" if value else "float32", src)


def _gpus(role: str) -> Handler:
    def handle(value: Any, src: str, b: _Builder) -> None:
        b.gpus[role] = value
        b.moves.append((src, "inference.gpu_ids" if role == "inference" else "trainer_gpu_ids"))

    return handle


def _lora_rules(prefix: str, style: str) -> list[tuple[str, Handler, str]]:
    names = {"rank": "r", "alpha": "alpha", "dropout": "dropout", "target_modules": "target_modules"}
    return [(f"{prefix}.{k}", _to(f"lora.{v}"), style) for k, v in names.items()]


_VF_ARGS = {
    "run_name": "run_name",
    "output_dir": "output_dir",
    "micro_batch_size": "micro_batch_size",
    "rollouts_per_example": "rollouts_per_example",
    "batch_size": "batch_size",
    "max_steps": "max_steps",
    "max_seq_len": "seq_len",
    "max_tokens": "sampling.max_tokens",
    "temperature": "sampling.temperature",
    "top_p": "sampling.top_p",
    "top_k": "sampling.top_k",
    "learning_rate": "learning_rate",
    "weight_decay": "weight_decay",
    "warmup_steps": "warmup_steps",
    "max_grad_norm": "max_grad_norm",
    "seed": "seed",
    "use_lora": "lora.enabled",
    "lora_rank": "lora.r",
    "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout",
    "lora_target_modules": "lora.target_modules",
    "mask_truncated_completions": "mask_truncated_completions",
    "zero_truncated_completions": "zero_truncated_completions",
    "gradient_checkpointing": "activation_checkpointing",
    "save_steps": "checkpointing.save_every_n_steps",
    "num_batches_ahead": "max_async_level",
    "epsilon": "clip_low",
    "min_p": "sampling.min_p",
    "repetition_penalty": "sampling.repetition_penalty",
}
_VLLM_ARGS = (
    "enable_auto_tool_choice",
    "tool_call_parser",
    "max_model_len",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "data_parallel_size",
    "model",
)

RULES: list[tuple[str, Handler, str]] = [
    # prime-rl nested
    ("model.name", _to("model"), NESTED),
    ("trainer.model.name", _to("model"), NESTED),
    ("trainer.tokenizer.name", _to("tokenizer"), NESTED),
    ("trainer.optim.lr", _to("learning_rate"), NESTED),
    ("trainer.optim.weight_decay", _to("weight_decay"), NESTED),
    ("trainer.optim.max_norm", _to("max_grad_norm"), NESTED),
    ("trainer.optim.betas1", _beta(0), NESTED),
    ("trainer.optim.betas2", _beta(1), NESTED),
    ("trainer.scheduler.warmup_steps", _to("warmup_steps"), NESTED),
    ("trainer.scheduler.type", _scheduler, NESTED),
    ("trainer.scheduler.min_lr", _to("min_lr"), NESTED),
    ("trainer.scheduler.decay_steps", _to("lr_decay_steps"), NESTED),
    ("trainer.model.fsdp_cpu_offload", _to("fsdp_cpu_offload"), NESTED),
    ("trainer.model.ac.freq", _ac_freq, NESTED),
    ("trainer.model.optimization_dtype", _to("optimization_dtype"), NESTED),
    ("trainer.model.reduce_dtype", _to("reduce_dtype"), NESTED),
    *_lora_rules("trainer.model.lora", NESTED),
    *_lora_rules("trainer.model.experimental.lora", NESTED),
    *[
        (f"orchestrator.{k}", _to(k), NESTED)
        for k in (
            "batch_size",
            "micro_batch_size",
            "rollouts_per_example",
            "seq_len",
            "max_steps",
            "seed",
            "max_async_level",
            "max_off_policy_steps",
            "mask_truncated_completions",
            "zero_truncated_completions",
            "trajectory_strategy",
        )
    ],
    ("orchestrator.group_size", _to("rollouts_per_example"), NESTED),  # prime-rl's newer name
    ("orchestrator.eval.group_size", _to("eval.rollouts_per_example"), NESTED),
    ("orchestrator.train.sampling.temperature", _to("sampling.temperature"), NESTED),
    ("orchestrator.train.sampling.max_completion_tokens", _to("sampling.max_tokens"), NESTED),
    ("trainer.max_async_level", _to("max_async_level"), NESTED),  # older prime-rl set it per process
    ("trainer.loss.type", _loss_type, NESTED),
    *[
        (f"trainer.loss.{k}", _to(k), NESTED)
        for k in ("dppo_mask_low", "dppo_mask_high", "adv_tau", "kl_tau")
    ],
    *[(f"monitors.wandb.{k}", _to(f"wandb.{k}"), NESTED) for k in ("project", "name", "entity")],
    ("monitors.wandb.offline", _wandb_offline, NESTED),
    ("run.name", _to("run_name"), NESTED),
    ("run.dir", _to("output_dir"), NESTED),
    ("orchestrator.oversampling_factor", _to("difficulty_filter.oversampling_factor"), NESTED),
    ("orchestrator.sampling", _to("sampling"), NESTED),
    ("orchestrator.buffer.online_difficulty_filtering", _to("difficulty_filter.enabled"), NESTED),
    ("orchestrator.buffer.type", _buffer_type, NESTED),
    ("orchestrator.buffer.oversampling_factor", _to("difficulty_filter.oversampling_factor"), NESTED),
    ("orchestrator.buffer.easy_threshold", _to("difficulty_filter.max_reward"), NESTED),
    ("orchestrator.buffer.hard_threshold", _to("difficulty_filter.min_reward"), NESTED),
    ("orchestrator.env", _to("env"), NESTED),
    *[
        (f"orchestrator.eval.{k}", _to(f"eval.{k}"), NESTED)
        for k in ("interval", "num_examples", "rollouts_per_example", "env")
    ],
    *[
        (f"{prefix}.{k}", _to(f"checkpointing.{v}"), NESTED)
        for prefix in ("trainer.ckpt", "ckpt")
        for k, v in (
            ("interval", "save_every_n_steps"),
            ("keep_last", "keep_n_checkpoints"),
            ("keep_interval", "keep_every_n_steps"),
            ("resume_step", "resume_step"),
        )
    ],
    ("inference.model.name", _to("inference.model"), NESTED),
    *[
        (f"inference.model.{k}", _to(f"inference.{k}"), NESTED)
        for k in ("enable_auto_tool_choice", "tool_call_parser", "reasoning_parser", "max_model_len", "dtype")
    ],
    ("inference.parallel.tp", _to("inference.tensor_parallel_size"), NESTED),
    ("inference.parallel.dp", _to("inference.data_parallel_size"), NESTED),
    ("inference_gpu_ids", _to("inference.gpu_ids"), NESTED),
    ("wandb.offline", _wandb_offline, ""),  # too weak a sign to call the file prime-rl style
    ("teacher_model", _to("distill.teacher_model"), ""),  # online distillation's teacher, as the docs name it
    # prime-rl flat / options
    ("model_name", _to("model"), FLAT),
    ("use_lora", _to("lora.enabled"), FLAT),
    ("lora_rank", _to("lora.r"), FLAT),
    ("lora_alpha", _to("lora.alpha"), FLAT),
    ("lora_dropout", _to("lora.dropout"), FLAT),
    ("lora_target_modules", _to("lora.target_modules"), FLAT),
    ("use_difficulty_filtering", _to("difficulty_filter.enabled"), FLAT),
    ("difficulty_threshold", _to("difficulty_filter.min_reward_variance"), FLAT),
    ("max_tokens", _to("sampling.max_tokens"), FLAT),
    ("temperature", _to("sampling.temperature"), FLAT),
    ("max_seq_len", _to("seq_len"), FLAT),
    *[
        (k, _to(f"inference.{k}"), FLAT)
        for k in ("tensor_parallel_size", "data_parallel_size", "gpu_memory_utilization", "max_model_len")
    ],
    # vf-rl
    ("inference.gpus", _gpus("inference"), VF),
    ("trainer.gpus", _gpus("trainer"), VF),
    *[(f"inference.args.{k}", _to(f"inference.{k}"), VF) for k in _VLLM_ARGS],
    *[(f"trainer.args.{k}", _to(v), VF) for k, v in _VF_ARGS.items()],
    ("trainer.args.beta", _kl_beta, VF),
    ("trainer.args.scale_rewards", _scale_rewards, VF),
    ("trainer.args.lr_scheduler_type", _scheduler, VF),
    ("trainer.args.bf16", _bf16, VF),
]

# prime-rl's keys (its current docs: "Useful Knobs", algorithms, renderers) that workbench reads but
# does not implement -> what workbench does instead. A key is matched with everything below it.
UNSUPPORTED: dict[str, str] = {
    "orchestrator.algo": "workbench's algorithm is `mode` and `loss`: rl uses group-relative advantages (reward minus "
    'the group mean, as prime-rl\'s grpo), on-policy distillation is mode = "distill"',
    "orchestrator.train.source": 'environments are [[env]] tables here: [[env]] id = "reverse-text"',
    "orchestrator.eval.source": 'held-out environments are [[eval.env]] tables here: [[eval.env]] id = "..."',
    "orchestrator.train.sampling.extra_body": "requests carry only the [sampling] settings",
    "orchestrator.token_batch_size": "a step is batch_size rollouts here, not a token budget",
    "orchestrator.renderer": "prompts are rendered by the model's chat template (trajectory_strategy for multi-turn)",
    "renderer": "prompts are rendered by the model's chat template",
    "orchestrator.strict_async_level": "generation runs at most max_async_level steps ahead, never exactly",
    "trainer.loss.import_path": "no custom loss functions: loss is grpo, dapo, cispo or dppo",
    "trainer.loss.kwargs": "no custom loss functions: loss is grpo, dapo, cispo or dppo",
    "trainer.loss.ipo_threshold": "no ipo loss: loss is grpo, dapo, cispo or dppo",
    "log": "workbench writes run.log and prints one line per step",
    "trainer.log": "workbench writes run.log and prints one line per step",
    "orchestrator.log": "workbench writes run.log; environment errors are recorded with each rollout",
    "monitors.prime": "no Prime Intellect platform here: metrics go to metrics.jsonl and W&B",
    "orchestrator.monitors.prime": "no Prime Intellect platform here: metrics go to metrics.jsonl and W&B",
    "monitors.wandb.group": "W&B runs are named by wandb.project, wandb.name and wandb.entity here",
    "monitors.wandb.tags": "W&B runs are named by wandb.project, wandb.name and wandb.entity here",
    "monitors.file": "metrics always go to <run>/metrics.jsonl",
    "clean": "a run folder is never wiped: give a new run_name (or --resume the old run)",
}
# Unsupported keys under these tables mark a file as prime-rl nested style.
_NESTED_ROOTS = ("orchestrator.", "trainer.", "monitors.")

# top-level keys accepted as aliases (offered as suggestions for top-level typos)
TOP_LEVEL_ALIASES = sorted({src for src, _, _ in RULES if "." not in src})


def _foreign_tables() -> dict[str, set[str]]:
    """Every table a rule reaches into that is not a canonical table -> the keys it accepts."""
    tables: dict[str, set[str]] = {}
    for src in [*(src for src, _, _ in RULES), *UNSUPPORTED]:
        parts = src.split(".")
        for depth in range(1, len(parts)):
            prefix = ".".join(parts[:depth])
            if prefix not in CANONICAL_TABLES:
                tables.setdefault(prefix, set()).add(parts[depth])
    return tables


FOREIGN_TABLES = _foreign_tables()


def translate(raw: dict[str, Any]) -> Translation:
    """Translate `raw` (as parsed from TOML) onto the canonical schema. Raises TranslationError."""
    _reject_other_tools(raw)
    raw = copy.deepcopy(raw)
    b = _Builder()
    _hoist_misplaced(raw, b)
    _take_unsupported(raw, b)
    lora_tables = [
        p for p in ("trainer.model.lora", "trainer.model.experimental.lora") if isinstance(_get(raw, p), dict)
    ]
    for src, handle, style in RULES:
        found, value = _pop(raw, src)
        if found:
            handle(value, src, b)
            if style:
                b.styles.append(style)
    if lora_tables:
        b.put("lora.enabled", True, lora_tables[0])
    if isinstance(raw.get("env"), dict):  # a single [env] table (flat and vf-rl styles)
        raw["env"] = [raw["env"]]
        b.moves.append(("env", "env.0"))
    if isinstance(b.out.get("env"), dict):  # a single [orchestrator.env] table
        b.out["env"] = [b.out["env"]]
    for table in (raw.get("eval"), b.out.get("eval")):  # a single [eval.env] / [orchestrator.eval.env] table
        if isinstance(table, dict) and isinstance(table.get("env"), dict):
            table["env"] = [table["env"]]
    _place_gpus(b)
    unknown = _leftovers(raw)
    styles = list(dict.fromkeys(b.styles))
    style = "hosted" if not styles else styles[0] if len(styles) == 1 else f"mixed ({' + '.join(styles)})"
    if unknown is not None:  # the caller reports it; the rest would only add confusing errors
        return Translation(b.out, style, b.notes, b.moves, unknown, b.unsupported)
    _merge(b.out, raw, b.moves, [])
    _prime_rl_defaults(b, styles, had_lora_table=bool(lora_tables))
    if styles:
        b.notes.insert(
            0, f"written in the {style} style: {len(b.moves)} keys translated onto the workbench schema"
        )
    return Translation(b.out, style, b.notes, b.moves, unknown, b.unsupported)


def _take_unsupported(raw: dict[str, Any], b: _Builder) -> None:
    """Take every UNSUPPORTED key out of `raw`, in the file's order, naming each value it set
    (each key of a table, each table of an array of tables) in the notes."""
    for prefix in _unsupported_keys(raw, ""):
        _, value = _pop(raw, prefix)
        if prefix.startswith(_NESTED_ROOTS):
            b.styles.append(NESTED)
        for index, (src, leaf) in enumerate(_leaf_values(prefix, value)):
            b.not_supported(src, leaf, None if index else UNSUPPORTED[prefix])


def _unsupported_keys(table: dict[str, Any], path: str) -> list[str]:
    """The UNSUPPORTED keys set in `table` (at `path`), in order."""
    found = []
    for key, value in table.items():
        dotted = f"{path}{key}"
        if dotted in UNSUPPORTED:
            found.append(dotted)
        elif isinstance(value, dict):
            found += _unsupported_keys(value, dotted + ".")
    return found


def _leaf_values(prefix: str, value: Any) -> list[tuple[str, Any]]:
    """(dotted key, value) of every value under `prefix`; an array of tables by index
    (`orchestrator.train.source.0.name`)."""
    if isinstance(value, dict) and value:
        return [pair for key, item in value.items() for pair in _leaf_values(f"{prefix}.{key}", item)]
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return [pair for index, item in enumerate(value) for pair in _leaf_values(f"{prefix}.{index}", item)]
    return [(prefix, value)]


def _shown_value(value: Any) -> str:
    """A value as TOML writes it (strings quoted), short enough for one note."""
    text = (
        json.dumps(value)
        if isinstance(value, (str, list, dict))
        else str(value).lower()
        if isinstance(value, bool)
        else str(value)
    )
    return text if len(text) <= 60 else text[:57] + "..."


def _reject_other_tools(raw: dict[str, Any]) -> None:
    gepa = [k for k in GEPA_KEYS if k in raw]
    if len(gepa) >= 2 or "reflection_model" in raw:
        raise TranslationError(
            None, f"looks like a GEPA config ({', '.join(gepa)}); use `workbench gepa run` with it"
        )
    if "env_id" in raw and "env" not in raw:
        raise TranslationError(
            "env_id",
            "looks like an eval config (env_id); use `workbench eval run` with it, "
            'or write [[env]] id = "..." to train',
        )


def _hoist_misplaced(raw: dict[str, Any], b: _Builder) -> None:
    """A top-level key written below a table header lands in that table (TOML reads
    `[wandb] ... env_file = [...]` as wandb.env_file). Documented configs do this; when the key
    means nothing in that table but is a top-level key, read it as the top-level key."""
    from pydantic import BaseModel

    from workbench.train.schema import TrainConfig

    top_level = (set(TrainConfig.model_fields) - CANONICAL_TABLES - {"env"}) | set(TOP_LEVEL_ALIASES)
    for table in sorted(CANONICAL_TABLES):
        body = raw.get(table)
        if not isinstance(body, dict):
            continue
        section = TrainConfig.model_fields[table].annotation
        assert isinstance(section, type) and issubclass(section, BaseModel), table  # a table is a model
        valid = set(section.model_fields)
        misplaced = [k for k in body if k not in valid and k in top_level and k not in raw]
        for key in misplaced:
            raw[key] = body.pop(key)
            b.moves.append((f"{table}.{key}", key))
        if misplaced:
            names, one = ", ".join(misplaced), len(misplaced) == 1
            b.notes.append(
                f"{names} {'follows' if one else 'follow'} the [{table}] header, so TOML puts "
                f"{'it' if one else 'them'} in [{table}]; read as top-level (move "
                f"{'it' if one else 'them'} above the first table to silence this)"
            )


def _prime_rl_defaults(b: _Builder, styles: list[str], had_lora_table: bool) -> None:
    """Where prime-rl's own defaults differ from ours, a prime-rl config gets prime-rl's."""
    if NESTED in styles and not had_lora_table and "lora" not in b.out:
        b.out.setdefault("lora", {})["enabled"] = False
        b.notes.append("no [trainer.model.lora] table: full fine-tuning, as prime-rl does")
    if {NESTED, FLAT} & set(styles) and not b.out.get("env") and b.out.get("mode", "rl") == "rl":
        b.out["env"] = [{"id": PRIME_RL_DEFAULT_ENV}]
        b.notes.append(f"no environment given: training on '{PRIME_RL_DEFAULT_ENV}', prime-rl's default")


def _place_gpus(b: _Builder) -> None:
    """vf-rl gives GPU counts: inference takes the first ones, the trainer the next."""
    if not b.gpus:
        return
    n_inf, n_train = b.gpus.get("inference", 0), b.gpus.get("trainer", 0)
    if n_inf:
        b.out.setdefault("inference", {})["gpu_ids"] = list(range(n_inf))
    if n_train:
        b.out["trainer_gpu_ids"] = list(range(n_inf, n_inf + n_train))
    b.out["num_gpus"] = n_inf + n_train


def _get(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _pop(data: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    *parents, leaf = dotted.split(".")
    node: Any = data
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and leaf in node:
        return True, node.pop(leaf)
    return False, None


def _leftovers(raw: dict[str, Any]) -> tuple[str, str | None] | None:
    """Drop foreign tables emptied by the rules; the first key left in one is unknown."""
    unknown: tuple[str, str | None] | None = None
    for table in sorted(FOREIGN_TABLES, key=lambda t: -t.count(".")):
        *parents, leaf = table.split(".")
        parent = _get(raw, ".".join(parents)) if parents else raw
        if not isinstance(parent, dict) or not isinstance(parent.get(leaf), dict):
            continue  # absent, or a canonical value (model = "x") that happens to share the name
        if not parent[leaf]:
            del parent[leaf]
        elif unknown is None:  # deepest first: the most specific table names the key
            key = next(iter(parent[leaf]))
            hint = difflib.get_close_matches(key, sorted(FOREIGN_TABLES[table]), n=1, cutoff=0.6)
            unknown = (f"{table}.{key}", f"{table}.{hint[0]}" if hint else None)
    return unknown


def _merge(out: dict[str, Any], rest: dict[str, Any], moves: list[tuple[str, str]], path: list[str]) -> None:
    """Keys already in canonical form join the translated ones; setting one key twice is an error."""
    for key, value in rest.items():
        here = [*path, key]
        if key not in out:
            out[key] = value
        elif isinstance(out[key], dict) and isinstance(value, dict):
            _merge(out[key], value, moves, here)
        else:
            dotted = ".".join(here)
            raise TranslationError(dotted, f"'{dotted}' is also set by '{origin(moves, dotted)}'; keep one")


def origin(moves: list[tuple[str, str]], canonical: str) -> str:
    """The source key a canonical key came from (the longest translated prefix), else itself."""
    parts = canonical.split(".")
    best: tuple[int, str] = (0, canonical)
    for src, dst in moves:
        dst_parts = dst.split(".")
        if parts[: len(dst_parts)] == dst_parts and len(dst_parts) > best[0]:
            best = (len(dst_parts), ".".join([src, *parts[len(dst_parts) :]]))
    return best[1]
