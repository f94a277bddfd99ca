"""Packed training micro-batches (workbench.train.packing): samples laid end to end, each its own
sequence, give the padded path's loss, stats and gradients on the real tiny model, for the
policy losses, the KL penalty and SFT, LoRA and full fine-tuning; every sample is trained once,
no micro-batch outgrows the padded path's, and ranks still join equally many backward passes."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from workbench.train.distributed import DistInfo
from workbench.train.packing import (
    Shared,
    block_causal_mask,
    collate_packed,
    collate_prefixed,
    item_length,
    item_samples,
    laid_out_tokens,
    layout_prefixed,
    pack_rows,
    pack_width,
    packed_micro_batches,
    prefixed_micro_batches,
    share_prefixes,
)
from workbench.train.samples import Sample, collate, micro_batches
from workbench.train.schema import TrainConfig

PAD = 256  # the tiny model's pad id


def make_samples(count: int, seed: int = 0, *, token_advantages: bool = True) -> list[Sample]:
    """Varied lengths (a prompt, then a completion with an environment span masked out), varied
    advantages, sampler logprobs away from the policy's (so ratios clip), some per-token advantages."""
    rng = random.Random(seed)
    samples = []
    for index in range(count):
        prompt, completion = rng.randint(3, 20), rng.randint(2, 30)
        size = prompt + completion
        mask = [0] * prompt + [1] * completion
        if completion > 10:  # an environment turn inside the completion: not a loss token
            mask[prompt + 4 : prompt + 7] = [0, 0, 0]
        logprobs = [-rng.uniform(0.5, 6.0) if m else 0.0 for m in mask]
        per_token = (
            [rng.uniform(-0.5, 0.5) * m for m in mask] if token_advantages and index % 3 == 0 else None
        )
        samples.append(
            Sample(
                [rng.randrange(256) for _ in range(size)],
                mask,
                logprobs,
                rng.uniform(-1.5, 1.5),
                token_advantages=per_token,
            )
        )
    return samples


def make_groups(groups: int, size: int, seed: int = 0, system: int = 0) -> list[Sample]:
    """RL groups: `size` rollouts of each prompt (the same prompt ids), varied completions: an
    environment span masked out inside some, one whose first completion tokens are masked (its
    own tokens may not be shared beyond the group's prompt), one fully masked (truncated), one
    whose completion starts like a sibling's; some per-token advantages; and a few lone samples.
    `system`: every prompt begins with the same `system` tokens (a system prompt, few-shot turns)."""
    rng = random.Random(seed)
    samples = []
    common = [rng.randrange(256) for _ in range(system)]
    for group in range(groups):
        prompt = common + [rng.randrange(256) for _ in range(rng.randint(6, 25))]
        first = None
        for index in range(size):
            completion = [rng.randrange(256) for _ in range(rng.randint(2, 30))]
            if index == 1 and first is not None:
                completion[:2] = first[:2]  # the same first sampled tokens as a sibling
            first = first or completion
            mask = [1] * len(completion)
            if len(completion) > 10:
                mask[4:7] = [0, 0, 0]
            if index == 2:
                mask[:1] = [0]
            if index == 3 and group % 2:
                mask = [0] * len(mask)  # truncated and masked
            full_mask = [0] * len(prompt) + mask
            logprobs = [-rng.uniform(0.5, 6.0) if m else 0.0 for m in full_mask]
            per_token = [rng.uniform(-0.5, 0.5) * m for m in full_mask] if index % 3 == 0 else None
            samples.append(
                Sample(
                    prompt + completion,
                    full_mask,
                    logprobs,
                    rng.uniform(-1.5, 1.5),
                    token_advantages=per_token,
                )
            )
    rng.shuffle(samples)
    return samples + make_samples(3, seed=seed + 100)


# -- layout ---------------------------------------------------------------------------------------


def test_pack_rows_places_every_sample_once_within_the_width():
    samples = make_samples(40)
    rows = pack_rows(samples, 50)
    assert sorted(id(s) for row in rows for s in row) == sorted(id(s) for s in samples)
    assert all(sum(len(s.input_ids) for s in row) <= 50 for row in rows)
    assert len(rows) < len(samples)  # short samples share rows


def test_a_sample_wider_than_the_row_gets_a_row_of_its_own():
    long, short = Sample([1] * 30, [1] * 30, [0.0] * 30, 1.0), Sample([1] * 5, [1] * 5, [0.0] * 5, 1.0)
    assert pack_rows([short, long], 10) == [[long], [short]]


