"""The teacher of online distillation (`mode = "distill"`): a frozen model that scores every token
the student sampled.

    workbench train configs/rl/reverse-text.toml --set mode=distill --set distill.teacher_model=outputs/runs/<rl run>

The student samples rollouts on the environments exactly as in RL. For each sampled token x the
teacher gives log p_teacher(x); the student's sampler gave log p_student(x). Their difference is
a one-sample estimate of the per-token reverse KL, KL(student || teacher), on the student's own
distribution, so each token's advantage becomes

    kl_weight * (log p_teacher(x) - log p_student(x))  +  reward_weight * (reward - group mean)

and the run's usual clipped policy-gradient loss (grpo / dapo / cispo) minimizes the reverse KL,
optionally mixed with the RL objective (on-policy distillation: Agarwal et al. 2024, "GKD";
Thinking Machines 2025). Simplifications: a local teacher runs in the trainer process (its
weights sit beside the student's) and scores at the sampling temperature; either kind must share
the student's tokenizer. A teacher behind a server (`distill.teacher_base_url`, e.g. vLLM serving a bigger
model) is asked for prompt logprobs (`/v1/completions` with `echo`), at temperature 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.errors import UserError
from workbench.train.loss import token_logprobs
from workbench.train.samples import Sample, collate, micro_batches
from workbench.train.schema import DistillConfig

SCORE_BATCH = 16  # samples per teacher forward pass (no gradients: memory is the logits only)
SERVER_CONCURRENCY = 32  # scoring requests in flight to a teacher server
SERVER_TRIES = 4  # a transient server error (restart, 503) is retried with backoff 1, 2, 4 s


@dataclass
class TeacherStats:
    """Sums over the sampled tokens scored (summed across ranks before they become metrics)."""

    reverse_kl_sum: float  # of log p_student - log p_teacher
    teacher_logprob_sum: float
    tokens: int

    def metrics(self) -> dict[str, float]:
        n = max(self.tokens, 1)
        return {
            "distill/reverse_kl": self.reverse_kl_sum / n,
            "distill/teacher_logprob": self.teacher_logprob_sum / n,
        }


class Teacher:
    """Scores sampled tokens; `ModelTeacher` runs a model in this process, `EndpointTeacher` asks
    a server (vLLM's prompt logprobs)."""

    def __init__(self, config: DistillConfig) -> None:
        self.config = config

    async def logprobs(self, samples: list[Sample], temperature: float) -> list[list[float]]:
        """log p_teacher of each token of each sample given the tokens before it."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release what the teacher holds (a server connection)."""

    async def score(self, samples: list[Sample], temperature: float) -> TeacherStats:
        """Set each sample's per-token advantages from the teacher, and scale its RL advantage by
        reward_weight. `temperature`: the sampling temperature (both distributions at it)."""
        kl_sum = teacher_sum = 0.0
        tokens = 0
        for sample, scores in zip(samples, await self.logprobs(samples, temperature), strict=True):
            advantages = []
            for mask, student_lp, teacher_lp in zip(
                sample.loss_mask, sample.sampler_logprobs, scores, strict=True
            ):
                if not mask:
                    advantages.append(0.0)
                    continue
                kl_sum, teacher_sum, tokens = (
                    kl_sum + student_lp - teacher_lp,
                    teacher_sum + teacher_lp,
                    tokens + 1,
                )
                advantages.append(self.config.kl_weight * (teacher_lp - student_lp))
            sample.token_advantages = advantages
            sample.advantage *= self.config.reward_weight
        return TeacherStats(kl_sum, teacher_sum, tokens)


def load_teacher(config: DistillConfig, student_tokenizer: Any, device: str = "cpu") -> Teacher:
    """The teacher `config` names: a server when teacher_base_url is set, else a model here."""
    if config.teacher_base_url:
        return EndpointTeacher(config)
    return ModelTeacher.load(config, student_tokenizer, device)


class ModelTeacher(Teacher):
    def __init__(self, model: Any, pad_id: int, config: DistillConfig, device: str = "cpu") -> None:
        super().__init__(config)
        self.model = model
        self.pad_id = pad_id
        self.device = device

    @classmethod
    def load(cls, config: DistillConfig, student_tokenizer: Any, device: str = "cpu") -> ModelTeacher:
        """The teacher named by `config.teacher_model`, frozen, on `device`. UserError when it
        cannot be loaded or does not share the student's vocabulary."""
        from workbench.inference.resolve import resolve_model_path
        from workbench.models.loading import load_plain_model

        assert config.teacher_model is not None
        try:  # a checkpoint is its whole chain of adapters merged (RL on SFT on a base model)
            model, tokenizer = load_plain_model(resolve_model_path(config.teacher_model))
        except UserError as exc:
            raise UserError(f"distill.teacher_model '{config.teacher_model}': {exc}") from exc
        if tokenizer.get_vocab() != student_tokenizer.get_vocab():
            raise UserError(
                f"distill.teacher_model '{config.teacher_model}' has another tokenizer than the student: "
                "token logprobs can only be compared over the same vocabulary"
            )
        model.eval().requires_grad_(False)
        if device != "cpu":
            model.to(device)
        return cls(model, student_tokenizer.pad_token_id, config, device)

    async def logprobs(self, samples: list[Sample], temperature: float) -> list[list[float]]:
        import torch

        scores: list[list[float]] = []
        for chunk in micro_batches(samples, SCORE_BATCH):
            batch = collate(chunk, self.pad_id)
            if self.device != "cpu":
                batch = {key: value.to(self.device) for key, value in batch.items()}
            with torch.no_grad():
                teacher, _ = token_logprobs(self.model, batch, temperature)
            scores += [teacher[row, : len(sample.input_ids)].tolist() for row, sample in enumerate(chunk)]
        return scores


class EndpointTeacher(Teacher):
    """A teacher behind an OpenAI-compatible server that scores prompts (vLLM, `workbench serve`):
    each sample's token ids go to `/v1/completions` with `echo`. Servers give logprobs at
    temperature 1, so the student should sample at temperature 1 (the RL default)."""

    def __init__(self, config: DistillConfig) -> None:
        from workbench.inference.openai_client import OpenAIClient
        from workbench.inference.resolve import api_key

        super().__init__(config)
        assert config.teacher_base_url is not None and config.teacher_model is not None
        self.client = OpenAIClient(
            config.teacher_base_url, config.teacher_model, api_key=api_key(config.teacher_api_key_var)
        )

    async def logprobs(self, samples: list[Sample], temperature: float) -> list[list[float]]:
        import asyncio

        from workbench.errors import InferenceError

        limit = asyncio.Semaphore(SERVER_CONCURRENCY)

        async def one(sample: Sample) -> list[float]:
            async with limit:
                for attempt in range(SERVER_TRIES):
                    try:
                        return await self.client.prompt_logprobs(sample.input_ids)
                    except InferenceError as exc:
                        if not exc.transient or attempt == SERVER_TRIES - 1:
                            raise UserError(
                                f"the distillation teacher at {self.config.teacher_base_url} failed: {exc}"
                            ) from exc
                        await asyncio.sleep(2**attempt)
            raise AssertionError("unreachable")

        return list(await asyncio.gather(*(one(s) for s in samples)))

    async def close(self) -> None:
        await self.client.close()
