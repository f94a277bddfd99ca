"""LocalClient on a real (small, briefly trained) tiny model: batching, sampling, stops, logprobs."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from pathlib import Path

import pytest

from workbench.errors import InferenceError
from workbench.inference.generation import RowResult
from workbench.inference.local_client import LocalClient, _Request
from workbench.inference.tool_parsing import parse_hermes_tool_calls
from workbench.models.synthetic import REVERSE_SYSTEM_PROMPT, reverse_text_demonstrations
from workbench.models.tiny import TinyModelSpec, build_tiny_model
from workbench.types import SamplingParams

# A few seconds of training: enough to learn the answer format, small context to test limits.
SPEC = TinyModelSpec(
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    intermediate_size=128,
    max_position_embeddings=768,
    steps=40,
    batch_size=8,
)


def prompt(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": REVERSE_SYSTEM_PROMPT}, {"role": "user", "content": text}]


PHRASES = ["green apple", "the lazy dog", "silver river stone", "winter", "purple castle garden", "fox"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=40)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("client") / "tiny"
    return build_tiny_model(out, reverse_text_demonstrations(200, seed=3), SPEC)


@pytest.fixture(scope="module")
def client(model_dir: Path):
    client = LocalClient(model_dir, model_name="tiny", max_batch_size=64)
    yield client
    asyncio.run(client.close())


async def test_concurrent_requests_share_batches(client: LocalClient) -> None:
    before = client.stats.batches
    sampling = SamplingParams(temperature=1.0, max_tokens=24)
    results = await asyncio.gather(
        *[client.chat(prompt(PHRASES[i % 6] + f" {i}"), sampling=sampling) for i in range(64)]
    )
    assert len(results) == 64 and all(len(r) == 1 for r in results)
    assert all(r[0].message["role"] == "assistant" for r in results)
    batches = client.stats.batches - before
    assert batches <= 2 < 64  # all 64 were queued in one loop turn
    assert client.stats.max_batch_rows == 64


async def test_greedy_is_deterministic_and_batch_independent(client: LocalClient) -> None:
    singles = [(await client.chat(prompt(p), sampling=GREEDY))[0] for p in PHRASES]
    # Same prompts again, batched together with sampled requests of other lengths/settings.
    noisy = SamplingParams(temperature=1.3, top_p=0.9, top_k=50, max_tokens=7)
    mixed = await asyncio.gather(
        *[client.chat(prompt(p), sampling=GREEDY) for p in PHRASES],
        *[client.chat(prompt(p + " extra words"), sampling=noisy) for p in PHRASES],
    )
    for single, batched in zip(singles, mixed[: len(PHRASES)]):
        assert batched[0].tokens.completion_ids == single.tokens.completion_ids
        assert batched[0].message["content"] == single.message["content"]
    assert any(s.message["content"] for s in singles)


async def test_max_tokens_gives_length(client: LocalClient) -> None:
    [completion] = await client.chat(
        prompt("green apple"), sampling=SamplingParams(temperature=1.0, max_tokens=5)
    )
    assert completion.finish_reason == "length"
    assert completion.completion_tokens == 5 == len(completion.tokens.completion_ids)
    assert completion.prompt_tokens == len(completion.tokens.prompt_ids) > 0


async def test_stop_string_is_trimmed(client: LocalClient) -> None:
    [full] = await client.chat(prompt("silver river"), sampling=GREEDY)
    text = full.message["content"]
    assert len(text) >= 8, text
    stop = text[4:7]
    [cut] = await client.chat(
        prompt("silver river"), sampling=SamplingParams(temperature=0.0, max_tokens=40, stop=[stop])
    )
    assert cut.finish_reason == "stop"
    assert cut.message["content"] == text[: text.find(stop)]
    assert stop not in cut.message["content"]
    assert cut.completion_tokens < full.completion_tokens or full.finish_reason == "length"


async def test_logprobs_match_the_sampling_distribution(client: LocalClient) -> None:
    import torch

    sampling = SamplingParams(temperature=0.7, max_tokens=20, seed=11)
    [completion] = await client.chat(prompt("the lazy dog"), sampling=sampling)
    tokens = completion.tokens
    assert len(tokens.completion_logprobs) == len(tokens.completion_ids) == completion.completion_tokens
    assert all(lp <= 0.0 and math.isfinite(lp) for lp in tokens.completion_logprobs)
    # Recompute with one full forward pass: log_softmax(logits / T) at each sampled token.
    model = client._hf_model
    ids = torch.tensor([tokens.prompt_ids + tokens.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    start = len(tokens.prompt_ids) - 1
    steps = logits[start : start + len(tokens.completion_ids)] / sampling.temperature
    expected = (
        torch.log_softmax(steps, -1).gather(1, torch.tensor(tokens.completion_ids).unsqueeze(1)).squeeze(1)
    )
    assert torch.allclose(expected, torch.tensor(tokens.completion_logprobs), atol=1e-4)


async def test_n_choices_and_seed(client: LocalClient) -> None:
    sampling = SamplingParams(temperature=2.0, max_tokens=20, n=3, seed=5)
    first = await client.chat(prompt("orange tiger"), sampling=sampling)
    assert len(first) == 3
    assert len({tuple(c.tokens.completion_ids) for c in first}) > 1  # independent draws
    # Same seed, different batch company: the same three samples.
    again, _ = await asyncio.gather(
        client.chat(prompt("orange tiger"), sampling=sampling),
        client.chat(prompt("other"), sampling=SamplingParams(temperature=1.0, max_tokens=3, n=2)),
    )
    assert [c.tokens.completion_ids for c in again] == [c.tokens.completion_ids for c in first]


async def test_top_k_one_and_tiny_top_p_are_greedy(client: LocalClient) -> None:
    [greedy] = await client.chat(prompt("music paper"), sampling=GREEDY)
    [top_k] = await client.chat(
        prompt("music paper"), sampling=SamplingParams(temperature=1.5, top_k=1, max_tokens=40)
    )
    [top_p] = await client.chat(
        prompt("music paper"), sampling=SamplingParams(temperature=1.5, top_p=1e-6, max_tokens=40)
    )
    assert top_k.tokens.completion_ids == greedy.tokens.completion_ids == top_p.tokens.completion_ids


async def test_min_p_one_is_greedy_and_a_neutral_penalty_changes_nothing(client: LocalClient) -> None:
    [greedy] = await client.chat(prompt("music paper"), sampling=GREEDY)
    only_top = SamplingParams(
        temperature=1.5, max_tokens=40, extra={"min_p": 1.0}
    )  # keeps the top token alone
    [min_p] = await client.chat(prompt("music paper"), sampling=only_top)
    [neutral] = await client.chat(
        prompt("music paper"),
        sampling=SamplingParams(temperature=0.0, max_tokens=40, extra={"repetition_penalty": 1.0}),
    )
    assert min_p.tokens.completion_ids == greedy.tokens.completion_ids == neutral.tokens.completion_ids


def test_repetition_penalty_and_min_p_shape_sampling_but_not_logprobs() -> None:
    import torch

    from workbench.inference.generation import GenerationRow, _RowParams, sample_next

    logits = torch.tensor([[2.0, 1.9, -1.0, -3.0]])
    row = GenerationRow([0, 3], SamplingParams(temperature=0.0, extra={"repetition_penalty": 2.0}), 4)
    params = _RowParams.build([row], "cpu", vocab=4)
    penalized = params.penalized(logits)  # token 0 (seen, positive) halved, token 3 (seen, negative) doubled
    assert penalized.tolist() == [pytest.approx([1.0, 1.9, -1.0, -6.0])]
    token, logprob = sample_next(
        logits,
        params.temperature,
        params.top_p,
        params.top_k,
        torch.tensor([0.5]),
        min_p=params.min_p,
        sampling_logits=penalized,
    )
    assert token.tolist() == [1]  # greedy on the penalized logits
    assert logprob.item() == pytest.approx(
        torch.log_softmax(logits, -1)[0, 1].item()
    )  # the model's own logprob
    params.mark_seen(token)
    assert params.penalized(logits)[0, 1].item() == pytest.approx(0.95)  # sampled tokens count as seen
    # min_p = 0.5 at T=1: tokens below half the top probability are never drawn, whatever the uniform
    sampled = _RowParams.build(
        [GenerationRow([0], SamplingParams(temperature=1.0, extra={"min_p": 0.5}), 4)], "cpu", vocab=4
    )
    draws = {
        sample_next(
            logits, sampled.temperature, sampled.top_p, sampled.top_k, torch.tensor([u]), min_p=sampled.min_p
        )[0].item()
        for u in (0.0, 0.3, 0.6, 0.9, 0.999)
    }
    assert draws == {0, 1}


async def test_tokens_in_matches_chat(client: LocalClient) -> None:
    ids = client.render_prompt_ids(prompt("garden"))
    [via_ids] = await client.complete_ids(ids, sampling=GREEDY)
    [via_chat] = await client.chat(prompt("garden"), sampling=GREEDY)
    assert via_ids.tokens.prompt_ids == ids
    assert via_ids.tokens.completion_ids == via_chat.tokens.completion_ids


async def test_tools_reach_the_prompt(client: LocalClient) -> None:
    tools = [{"type": "function", "function": {"name": "reverse", "parameters": {"type": "object"}}}]
    [plain] = await client.chat(prompt("fox"), sampling=SamplingParams(max_tokens=1))
    [with_tools] = await client.chat(prompt("fox"), sampling=SamplingParams(max_tokens=1), tools=tools)
    assert with_tools.prompt_tokens > plain.prompt_tokens
    assert "<tools>" in client.tokenizer.decode(with_tools.tokens.prompt_ids)


async def test_too_long_prompt_is_a_permanent_error(client: LocalClient) -> None:
    with pytest.raises(InferenceError) as info:
        await client.chat(prompt("x" * (SPEC.max_position_embeddings + 10)), sampling=GREEDY)
    assert info.value.transient is False
    # A prompt near the limit is served, with the completion capped by the context length.
    near = prompt("y" * (SPEC.max_position_embeddings - 125))
    room = SPEC.max_position_embeddings - len(client.render_prompt_ids(near))
    assert 0 < room < 20
    [c] = await client.chat(near, sampling=SamplingParams(temperature=0.0, top_k=1, max_tokens=10_000))
    assert c.completion_tokens == room or (c.finish_reason == "stop" and c.completion_tokens < room)


async def test_tool_calls_become_openai_tool_calls(client: LocalClient) -> None:
    text = 'Let me check.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    loop = asyncio.get_running_loop()
    request = _Request([1, 2], SamplingParams(), 10, True, loop, loop.create_future())
    completion = client._to_completion(request, RowResult([5, 6], [-0.1, -0.2], text, "stop"))
    assert completion.finish_reason == "tool_calls"
    assert completion.message["content"] == "Let me check."
    [call] = completion.message["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 1}
    request.parse_tools = False  # no tools offered: the text is left alone
    plain = client._to_completion(request, RowResult([5], [-0.1], text, "stop"))
    assert plain.finish_reason == "stop" and "tool_calls" not in plain.message


def test_parse_hermes_tool_calls() -> None:
    content, calls = parse_hermes_tool_calls(
        'A<tool_call>{"name": "f", "arguments": {"x": "é"}}</tool_call>B'
        '<tool_call>\n{"name": "g", "arguments": "{\\"y\\": 2}"}\n</tool_call>'
    )
    assert content == "AB"
    assert [c["function"]["name"] for c in calls] == ["f", "g"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": "é"}
    assert json.loads(calls[1]["function"]["arguments"]) == {"y": 2}
    assert calls[0]["id"] != calls[1]["id"]
    malformed = 'hi <tool_call>{"name": "f", "arguments": {</tool_call>'
    assert parse_hermes_tool_calls(malformed) == (malformed, [])
    assert parse_hermes_tool_calls("<tool_call>[1, 2]</tool_call>")[1] == []  # no name
    assert parse_hermes_tool_calls("no calls here") == ("no calls here", [])
    _, cut = parse_hermes_tool_calls('<tool_call>\n{"name": "h", "arguments": {}}')  # unterminated
    assert [c["function"]["name"] for c in cut] == ["h"]


async def test_closed_client_refuses(model_dir: Path) -> None:
    own = LocalClient(model_dir)
    [c] = await own.chat(prompt("fox"), sampling=SamplingParams(max_tokens=2))
    assert c.completion_tokens <= 2
    await own.close()
    with pytest.raises(InferenceError):
        await own.chat(prompt("fox"), sampling=GREEDY)


async def test_work_between_batches_runs_on_the_decode_thread(model_dir: Path) -> None:
    """A colocated trainer's step runs where decoding runs (one OpenMP team, one malloc arena):
    its result and its exception come back to the caller; a closed client refuses it."""

    def decoders() -> set[int | None]:
        return {t.ident for t in threading.enumerate() if t.name == "local-client-worker"}

    others = decoders()  # other clients' (the module's client)
    own = LocalClient(model_dir)
    try:
        [first] = await own.chat(prompt("fox"), sampling=GREEDY)
        assert own.run_between_batches(threading.get_ident) in decoders() - others
        with pytest.raises(ZeroDivisionError):
            own.run_between_batches(lambda: 1 / 0)
        [again] = await own.chat(prompt("fox"), sampling=GREEDY)  # decoding goes on after it
        assert again.message == first.message
    finally:
        await own.close()
    with pytest.raises(InferenceError):
        own.run_between_batches(lambda: None)


async def test_weight_changes_between_sessions_reach_the_next_session(model_dir: Path) -> None:
    """The lean forward (and its fused weight copies) is kept from one decode session to the next:
    an in-place update in between (a colocated trainer's optimizer step) is seen by its version
    counter, a `.data` write made under `exclusive_weights()` by the client rebuilding it. Each
    session must give what a new client over the same weights gives."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    own = LocalClient.from_model(model, tokenizer, model_name="tiny")
    asks = [prompt(p) for p in PHRASES]

    async def answers(client: LocalClient) -> list[object]:
        done = await asyncio.gather(*[client.chat(p, sampling=GREEDY) for p in asks])
        return [(c[0].tokens.completion_ids if c[0].tokens else None, c[0].message) for c in done]

    async def fresh() -> list[object]:
        other = LocalClient.from_model(model, tokenizer, model_name="tiny")
        try:
            return await answers(other)
        finally:
            await other.close()

    try:
        before = await answers(own)
        attention = model.model.layers[0].self_attn
        with torch.no_grad():  # in place: the version counter moves
            attention.q_proj.weight.mul_(-3.0)
            attention.v_proj.weight.mul_(-3.0)
        stepped = await answers(own)
        assert stepped != before
        assert stepped == await fresh()
        with own.exclusive_weights():  # `.data` moves no version counter
            mlp = model.model.layers[0].mlp
            mlp.up_proj.weight.data = mlp.up_proj.weight.data * -3.0
        assert await answers(own) == await fresh() != stepped
    finally:
        await own.close()
