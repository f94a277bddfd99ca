"""Issue 19 item 4: what the engine does per rollout is not recomputed.

- A reward function's signature is read once, not per rollout (functions, bound methods,
  partials, callable objects; an unhashable callable still works, read each time).
- A stop condition's / cleanup's arguments likewise (`call_with_named_args`).
- The retrying client checks the wrapped client's kind once.
- The silence timeout of `OpenAIClient` still gives up on a silent server, and an outside
  cancel (Ctrl-C) is still a cancel.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any

import pytest

from tests.servers import EchoBackend, Gate, after_first, make_app, serve_in_thread
from workbench.engine import run_rollouts
from workbench.engine.retry import RetryingClient
from workbench.envs import Parser, load_environment
from workbench.envs.decorators import call_with_named_args
from workbench.envs.rubric import Rubric, ScoringInput, is_group_func, parameters
from workbench.envs.rubric_group import RubricGroup
from workbench.errors import InferenceError
from workbench.inference.echo import EchoClient
from workbench.inference.openai_client import OpenAIClient
from workbench.types import SamplingParams


@pytest.fixture
def signature_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every `inspect.signature` call made while the test runs, by the function asked about."""
    calls: list[Any] = []
    real = inspect.signature

    def counting(func: Any, *args: Any, **kwargs: Any) -> inspect.Signature:
        calls.append(func)
        return real(func, *args, **kwargs)

    monkeypatch.setattr(inspect, "signature", counting)
    return calls


def items(n: int) -> list[ScoringInput]:
    return [
        ScoringInput(
            prompt=[{"role": "user", "content": "abc"}],
            completion=[{"role": "assistant", "content": "cba"}],
            answer="cba",
            state={},
            example_id=i,
        )
        for i in range(n)
    ]


class Scorer:
    def __init__(self, bonus: float) -> None:
        self.bonus = bonus

    def method(self, completion, answer) -> float:
        return float(completion[-1]["content"] == answer) + self.bonus

    def __call__(self, answer, **kwargs) -> float:  # a callable object that takes everything
        return float("parser" in kwargs and "example_id" in kwargs)


class Unhashable:
    __hash__ = None  # type: ignore[assignment]
    __name__ = "unhashable"

    def __call__(self, answer) -> float:
        return float(answer == "cba")


def plain(prompt, completion) -> float:
    return float(len(completion) == 1)


def group_func(completions, answers) -> list[float]:
    return [0.5 for _ in completions]


def weighted(completion, answer, scale) -> float:
    return scale * float(completion[-1]["content"] == answer)


async def test_signatures_are_read_once_per_function(signature_calls: list[Any]):
    scorer = Scorer(0.25)
    partial = functools.partial(weighted, scale=2.0)
    partial.__name__ = "weighted"  # type: ignore[attr-defined]
    call = Scorer(0.0)
    call.__name__ = "call"  # type: ignore[attr-defined]
    rubric = Rubric(
        [plain, scorer.method, partial, call, group_func, Unhashable()], weights=[1, 1, 0, 1, 0, 0]
    )
    first = await rubric.score_group(items(4))
    signature_calls.clear()
    for _ in range(25):
        again = await rubric.score_group(items(4))
    # Only the unhashable callable, which cannot be remembered, is asked about again.
    assert {type(f).__name__ for f in signature_calls} == {"Unhashable"}
    assert again == first
    score = first[0]
    assert score.rewards == {"plain": 1.0, "method": 1.25, "call": 1.0}
    assert score.metrics == {"weighted": 2.0, "group_func": 0.5, "unhashable": 1.0}
    assert score.reward == pytest.approx(3.25) and score.error is None


def test_bound_methods_are_remembered_by_their_function(signature_calls: list[Any]):
    parameters(Scorer(0.0).method)  # the bound method (and its object) are gone right after
    signature_calls.clear()
    for bonus in range(5):  # fetched anew, on other objects: one entry, that of Scorer.method
        found = parameters(Scorer(bonus).method)
        assert found.names == {"completion", "answer"} and not found.takes_kwargs
    assert signature_calls == []
    assert is_group_func(group_func) and not is_group_func(Scorer(0.0).method)


def test_the_cache_keeps_no_function_alive():
    import gc
    import weakref

    def scratch(completion) -> float:
        return 0.0

    class Owner:
        def method(self, answer) -> float:
            return 0.0

    owner = Owner()
    parameters(scratch), parameters(owner.method), parameters(functools.partial(weighted, scale=1.0))
    refs = [weakref.ref(scratch), weakref.ref(owner), weakref.ref(Owner)]
    del scratch, owner, Owner
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]  # a GEPA candidate's rubric does not pile up


async def test_rubric_group_members_are_scored_without_rereading(signature_calls: list[Any]):
    group = RubricGroup([Rubric([plain])], funcs=[group_func], weights=[1.0])
    first = await group.score_group(items(3))
    signature_calls.clear()
    for _ in range(10):
        assert await group.score_group(items(3)) == first
    assert signature_calls == []
    assert first[0].reward == pytest.approx(1.5)


async def test_hooks_read_their_arguments_once(signature_calls: list[Any]):
    seen = []

    def hook(state, env=None):
        seen.append((state, env))
        return True

    async def anything(**kwargs):
        return sorted(kwargs)

    assert await call_with_named_args(hook, state=1, env=2, other=3) is True
    assert await call_with_named_args(anything, state=1, env=2) == ["env", "state"]
    signature_calls.clear()
    for i in range(20):
        await call_with_named_args(hook, state=i, env=None, other=3)
        assert await call_with_named_args(anything, state=1) == ["state"]
    assert signature_calls == [] and seen[-1] == (19, None)