@pytest.mark.parametrize("width", [None, 100, 400])
def test_packed_micro_batches_are_never_larger_or_more_than_padded(width: int | None):
    samples = make_samples(50, seed=1)
    longest = max(len(s.input_ids) for s in samples)
    chunks = packed_micro_batches(samples, 8, width)
    assert sorted(id(s) for chunk in chunks for row in chunk for s in row) == sorted(id(s) for s in samples)
    assert len(chunks) <= len(micro_batches(samples, 8))
    for chunk in chunks:
        tokens = collate_packed(chunk, PAD)["input_ids"].numel()
        assert tokens <= 8 * max(longest, width or 0), "no larger tensor than a padded micro-batch"


def test_rows_are_the_longest_sample_wide_with_a_mask_and_the_budget_wide_without():
    samples = make_samples(10)
    longest = max(len(s.input_ids) for s in samples)
    assert pack_width(samples, 4, None, masked=True) == longest
    assert pack_width(samples, 4, None, masked=False) == 4 * longest
    assert pack_width(samples, 4, 4096, masked=False) == 4096  # prime-rl packs to seq_len


def test_collate_packed_restarts_positions_and_isolates_samples():
    a = Sample([10, 11, 12], [0, 1, 1], [0.0, -1.0, -2.0], 0.5, token_advantages=[0.0, 0.1, 0.2])
    b = Sample([20, 21], [0, 1], [0.0, -3.0], -1.0)
    c = Sample([30, 31, 32, 33], [0, 0, 1, 1], [0.0, 0.0, -1.0, -1.0], 2.0)
    batch = collate_packed([[a, b], [c]], PAD)
    assert batch["input_ids"].tolist() == [[10, 11, 12, 20, 21], [30, 31, 32, 33, PAD]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]
    assert batch["advantages"].tolist() == [[0.5, 0.5, 0.5, -1.0, -1.0], [2.0, 2.0, 2.0, 2.0, 0.0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1, 0, 1], [0, 0, 1, 1, 0]]
    assert batch["token_advantages"][0].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.0, 0.0])
    mask = batch["attention_mask"][0, 0].int().tolist()
    assert mask == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    assert batch["attention_mask"][1, 0, 4].int().tolist() == [0, 0, 0, 0, 1], "tail padding sees only itself"


def test_groups_with_one_prompt_share_it_and_no_shared_token_carries_loss():
    samples = make_groups(4, 5)
    items = share_prefixes(samples, 10_000)
    shared = [item for item in items if isinstance(item, Shared)]
    assert len(shared) == 4 and all(len(item.samples) == 5 for item in shared)
    assert sorted(id(s) for item in items for s in item_samples(item)) == sorted(id(s) for s in samples)
    for item in shared:
        head = item.samples[0].input_ids[: item.prefix]
        assert all(s.input_ids[: item.prefix] == head for s in item.samples)
        assert all(not any(s.loss_mask[: item.prefix]) for s in item.samples), (
            "a shared token never carries loss"
        )
        assert all(len(s.input_ids) > item.prefix for s in item.samples)
        prompt = min(
            next(i for i, m in enumerate(s.loss_mask) if m) for s in item.samples if any(s.loss_mask)
        )
        assert item.prefix == prompt  # the whole prompt, and no sampled token
    assert sum(1 for item in items if isinstance(item, Sample)) == 3  # the lone samples stay alone


def test_a_group_wider_than_the_budget_is_split_each_part_with_its_prompt():
    prompt = list(range(20))
    samples = [Sample(prompt + [100 + i] * 10, [0] * 20 + [1] * 10, [0.0] * 30, 1.0) for i in range(6)]
    items = share_prefixes(samples, 60)  # the prompt + at most 4 completions
    assert [len(item.samples) for item in items if isinstance(item, Shared)] == [4, 2]
    assert all(item.prefix == 20 for item in items if isinstance(item, Shared))


