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
    return [ScoringInput(prompt=[{"role": "user", "content": "abc"}], completion=[{"role": "assistant", "content": "cba"}],
                         answer="cba", state={}, example_id=i) for i in range(n)]


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
    rubric = Rubric([plain, scorer.method, partial, call, group_func, Unhashable()], weights=[1, 1, 0, 1, 0, 0])
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
    await run_rollouts(env, EchoClient(), env.get_examples(2), rollouts_per_example=2, sampling=SamplingParams())
    signature_calls.clear()
    stats = await run_rollouts(env, EchoClient(), env.get_examples(40), rollouts_per_example=4, sampling=SamplingParams())
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
            assert (await client.chat([{"role": "user", "content": "ab"}], sampling=SamplingParams()))[0].message["content"] == "ba"
            await asyncio.sleep(0.4)  # no stray watchdog fires on a finished request
        finally:
            await client.close()
    hold = Gate(0)  # every request waits: a cancel from outside (Ctrl-C) lands mid-request
    with serve_in_thread(make_app(EchoBackend(), middlewares=(hold.middleware,))) as url, hold:
        client = OpenAIClient(f"{url}/v1", "echo", timeout_s=30)
        try:
            task = asyncio.ensure_future(client.chat([{"role": "user", "content": "c"}], sampling=SamplingParams()))
            while hold.held < 1:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):  # a cancel, not a timeout
                await task
        finally:
            await client.close()