def test_retrying_client_checks_the_client_kind_once():
    class TokensIn(EchoClient):
        tokens_in = True

        async def continue_chat(self, previous, new_messages, *, sampling, tools=None):
            return await self.chat(new_messages, sampling=sampling, tools=tools)

    plain_client, tokens_client = RetryingClient(EchoClient()), RetryingClient(TokensIn())
    assert plain_client.tokens_in is False and tokens_client.tokens_in is True
    tokens_client.inner.tokens_in = False  # a trainer switches strategy: read live, not cached
    assert tokens_client.tokens_in is False
    with pytest.raises(InferenceError, match="cannot continue"):
        asyncio.run(plain_client.continue_chat(None, [], sampling=SamplingParams()))  # type: ignore[arg-type]


async def test_engine_scores_many_groups_with_one_signature_read(signature_calls: list[Any]):
    env = load_environment("reverse-text", num_eval_examples=40)
    env.rubric.parser = Parser()
    await run_rollouts(
        env, EchoClient(), env.get_examples(2), rollouts_per_example=2, sampling=SamplingParams()
    )
    signature_calls.clear()
    stats = await run_rollouts(
        env, EchoClient(), env.get_examples(40), rollouts_per_example=4, sampling=SamplingParams()
    )
    assert stats.rollouts == 160 and stats.errors == 0
    assert signature_calls == []


async def test_silence_timeout_and_outside_cancel():
    stall = Gate(after_first(1))  # the first request is never answered
    with serve_in_thread(make_app(EchoBackend(), middlewares=(stall.middleware,))) as url, stall:
        client = OpenAIClient(f"{url}/v1", "echo", timeout_s=0.3)
        try:
            with pytest.raises(InferenceError, match="no response from") as info:
                await client.chat([{"role": "user", "content": "a"}], sampling=SamplingParams())
            assert info.value.transient
            # an answered request is untouched by its (cancelled) watchdog
            assert (await client.chat([{"role": "user", "content": "ab"}], sampling=SamplingParams()))[
                0
            ].message["content"] == "ba"
            await asyncio.sleep(0.4)  # no stray watchdog fires on a finished request
        finally:
            await client.close()
    hold = Gate(0)  # every request waits: a cancel from outside (Ctrl-C) lands mid-request
    with serve_in_thread(make_app(EchoBackend(), middlewares=(hold.middleware,))) as url, hold:
        client = OpenAIClient(f"{url}/v1", "echo", timeout_s=30)
        try:
            task = asyncio.ensure_future(
                client.chat([{"role": "user", "content": "c"}], sampling=SamplingParams())
            )
            while hold.held < 1:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):  # a cancel, not a timeout
                await task
        finally:
            await client.close()


async def test_one_watch_times_out_every_request_to_a_silent_server():
    """The silence watch (one timer per client) gives up on every request waiting on a stalled
    server, tells its own cancels from an outside one, and leaves nothing armed behind."""
    hold = Gate(0)  # no request is ever answered
    with serve_in_thread(make_app(EchoBackend(), middlewares=(hold.middleware,))) as url, hold:
        client = OpenAIClient(f"{url}/v1", "echo", timeout_s=0.3)
        try:
            tasks = [
                asyncio.ensure_future(
                    client.chat([{"role": "user", "content": f"r{i}"}], sampling=SamplingParams())
                )
                for i in range(5)
            ]
            while hold.held < 5:
                await asyncio.sleep(0.01)
            tasks[2].cancel()  # Ctrl-C of one rollout: a cancel, not a timeout
            results = await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await client.close()
    assert isinstance(results[2], asyncio.CancelledError)
    timed_out = [r for i, r in enumerate(results) if i != 2]
    assert all(
        isinstance(r, InferenceError) and r.transient and "no response from" in str(r) for r in timed_out
    )
    assert not client._watch._sent and not client._watch._fired


def test_as_messages_fast_path_is_as_message():
    """`as_messages`' cheap copy of plain messages gives exactly what `as_message` gives: the same
    classes, keys in the same order, new objects (a reward function's edits reach no record)."""
    from types import MappingProxyType, SimpleNamespace

    from workbench.envs.messages import UserMessage, as_message, as_messages

    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages: list[Any] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u", "name": "x"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "r", "tool_call_id": "c1"},
        {"content": "role last", "role": "user"},
        {"role": "developer", "content": "unknown role"},
        MappingProxyType({"role": "user", "content": "a mapping"}),
        UserMessage(content="already one"),
        SimpleNamespace(role="assistant", content="an object"),
    ]
    fresh, reference = as_messages(messages), [as_message(m) for m in messages]
    assert [(type(m), list(m.items())) for m in fresh] == [(type(m), list(m.items())) for m in reference]
    assert all(
        f is not m for f, m in zip(fresh[:7], messages[:7])
    )  # copies (a ChatMessage given stays itself, as before)
    assert fresh[7] is messages[7]
    fresh[0]["content"] = "edited"
    assert messages[0]["content"] == "s"
    with pytest.raises(ValueError, match="needs a role"):
        as_messages([{"content": "no role"}])


def test_per_rollout_sampling_copy_is_merged():
    from workbench.engine.rollouts import with_seed

    base = SamplingParams(temperature=0.5, stop=["x"], extra={"min_p": 0.1}, seed=3)
    for seed in (7, None):
        fast, reference = with_seed(base, seed), base.merged({"seed": seed})
        assert fast == reference and fast.seed == seed
        assert fast.extra is not base.extra  # a rollout's extra is its own, as merged makes it
    assert with_seed(SamplingParams(stop="ab"), 1).stop == ["ab"]  # type: ignore[arg-type]


def test_trajectory_ids_are_distinct_32_hex_characters():
    from workbench.envs.multiturn import _trajectory_id

    ids = [_trajectory_id() for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