def test_collate_shared_prefix_layout():
    """The prompt runs once in the prefix pass (all but its last token); each rest starts at that
    last token, continues the prompt's positions and reads the prompt's keys; a plain sample in
    the same row reads none of them."""
    a = Sample(
        [1, 2, 3, 10, 11],
        [0, 0, 0, 1, 1],
        [0.0, 0.0, 0.0, -1.0, -2.0],
        0.5,
        token_advantages=[9.0, 9, 9, 0.1, 0.2],
    )
    b = Sample([1, 2, 3, 20], [0, 0, 0, 1], [0.0, 0.0, 0.0, -3.0], -1.0)
    c = Sample([7, 8], [0, 1], [0.0, -1.0], 2.0)
    batch = collate_prefixed([Shared(3, [a, b]), c], PAD)
    (prompt,) = batch["prompt_passes"]
    assert prompt["input_ids"].tolist() == [[1, 2]] and prompt["position_ids"].tolist() == [[0, 1]]
    # rest rows are as wide as the longest rest (a's): b's rest and c fit in no row with it
    assert batch["context"].tolist() == [[0, 1], [0, 1], [0, 0]]
    assert batch["input_ids"].tolist() == [[3, 10, 11], [3, 20, PAD], [7, 8, PAD]]
    assert batch["position_ids"].tolist() == [[2, 3, 4], [2, 3, 0], [0, 1, 0]]
    assert batch["starts"].tolist() == [[True, False, False], [True, False, True], [True, False, True]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [0, 1, 0], [0, 1, 0]]
    assert batch["advantages"].tolist() == [[0.5, 0.5, 0.5], [-1.0, -1.0, 0.0], [2.0, 2.0, 0.0]]
    assert batch["token_advantages"][0].tolist() == pytest.approx([9, 0.1, 0.2])
    mask = batch["attention_mask"][:, 0].int().tolist()  # prompt keys | own row
    assert mask[0] == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert mask[1] == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [0, 0, 0, 0, 1]]
    assert mask[2] == [[0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1]], "a plain sample reads no prompt"
    longer = Sample([1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 1, 1, 1, 1, 1], [0.0] * 8, 1.0)
    mixed = collate_prefixed([Shared(3, [a, longer]), c], PAD)
    assert mixed["input_ids"][1].tolist() == [3, 10, 11, 7, 8, PAD]  # c fills the free space of a group's row
    assert mixed["attention_mask"][1, 0, 3].int().tolist() == [0, 0, 0, 0, 0, 1, 0, 0], "and reads no prompt"
    plain = collate_prefixed([c], PAD)  # no group: one pass, no prompt keys
    assert "prompt_passes" not in plain and plain["attention_mask"].shape == (1, 1, 2, 2)
    with pytest.raises(ValueError):
        layout_prefixed([Shared(1, [a, b])])  # the prompt pass would have no token


def test_prompts_that_begin_alike_share_that_beginning_in_an_earlier_pass():
    system = [50, 51, 52, 53]
    a = Sample(system + [1, 2, 10, 11], [0] * 6 + [1, 1], [0.0] * 8, 0.5)
    b = Sample(system + [1, 2, 20], [0] * 6 + [1], [0.0] * 7, -1.0)
    c = Sample(system + [3, 4, 5, 30], [0] * 7 + [1], [0.0] * 8, 1.0)
    d = Sample(system + [3, 4, 5, 40, 41], [0] * 7 + [1, 1], [0.0] * 9, 2.0)
    batch = collate_prefixed([Shared(6, [a, b]), Shared(7, [c, d])], PAD)
    first, second = batch["prompt_passes"]
    assert first["input_ids"].tolist() == [system]  # once for both prompts
    assert second["input_ids"].tolist() == [[3, 4], [1, PAD]]  # each prompt's own part, but its last token
    assert second["position_ids"].tolist() == [[4, 5], [4, 0]]
    assert second["context"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert second["attention_mask"][:, 0].int().tolist() == [
        [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 1]],
    ]
    # the rests read the whole prompt: the common part (flat 0..3), then their own (flat 4.. in pass 2)
    rows = {
        tuple(ids): context
        for ids, context in zip(batch["input_ids"].tolist(), batch["context"].tolist(), strict=True)
    }
    assert rows[(2, 10, 11)] == [0, 1, 2, 3, 6, 0] and rows[(5, 40, 41)] == [0, 1, 2, 3, 4, 5]


def test_a_row_reads_one_context_and_rows_are_no_wider_than_their_longest_node():
    samples = make_groups(5, 8, seed=3, system=12)
    items = share_prefixes(samples, 10_000)
    layout = layout_prefixed(items)
    assert len(layout.passes) == 2, "the common system prompt, then each prompt's own part"
    for rows in [*layout.passes, layout.rests]:
        width = max(len(node.ids) for row in rows for node in row)
        for row in rows:
            assert len({id(node.parent) for node in row if node.parent is not None}) <= 1
            assert sum(len(node.ids) for node in row) <= width
    assert sorted(id(node.sample) for row in layout.rests for node in row) == sorted(id(s) for s in samples)
    for row in layout.rests:
        for node in row:  # a leaf's context and own tokens are its sample's
            context, parent = [], node.parent
            while parent is not None:
                context, parent = parent.ids + context, parent.parent
            assert context + node.ids == node.sample.input_ids and node.start == len(context)
    assert layout.tokens() == laid_out_tokens(items) < sum(len(s.input_ids) for s in samples)


