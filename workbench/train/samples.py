"""Turn scored rollouts into training samples and padded micro-batches.

A sample is a token sequence (prompt + completion), the mask of tokens the policy sampled, the
sampler's logprobs of those tokens, and the rollout's advantage. How a multi-turn rollout
becomes samples is `trajectory_strategy` (prime-rl's names):
- "interleaved": consecutive turns whose prompt extends the previous turn's prompt + sampled ids
  exactly are one sample (the environment's tokens between them masked out). With tokens in
  (`chat_tokens`) that is every turn: one sample per rollout. Where the prefix breaks (a server
  that re-rendered the conversation differently), a new sample starts, so a token is never
  trained on at a place the sampler did not see it.
- "branching": one sample per model turn, each with the prompt the template really rendered
  (thinking models' templates strip earlier turns' thinking, so the prefix breaks anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from workbench.train.schema import TrainConfig
from workbench.types import Group, Rollout, TokenData

Strategy = Literal["interleaved", "branching"]


@dataclass
class Sample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 on completion tokens the policy sampled
    sampler_logprobs: list[float]  # aligned with input_ids (0 where loss_mask is 0)
    advantage: float
    policy_version: int = 0
    # Per-token advantages added to `advantage` (aligned with input_ids): online distillation's
    # teacher signal (workbench.train.teacher). None: the rollout's advantage alone.
    token_advantages: list[float] | None = None

    @property
    def teaches(self) -> bool:
        """Whether any token of it has a nonzero advantage (else its gradient is zero)."""
        return self.advantage != 0 or any(self.token_advantages or ())


def rollout_sequences(rollout: Rollout, strategy: Strategy) -> list[TokenData]:
    """The rollout's token sequences under `strategy` (see the module doc)."""
    turns = rollout.turn_tokens
    if not turns:  # single-turn, or a rollout that carries only its assembled sequence
        return [rollout.tokens] if rollout.tokens is not None else []
    if strategy == "branching":
        return [TokenData(t.prompt_ids, t.completion_ids, t.completion_logprobs) for t in turns]
    sequences: list[TokenData] = []
    for turn in turns:
        current = sequences[-1] if sequences else None
        full = None if current is None else current.prompt_ids + current.completion_ids
        if current is None or full is None or turn.prompt_ids[: len(full)] != full:
            sequences.append(
                TokenData(
                    list(turn.prompt_ids),
                    list(turn.completion_ids),
                    list(turn.completion_logprobs),
                    [1] * len(turn.completion_ids),
                )
            )
            continue
        between = turn.prompt_ids[len(full) :]  # what the environment (and template) wrote
        assert current.completion_mask is not None
        current.completion_ids += between + turn.completion_ids
        current.completion_logprobs += [0.0] * len(between) + list(turn.completion_logprobs)
        current.completion_mask += [0] * len(between) + [1] * len(turn.completion_ids)
    return sequences


def rollout_to_samples(
    rollout: Rollout,
    advantage: float,
    *,
    strategy: Strategy,
    seq_len: int | None,
    zero_truncated: bool,
    mask_truncated: bool,
) -> list[Sample]:
    if rollout.is_truncated and zero_truncated:
        advantage = 0.0
    samples = []
    for tokens in rollout_sequences(rollout, strategy):
        if not tokens.completion_ids:
            continue
        mask = tokens.completion_mask or [1] * len(tokens.completion_ids)
        if rollout.is_truncated and mask_truncated:
            mask = [0] * len(mask)
        input_ids = tokens.prompt_ids + tokens.completion_ids
        loss_mask = [0] * len(tokens.prompt_ids) + list(mask)
        logprobs = [0.0] * len(tokens.prompt_ids) + list(tokens.completion_logprobs)
        if seq_len is not None and len(input_ids) > seq_len:
            input_ids, loss_mask, logprobs = input_ids[:seq_len], loss_mask[:seq_len], logprobs[:seq_len]
        samples.append(Sample(input_ids, loss_mask, logprobs, advantage, rollout.policy_version))
    return samples


def groups_to_samples(groups: Sequence[Group], config: TrainConfig) -> list[Sample]:
    samples = []
    for group in groups:
        advantages = group.advantages(scale_by_std=config.scale_advantages_by_std)
        for rollout, advantage in zip(group.rollouts, advantages, strict=True):
            samples += rollout_to_samples(
                rollout,
                advantage,
                strategy=config.trajectory_strategy,
                seq_len=config.seq_len,
                zero_truncated=config.zero_truncated_completions,
                mask_truncated=config.mask_truncated_completions,
            )
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
        "sampler_logprobs": torch.tensor(
            [pad(s.sampler_logprobs, 0.0) for s in samples], dtype=torch.float32
        ),
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        "token_advantages": torch.tensor(
            [pad(s.token_advantages or [0.0] * len(s.input_ids), 0.0) for s in samples], dtype=torch.float32
        ),
    }


def micro_batches(samples: Sequence[Sample], size: int) -> list[list[Sample]]:
    return [list(samples[i : i + size]) for i in range(0, len(samples), size)]
