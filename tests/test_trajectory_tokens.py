"""Multi-turn RL token handling: tokens in (the next turn continues the exact ids sampled so far)
and the two trajectory strategies that turn a rollout into training samples."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from workbench.engine.rollouts import run_rollouts
from workbench.envs.loader import load_environment
from workbench.inference.chat_tokens import continuation_ids, continuation_text
from workbench.inference.local_client import LocalClient
from workbench.train.samples import rollout_sequences, rollout_to_samples
from workbench.types import Group, Rollout, SamplingParams, TokenData


def rollout_with_turns(*turns: TokenData) -> Rollout:
    return Rollout(example_id=0, rollout_index=0, prompt=[], turn_tokens=list(turns))


def test_interleaved_merges_turns_that_extend_each_other_and_masks_what_the_env_wrote() -> None:
    first = TokenData([1, 2], [3, 4], [-0.1, -0.2])
    second = TokenData([1, 2, 3, 4, 9, 9], [5], [-0.3])  # 9, 9: the environment's reply
    (sample,) = rollout_sequences(rollout_with_turns(first, second), "interleaved")
    assert sample.prompt_ids == [1, 2]
    assert sample.completion_ids == [3, 4, 9, 9, 5]
    assert sample.completion_mask == [1, 1, 0, 0, 1]
    assert sample.completion_logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]


def test_interleaved_starts_a_new_sample_where_the_prefix_breaks() -> None:
    first = TokenData([1, 2], [3, 4], [-0.1, -0.2])
    rerendered = TokenData([1, 2, 7, 9], [5], [-0.3])  # the server re-tokenized turn 1 as 7
    sequences = rollout_sequences(rollout_with_turns(first, rerendered), "interleaved")
    assert [(s.prompt_ids, s.completion_ids) for s in sequences] == [([1, 2], [3, 4]), ([1, 2, 7, 9], [5])]


def test_branching_gives_one_sample_per_turn_with_its_own_prompt() -> None:
    first = TokenData([1, 2], [3, 4], [-0.1, -0.2])
    second = TokenData([1, 2, 3, 4, 9, 9], [5], [-0.3])
    samples = rollout_to_samples(
        rollout_with_turns(first, second),
        0.5,
        strategy="branching",
        seq_len=None,
        zero_truncated=False,
        mask_truncated=False,
    )
    assert [s.input_ids for s in samples] == [[1, 2, 3, 4], [1, 2, 3, 4, 9, 9, 5]]
    assert [s.loss_mask for s in samples] == [[0, 0, 1, 1], [0] * 6 + [1]]
    assert all(s.advantage == 0.5 for s in samples)


@pytest.fixture(scope="module")
def client(tiny_model: Path):
    client = LocalClient(tiny_model, model_name="tiny")
    yield client
    asyncio.run(client.close())


def test_continuation_is_what_the_template_writes_after_a_turn(client: LocalClient) -> None:
    tokenizer = client.tokenizer
    reply = [{"role": "user", "content": "Now sort these too: pear, fig"}]
    assert (
        continuation_text(tokenizer, reply)
        == "\n<|im_start|>user\nNow sort these too: pear, fig<|im_end|>\n<|im_start|>assistant\n"
    )
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # a turn cut by a stop string gets its end-of-turn token from the continuation
    assert continuation_ids(tokenizer, [65], reply)[0] == eos
    assert continuation_ids(tokenizer, [65, eos], reply)[0] != eos


async def test_tokens_in_multi_turn_rollout_is_exactly_what_the_sampler_saw(client: LocalClient) -> None:
    """Every turn's prompt is the previous turn's prompt + sampled ids + the env's reply, so the
    whole rollout is one sample whose mask covers exactly the model's tokens."""
    env = load_environment(
        "alphabet-sort", min_turns=3, max_turns=3, num_train_examples=8, num_eval_examples=8
    )
    examples = env.get_examples(4, split="eval")
    groups: list[Group] = []
    client.tokens_in = True
    try:
        await run_rollouts(
            env,
            client,
            examples,
            rollouts_per_example=2,
            on_group=groups.append,
            sampling=SamplingParams(temperature=1.0, max_tokens=64, seed=1),
        )
    finally:
        client.tokens_in = False
    multi = [r for g in groups for r in g.rollouts if len(r.turn_tokens) >= 2]
    assert multi, "no rollout reached a second turn"
    tokenizer = client.tokenizer
    for rollout in multi:
        turns = rollout.turn_tokens
        for before, after in zip(turns, turns[1:]):
            assert (
                after.prompt_ids[: len(before.prompt_ids) + len(before.completion_ids)]
                == before.prompt_ids + before.completion_ids
            )
        (sample,) = rollout_sequences(rollout, "interleaved")
        assert sample == rollout.tokens  # the recorded sequence is the trained one
        assert sample.completion_mask is not None
        sampled = [t for t, m in zip(sample.completion_ids, sample.completion_mask) if m]
        assert sampled == [t for turn in turns for t in turn.completion_ids]
        written = tokenizer.decode(
            [t for t, m in zip(sample.completion_ids, sample.completion_mask) if not m]
        )
        assert "<|im_start|>user" in written  # the env's turns, and only those, are masked out
        assistant_turns = [m["content"] for m in rollout.completion if m["role"] == "assistant"]
        model_text = tokenizer.decode(sampled, skip_special_tokens=True)
        assert all(turn in model_text for turn in assistant_turns)