def test_shared_micro_batches_hold_every_sample_once_and_fewer_tokens():
    samples = make_groups(6, 8, seed=7)
    longest = max(len(s.input_ids) for s in samples)
    batches = prefixed_micro_batches(samples, 4)
    assert sorted(id(s) for items in batches for item in items for s in item_samples(item)) == sorted(
        id(s) for s in samples
    )
    assert len(batches) <= len(micro_batches(samples, 4))
    assert sum(item_length(item) for items in batches for item in items) < sum(
        len(s.input_ids) for s in samples
    )
    for items in batches:
        batch = collate_prefixed(items, PAD)
        laid_out = batch["input_ids"].numel() + sum(
            p["input_ids"].numel() for p in batch.get("prompt_passes", ())
        )
        assert laid_out == laid_out_tokens(items) <= 4 * longest, "no larger than a padded micro-batch"


def test_block_causal_mask_shape():
    import torch

    assert block_causal_mask(torch.tensor([[0, 0, 1]])).shape == (1, 1, 3, 3)


# -- the same numbers as the padded path, on the real tiny model ----------------------------------


class CapturingOptimizer:
    """Stands in for AdamW: `step` records the (accumulated) gradients instead of applying them."""

    def __init__(self, params: list[Any]) -> None:
        self.params, self.grads = params, None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        self.grads = [p.grad.detach().clone() for p in self.params]


class NoSchedule:
    def step(self) -> None:
        pass


def load(tiny_model: Path, *, lora: bool, kl: bool = False, loss: str = "grpo"):
    import torch

    from workbench.train.policy import load_policy

    config = TrainConfig(
        mode="sft",
        sft={"from_env": True},
        env=[{"id": "reverse-text"}],
        batch_size=24,
        micro_batch_size=4,
        max_grad_norm=1e9,
        loss=loss,
        lora={"enabled": lora, "r": 4},
        kl_penalty={"enabled": kl},
    )
    policy = load_policy(tiny_model, config, need_reference=kl)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:  # a fresh adapter is zero: give it weights, so lora_A has gradients too
                param.normal_(0, 0.05)
            elif not lora and kl:  # move the policy off its reference, so the KL term has a gradient
                param.add_(torch.randn_like(param) * 0.01)
    return policy, config


def step(
    policy: Any, config: TrainConfig, samples: list[Sample], *, pack: bool, **kwargs: Any
) -> tuple[Any, list[Any]]:
    from workbench.train.optimize import train_on_samples

    optimizer = CapturingOptimizer(policy.trainable_parameters())
    stats = train_on_samples(
        policy, optimizer, NoSchedule(), samples, config.model_copy(update={"pack_samples": pack}), **kwargs
    )
    assert optimizer.grads is not None
    return stats, optimizer.grads


def assert_same_step(policy: Any, config: TrainConfig, samples: list[Sample], **kwargs: Any) -> None:
    padded, padded_grads = step(policy, config, samples, pack=False, **kwargs)
    packed, packed_grads = step(policy, config, samples, pack=True, **kwargs)
    for key in ("loss", "entropy", "kl", "ratio_mean", "clip_frac", "grad_norm"):
        assert getattr(packed, key) == pytest.approx(getattr(padded, key), rel=1e-5, abs=1e-7), key
    assert packed.tokens == padded.tokens
    assert packed.padding_fraction < padded.padding_fraction
    assert any(float(g.abs().sum()) > 0 for g in padded_grads)
    for a, b in zip(padded_grads, packed_grads, strict=True):
        assert float((a - b).norm()) <= 1e-5 * float(a.norm()) + 1e-9


@pytest.mark.parametrize("loss", ["grpo", "cispo"])
def test_packed_gives_the_padded_gradients_lora(tiny_model: Path, loss: str):
    policy, config = load(tiny_model, lora=True, loss=loss)
    assert_same_step(policy, config, make_samples(24), temperature=0.8)


