"""Turn scored rollouts into training samples and padded micro-batches.

A sample is one rollout's token sequence (prompt + completion), the mask of tokens the policy
sampled, the sampler's logprobs of those tokens, and the rollout's advantage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.train.schema import TrainConfig
from workbench.types import Group, Rollout


@dataclass
class Sample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 on completion tokens the policy sampled
    sampler_logprobs: list[float]  # aligned with input_ids (0 where loss_mask is 0)
    advantage: float
    policy_version: int = 0


def rollout_to_sample(rollout: Rollout, advantage: float, *, seq_len: int | None,
                      zero_truncated: bool, mask_truncated: bool) -> Sample | None:
    tokens = rollout.tokens
    if tokens is None or not tokens.completion_ids:
        return None
    mask = tokens.completion_mask or [1] * len(tokens.completion_ids)
    if rollout.is_truncated and mask_truncated:
        mask = [0] * len(mask)
    if rollout.is_truncated and zero_truncated:
        advantage = 0.0
    input_ids = tokens.prompt_ids + tokens.completion_ids
    loss_mask = [0] * len(tokens.prompt_ids) + list(mask)
    logprobs = [0.0] * len(tokens.prompt_ids) + list(tokens.completion_logprobs)
    if seq_len is not None and len(input_ids) > seq_len:
        input_ids, loss_mask, logprobs = input_ids[:seq_len], loss_mask[:seq_len], logprobs[:seq_len]
    return Sample(input_ids, loss_mask, logprobs, advantage, rollout.policy_version)


def groups_to_samples(groups: Sequence[Group], config: TrainConfig) -> list[Sample]:
    samples = []
    for group in groups:
        advantages = group.advantages(scale_by_std=config.scale_advantages_by_std)
        for rollout, advantage in zip(group.rollouts, advantages, strict=True):
            sample = rollout_to_sample(rollout, advantage, seq_len=config.seq_len,
                                       zero_truncated=config.zero_truncated_completions,
                                       mask_truncated=config.mask_truncated_completions)
            if sample is not None:
                samples.append(sample)
    return samples


def collate(samples: Sequence[Sample], pad_id: int) -> dict[str, Any]:
    """Right-padded tensors for one micro-batch."""
    import torch

    width = max(len(s.input_ids) for s in samples)

    def pad(values: list, fill: Any) -> list:
        return values + [fill] * (width - len(values))

    return {
        "input_ids": torch.tensor([pad(s.input_ids, pad_id) for s in samples]),
        "attention_mask": torch.tensor([pad([1] * len(s.input_ids), 0) for s in samples]),
        "loss_mask": torch.tensor([pad(s.loss_mask, 0) for s in samples], dtype=torch.float32),
        "sampler_logprobs": torch.tensor([pad(s.sampler_logprobs, 0.0) for s in samples], dtype=torch.float32),
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32),
    }


def micro_batches(samples: Sequence[Sample], size: int) -> list[list[Sample]]:
    return [list(samples[i:i + size]) for i in range(0, len(samples), size)]
