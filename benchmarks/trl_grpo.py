"""The TRL side of `benchmarks/train_step.py`: TRL's GRPOTrainer on the same RL step as
`configs/rl/reverse-text.toml`, timed per optimizer step.

    pip install -e ".[bench]"          # TRL: a benchmark dependency, never a runtime one
    python benchmarks/trl_grpo.py [--mode lora|full] [--steps 5]

Same model folder (outputs/models/tiny, float32), same prompts (Workbench's reverse-text
environment: its train split, system prompt and chat template), same reward (the environment's
own rubric, called on TRL's completions), same step: batch_size completions = batch_size /
rollouts_per_example prompts x rollouts_per_example generations, one optimizer step per batch
(num_iterations = 1, micro-batches of micro_batch_size with gradient accumulation), max
completion tokens, temperature 1.0, learning rate and its schedule (Workbench's own
`lr_factor`), gradient clipping 1.0, AdamW betas and weight decay, LoRA
r/alpha/target modules (or every weight with --mode full), no KL term and no reference model
(beta = 0), token-level loss normalized over the whole batch (loss_type 'dapo', Workbench's
grpo), advantages not scaled by the group std (scale_rewards 'none'), clip 0.2. Generation
is TRL's transformers path (`model.generate` on the whole batch on the CPU, no vLLM); no
gradient checkpointing; bf16 only with `--set optimization_dtype='bfloat16'` (the model loaded
in bf16, LoRA weights in float32 as peft keeps them, and GRPOConfig(bf16=True)), float32 otherwise. The optimizer is
TRL's default AdamW (torch's fused kernel; Workbench: torch.optim.AdamW, the same update).

A step's time runs from the trainer's on_step_begin to its on_step_end (logging and saving
come after, as Workbench's time/step leaves out its own logging). Split: generation (TRL's
`_generate_single_turn`: `model.generate` and cutting at EOS), forward/backward (the
micro-batches' training_step less the generation-and-scoring they trigger), optimizer
(clipping, AdamW, scheduler, zero_grad), everything else (tokenizing prompts, decoding,
rewards, advantages, the trainer's bookkeeping).

With --paced the process prints a `@@bench {...}` line when it is ready and after every step,
and starts each step only when a line arrives on stdin: `train_step.py` alternates it with
Workbench's step by step, so both see the same machine load. Without it, it runs and prints
its own summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

REPO = Path(__file__).resolve().parents[1]
PROTOCOL = "@@bench "
INSTALL_HINT = 'pip install -e ".[bench]"   (TRL, an optional benchmark dependency)'


def trl_version() -> str | None:
    """TRL's version when it is installed (without importing it), else None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return None


def emit(event: str, **data: Any) -> None:
    print(PROTOCOL + json.dumps({"event": event, **data}), flush=True)


def wait_for_go() -> None:
    if not sys.stdin.readline():  # the driver went away
        raise SystemExit(1)


def build_dataset(env: Any, limit: int | None = None) -> Any:
    """The environment's train split as TRL's conversational prompts (Workbench's own
    `format_prompt`: system prompt, few-shot turns, question) with the answer column."""
    from datasets import Dataset

    rows = env.rows("train")
    rows = rows[:limit] if limit else rows
    return Dataset.from_list(
        [{"prompt": env.format_prompt(row), "answer": str(row["answer"])} for row in rows]
    )


def rubric_reward(env: Any):
    """A TRL reward function that scores with the environment's rubric, exactly as Workbench's
    `Environment.score_group` does (the weighted reward: here LCS ratio of the parsed
    <reversed_text> to the true reversal, weight 1; the format metric has weight 0)."""
    from workbench.envs.messages import as_messages
    from workbench.envs.rubric import ScoringInput

    def reverse_text_rubric(prompts: list, completions: list, answer: list, **_: Any) -> list[float]:
        items = [
            ScoringInput(
                prompt=as_messages(p), completion=as_messages(c), answer=a, state={}, task=env.env_id
            )
            for p, c, a in zip(prompts, completions, answer, strict=True)
        ]
        return [score.reward for score in asyncio.run(env.rubric.score_group(items))]

    return reverse_text_rubric