def test_packed_gives_the_padded_gradients_with_the_kl_penalty(tiny_model: Path):
    policy, config = load(tiny_model, lora=True, kl=True)
    padded, _ = step(policy, config, make_samples(24, seed=2), pack=False, kl_beta=0.5)
    assert padded.kl > 0, "the adapter moves the policy off its reference"
    assert_same_step(policy, config, make_samples(24, seed=2), kl_beta=0.5)


def test_packed_gives_the_padded_gradients_full_fine_tuning_with_kl(tiny_model: Path):
    policy, config = load(tiny_model, lora=False, kl=True)
    assert_same_step(policy, config, make_samples(24, seed=3), kl_beta=0.5)


def test_packed_gives_the_padded_gradients_sft(tiny_model: Path):
    policy, config = load(tiny_model, lora=True)
    assert_same_step(policy, config, make_samples(24, seed=4, token_advantages=False), sft=True)


@pytest.mark.parametrize("loss", ["grpo", "cispo"])
def test_shared_prompts_give_the_padded_gradients_lora(tiny_model: Path, loss: str):
    policy, config = load(tiny_model, lora=True, loss=loss)
    assert_same_step(policy, config, make_groups(4, 6, seed=11), temperature=0.8)


def test_shared_prompts_give_the_padded_gradients_with_the_kl_penalty(tiny_model: Path):
    policy, config = load(tiny_model, lora=True, kl=True)
    assert_same_step(policy, config, make_groups(3, 8, seed=12), kl_beta=0.5)


def test_shared_prompts_give_the_padded_gradients_full_fine_tuning_with_kl(tiny_model: Path):
    policy, config = load(tiny_model, lora=False, kl=True)
    assert_same_step(policy, config, make_groups(4, 5, seed=13), kl_beta=0.5)


@pytest.mark.parametrize("lora", [True, False])
def test_prompts_sharing_a_system_prompt_give_the_padded_gradients(tiny_model: Path, lora: bool):
    policy, config = load(tiny_model, lora=lora, kl=not lora)
    samples = make_groups(4, 6, seed=21, system=15)
    assert_same_step(policy, config, samples, temperature=0.8, **({} if lora else {"kl_beta": 0.5}))


def test_shared_prompts_give_the_padded_gradients_sft(tiny_model: Path):
    policy, config = load(tiny_model, lora=True)
    samples = make_groups(3, 6, seed=14)
    for sample in samples:
        sample.token_advantages = None
    assert_same_step(policy, config, samples, sft=True)


def test_the_step_runs_each_shared_prompt_once_only_with_a_mask():
    from workbench.train.optimize import _equal_micro_batches

    config = TrainConfig(
        mode="sft", sft={"from_env": True}, env=[{"id": "reverse-text"}], batch_size=32, micro_batch_size=8
    )
    samples = make_groups(4, 8, seed=15)
    total = sum(len(s.input_ids) for s in samples)
    chunks, tokens = _equal_micro_batches(samples, config, PAD, DistInfo(), masked=True)
    assert tokens < total and any("prompt_passes" in c for c in chunks)
    assert sum(float(c["loss_mask"].sum()) for c in chunks) == sum(sum(s.loss_mask) for s in samples)
    chunks, tokens = _equal_micro_batches(
        samples, config, PAD, DistInfo(), masked=False
    )  # varlen: no sharing
    assert tokens == total and not any("prompt_passes" in c for c in chunks)


def test_each_member_of_a_shared_prompt_sees_what_it_sees_alone(tiny_model: Path):
    import torch

    from workbench.train.loss import token_logprobs

    policy, _ = load(tiny_model, lora=True)
    items = share_prefixes(make_groups(3, 4, seed=16, system=10), 10_000)
    assert sum(isinstance(item, Shared) for item in items) == 3
    layout = layout_prefixed(items)
    assert len(layout.passes) == 2
    with torch.no_grad():
        packed, packed_entropy = token_logprobs(policy.model, collate_prefixed(items, PAD), 0.7)
        for r, row in enumerate(layout.rests):
            offset = 0
            for sample, start in ((node.sample, node.start) for node in row):
                alone, alone_entropy = token_logprobs(policy.model, collate([sample], PAD), 0.7)
                size = len(sample.input_ids) - start
                # the rest's first token (the prompt's last) has no logprob in its row: never a loss token
                assert packed[r, offset] == 0.0
                assert torch.allclose(packed[r, offset + 1 : offset + size], alone[0, start + 1 :], atol=1e-5)
                assert torch.allclose(
                    packed_entropy[r, offset + 1 : offset + size], alone_entropy[0, start + 1 :], atol=1e-5
                )
                offset += size


