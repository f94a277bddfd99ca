"""The teacher of online distillation (`mode = "distill"`): a frozen model that scores every token
the student sampled.

    workbench train configs/rl/reverse-text.toml --set mode='"distill"' \
        --set distill.teacher_model='"outputs/runs/<rl run>"'

The student samples rollouts on the environments exactly as in RL. For each sampled token x the
teacher gives log p_teacher(x); the student's sampler gave log p_student(x). Their difference is
a one-sample estimate of the per-token reverse KL, KL(student || teacher), on the student's own
distribution, so each token's advantage becomes

    kl_weight * (log p_teacher(x) - log p_student(x))  +  reward_weight * (reward - group mean)

and the run's usual clipped policy-gradient loss (grpo / dapo / cispo) minimizes the reverse KL,
optionally mixed with the RL objective (on-policy distillation: Agarwal et al. 2024, "GKD";
Thinking Machines 2025). Simplifications: the teacher runs in the trainer process (its weights
sit beside the student's), scores at the sampling temperature, and must share the student's
tokenizer; an endpoint teacher (prompt logprobs over HTTP) is not supported yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.train.loss import token_logprobs
from workbench.train.samples import Sample, collate, micro_batches
from workbench.train.schema import DistillConfig

SCORE_BATCH = 16  # samples per teacher forward pass (no gradients: memory is the logits only)


@dataclass
class TeacherStats:
    """Sums over the sampled tokens scored (summed across ranks before they become metrics)."""

    reverse_kl_sum: float  # of log p_student - log p_teacher
    teacher_logprob_sum: float
    tokens: int

    def metrics(self) -> dict[str, float]:
        n = max(self.tokens, 1)
        return {"distill/reverse_kl": self.reverse_kl_sum / n, "distill/teacher_logprob": self.teacher_logprob_sum / n}


class Teacher:
    def __init__(self, model: Any, pad_id: int, config: DistillConfig, device: str = "cpu") -> None:
        self.model = model
        self.pad_id = pad_id
        self.config = config
        self.device = device

    @classmethod
    def load(cls, config: DistillConfig, student_tokenizer: Any, device: str = "cpu") -> Teacher:
        """The teacher named by `config.teacher_model`, frozen, on `device`. UserError when it
        cannot be loaded or does not share the student's vocabulary."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from workbench.inference.resolve import resolve_model_path
        from workbench.models.hub import require_hub_model
        from workbench.models.loading import adapter_base, load_merged_adapter

        assert config.teacher_model is not None
        source = resolve_model_path(config.teacher_model)
        if isinstance(source, str):
            require_hub_model(source)
        try:
            if isinstance(source, Path) and adapter_base(source) is not None:
                model, tokenizer = load_merged_adapter(source)
            else:
                model = AutoModelForCausalLM.from_pretrained(str(source))
                tokenizer = AutoTokenizer.from_pretrained(str(source))
        except OSError as exc:
            raise UserError(f"could not load distill.teacher_model '{config.teacher_model}': {str(exc).splitlines()[0]}") from exc
        if tokenizer.get_vocab() != student_tokenizer.get_vocab():
            raise UserError(f"distill.teacher_model '{config.teacher_model}' has another tokenizer than the student: "
                            "token logprobs can only be compared over the same vocabulary")
        model.eval().requires_grad_(False)
        if device != "cpu":
            model.to(device)
        return cls(model, student_tokenizer.pad_token_id, config, device)

    def score(self, samples: list[Sample], temperature: float) -> TeacherStats:
        """Set each sample's per-token advantages from the teacher, and scale its RL advantage by
        reward_weight. `temperature`: the sampling temperature (both distributions at it)."""
        import torch

        kl_terms: list[float] = []
        teacher_terms: list[float] = []
        for chunk in micro_batches(samples, SCORE_BATCH):
            batch = collate(chunk, self.pad_id)
            if self.device != "cpu":
                batch = {key: value.to(self.device) for key, value in batch.items()}
            with torch.no_grad():
                teacher, _ = token_logprobs(self.model, batch, temperature)
            for row, sample in enumerate(chunk):
                scores = teacher[row, :len(sample.input_ids)].tolist()
                advantages = []
                for mask, student_lp, teacher_lp in zip(sample.loss_mask, sample.sampler_logprobs, scores, strict=True):
                    if not mask:
                        advantages.append(0.0)
                        continue
                    kl_terms.append(student_lp - teacher_lp)
                    teacher_terms.append(teacher_lp)
                    advantages.append(self.config.kl_weight * (teacher_lp - student_lp))
                sample.token_advantages = advantages
                sample.advantage *= self.config.reward_weight
        return TeacherStats(sum(kl_terms), sum(teacher_terms), len(kl_terms))