def run(args: argparse.Namespace) -> list[dict[str, float]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from workbench.envs import load_environment
    from workbench.train.config import load_train_config
    from workbench.train.optimize import lr_factor

    total_steps = args.steps + 1  # the first is the warm-up
    # The Workbench run's settings, read from the same config (with the same overrides).
    config, _ = load_train_config(
        REPO / "configs" / "rl" / "reverse-text.toml",
        [
            f"batch_size={args.batch_size}",
            f"micro_batch_size={min(64, args.batch_size)}",  # as train_step.py sets it
            f"max_steps={total_steps}",
            *args.set,
        ],
    )
    env_spec = config.env[0]
    env = load_environment(env_spec.id, **env_spec.args)
    sampling = config.sampling
    micro = min(config.micro_batch_size, config.batch_size)
    if config.batch_size % micro:
        raise SystemExit(f"batch_size {config.batch_size} is not a multiple of micro_batch_size {micro}")

    model_dir = Path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # Workbench's optimization_dtype = 'bfloat16' (a bf16 base under float32 LoRA weights): TRL's
    # counterpart is the model loaded in bf16 (peft keeps its adapters in float32) and bf16=True.
    bf16 = config.optimization_dtype == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if bf16 else torch.float32)
    peft_config = None
    if args.mode == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=config.lora.r,
            lora_alpha=config.lora.alpha,
            lora_dropout=config.lora.dropout,
            target_modules=list(config.lora.target_modules),
            task_type="CAUSAL_LM",
        )

    class Trainer(GRPOTrainer):
        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            """Workbench's learning-rate schedule, step for step (its warm-up starts at
            learning_rate / warmup_steps, transformers' at 0)."""
            if self.lr_scheduler is None:
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                    optimizer or self.optimizer, lambda step: lr_factor(step, config)
                )
            return self.lr_scheduler

    with tempfile.TemporaryDirectory() as tmp:
        grpo = GRPOConfig(
            output_dir=str(Path(tmp) / "trl"),
            use_cpu=True,
            bf16=bf16,
            fp16=False,
            gradient_checkpointing=False,
            max_steps=total_steps,
            seed=config.seed,
            data_seed=config.seed,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=config.batch_size // micro,
            num_generations=config.rollouts_per_example,
            num_iterations=1,
            max_completion_length=sampling.max_tokens or 128,
            temperature=1.0 if sampling.temperature is None else sampling.temperature,
            top_p=sampling.top_p or 1.0,
            top_k=0,
            learning_rate=config.learning_rate,
            weight_decay=config.weight_decay,
            adam_beta1=config.betas[0],
            adam_beta2=config.betas[1],
            max_grad_norm=config.max_grad_norm,
            beta=0.0,
            epsilon=config.clip_low,
            loss_type="dapo",
            scale_rewards="group" if config.scale_advantages_by_std else "none",
            mask_truncated_completions=config.mask_truncated_completions,
            use_vllm=False,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        timer = StepTimer(paced=args.paced)
        trainer = Trainer(
            model=model,
            reward_funcs=rubric_reward(env),
            args=grpo,
            train_dataset=build_dataset(env),
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[timer],
        )
        for quiet in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(quiet)
        timer.attach(trainer)
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        if args.paced:
            emit(
                "ready",
                system="trl",
                mode=args.mode,
                threads=torch.get_num_threads(),
                trainable=trainable,
                version=trl_version(),
                batch=config.batch_size,
            )
        trainer.train()
    if args.paced:
        emit("exit")
    return timer.steps


class StepTimer(TrainerCallback):
    """Times each optimizer step and its parts, through callbacks and wrapped trainer methods."""

    def __init__(self, paced: bool) -> None:
        self.paced = paced
        self.steps: list[dict[str, float]] = []
        self.trainer: Any = None
        self._reset()

    def _reset(self) -> None:
        self.t0 = 0.0
        self.generate_s = 0.0  # model.generate
        self.score_s = 0.0  # generation and scoring: TRL's _generate_and_score_completions
        self.train_s = 0.0  # the micro-batches' training_step calls (they trigger the generation)
        self.last_train_end = 0.0

    def attach(self, trainer: Any) -> None:
        self.trainer = trainer
        self._wrap(trainer, "_generate_single_turn", "generate_s")
        self._wrap(trainer, "_generate_and_score_completions", "score_s")
        self._wrap(trainer, "training_step", "train_s", end_attr="last_train_end")

    def _wrap(self, trainer: Any, name: str, attr: str, end_attr: str | None = None) -> None:
        original = getattr(trainer, name, None)
        if original is None:
            return

        def timed(*a: Any, **k: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                ended = time.perf_counter()
                setattr(self, attr, getattr(self, attr) + ended - started)
                if end_attr:
                    setattr(self, end_attr, ended)

        setattr(trainer, name, timed)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.paced:
            wait_for_go()
        self._reset()
        scheduler = getattr(self.trainer, "lr_scheduler", None)
        self.lr = float(scheduler.get_last_lr()[0]) if scheduler is not None else float("nan")
        self.t0 = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ended = time.perf_counter()
        step_s = ended - self.t0
        forward_backward = self.train_s - self.score_s
        optimizer = ended - self.last_train_end
        metrics = self.trainer._metrics.get("train", {}) if self.trainer is not None else {}

        def last(key: str) -> float:
            values = metrics.get(key) or [float("nan")]
            return float(values[-1])

        record = {
            "step": state.global_step,
            "time/step": step_s,
            "generation": self.generate_s,
            "forward/backward": forward_backward,
            "optimizer": optimizer,
            "other": step_s - self.generate_s - forward_backward - optimizer,
            "mean_length": last("completions/mean_length"),
            "reward": last("reward"),
            "lr": self.lr,
        }
        self.steps.append(record)
        if self.paced:
            emit("step", **record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["lora", "full"], default="lora")
    parser.add_argument("--steps", type=int, default=5, help="measured steps (after one warm-up step)")
    parser.add_argument("--batch-size", type=int, default=128, help="completions per optimizer step")
    parser.add_argument("--model", default=str(REPO / "outputs" / "models" / "tiny"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    parser.add_argument(
        "--paced", action="store_true", help="driven by train_step.py: a stdin line starts each step"
    )
    args = parser.parse_args()
    if trl_version() is None:
        message = f"TRL is not installed: {INSTALL_HINT}"
        if args.paced:
            emit("missing", message=message)
        raise SystemExit(message)
    os.environ.setdefault("WORKBENCH_WORKSPACE", str(REPO))
    steps = run(args)[1:]  # drop the warm-up step
    if not args.paced and steps:
        step_s = statistics.fmean(s["time/step"] for s in steps)
        print(
            f"TRL {trl_version()} GRPOTrainer ({args.mode}): {step_s:.2f} s/step, "
            f"{args.batch_size / step_s:.1f} samples/s ({len(steps)} steps)"
        )
        for key in ("generation", "forward/backward", "optimizer", "other"):
            part = statistics.fmean(s[key] for s in steps)
            print(f"  {key:<17} {part:6.3f} s  {100 * part / step_s:5.1f}%")


if __name__ == "__main__":
    main()