def test_a_first_token_is_not_predicted_from_the_previous_sample(tiny_model: Path):
    """A sample whose very first token is a loss token (no prompt): packed after another sample,
    its logprob is 0 as at the start of its padded row, not the previous sample's prediction."""
    import torch

    from workbench.train.loss import token_logprobs

    policy, _ = load(tiny_model, lora=True)
    first = Sample([5, 6, 7, 8], [0, 1, 1, 1], [0.0] * 4, 1.0)
    bare = Sample([9, 10, 11], [1, 1, 1], [0.0] * 3, 1.0)
    with torch.no_grad():
        packed, _ = token_logprobs(policy.model, collate_packed([[first, bare]], PAD), 1.0)
        padded, _ = token_logprobs(policy.model, collate([first, bare], PAD), 1.0)
    assert packed[0, 4] == 0.0
    assert torch.allclose(packed[0, :4], padded[0, :4], atol=1e-6)
    assert torch.allclose(packed[0, 4:7], padded[1, :3], atol=1e-6)


def test_the_model_sees_each_packed_sample_alone(tiny_model: Path):
    """Logprobs of a sample packed behind another equal those of the sample alone: positions
    restart and the previous sample is invisible to it."""
    import torch

    from workbench.train.loss import token_logprobs

    policy, _ = load(tiny_model, lora=True)
    samples = make_samples(3, seed=5)
    with torch.no_grad():
        packed, _ = token_logprobs(policy.model, collate_packed([samples], PAD), 1.0)
        offset = 0
        for sample in samples:
            alone, _ = token_logprobs(policy.model, collate([sample], PAD), 1.0)
            size = len(sample.input_ids)
            assert torch.allclose(packed[0, offset : offset + size], alone[0], atol=1e-5)
            offset += size


# -- data parallel ---------------------------------------------------------------------------------


class FakeRanks(DistInfo):
    """Rank 0 of 2 whose peer has `peer_chunks` micro-batches (no process group needed)."""

    def __init__(self, peer_chunks: int) -> None:
        super().__init__(rank=0, world_size=2)
        object.__setattr__(self, "peer_chunks", peer_chunks)

    def max(self, value: int) -> int:
        return max(value, self.peer_chunks)  # type: ignore[attr-defined]


@pytest.mark.parametrize("pack", [True, False])
def test_ranks_with_fewer_micro_batches_run_empty_ones(pack: bool):
    from workbench.train.optimize import _equal_micro_batches

    config = TrainConfig(
        mode="sft",
        sft={"from_env": True},
        env=[{"id": "reverse-text"}],
        batch_size=8,
        micro_batch_size=4,
        pack_samples=pack,
    )
    samples = make_samples(8)
    own, tokens = _equal_micro_batches(samples, config, PAD, DistInfo(), masked=True)
    chunks, _ = _equal_micro_batches(samples, config, PAD, FakeRanks(len(own) + 2), masked=True)
    assert tokens == sum(len(s.input_ids) for s in samples)  # no common prompts here: nothing shared
    assert len(chunks) == len(own) + 2
    assert all(float(c["loss_mask"].sum()) == 0 for c in chunks[len(own) :])


def test_varlen_attention_gets_position_ids_and_no_mask():
    """flash-attention finds the packed boundaries in the position ids itself (varlen)."""
    batch = collate_packed([make_samples(3)], PAD, with_mask=False)
    assert "attention_mask" not in batch and "position_ids" in batch


def test_position_ids_alone_give_the_masked_logprobs_where_transformers_finds_packing(tiny_model: Path):
    """The varlen route (no 4D mask, packed position ids) isolates samples as the explicit mask
    does, in transformers versions that find packed sequences in position ids (on CPU this checks
    the semantics the flash-attention path relies on; flash-attention itself needs a GPU)."""
    import torch

    from workbench.train.loss import token_logprobs

    masking_utils = pytest.importorskip("transformers.masking_utils")
    if not hasattr(masking_utils, "find_packed_sequence_indices"):
        pytest.skip("this transformers does not find packed sequences in position ids")
    policy, _ = load(tiny_model, lora=True)
    rows = [make_samples(4, seed=6)]
    with torch.no_grad():
        masked, _ = token_logprobs(policy.model, collate_packed(rows, PAD), 1.0)
        varlen, _ = token_logprobs(policy.model, collate_packed(rows, PAD, with_mask=False), 1.0)
    assert torch.allclose(masked, varlen, atol=1e-5)
