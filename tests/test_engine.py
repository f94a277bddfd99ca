"""The rollout engine in-process and over real HTTP on 127.0.0.1, with faults injected."""

from __future__ import annotations

import asyncio

import pytest

from tests.servers import (
    EchoBackend,
    FaultInjector,
    Gate,
    after_first,
    make_app,
    serve_in_subprocess,
    serve_in_thread,
)
from workbench.engine import RetryPolicy, run_rollouts
from workbench.envs import load_environment
from workbench.errors import ServerGone
from workbench.inference.echo import EchoClient
from workbench.inference.openai_client import OpenAIClient
from workbench.types import Completion, SamplingParams

FAST_RETRY = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05)


def reverse_text_with_tags():
    """reverse-text whose answer format the echo server can satisfy (no tags needed)."""
    env = load_environment("reverse-text", num_eval_examples=12)
    from workbench.envs import Parser

    env.rubric.parser = Parser()  # EchoClient answers with the bare reversal
    return env


async def collect(env, client, n=6, r=3, **kw):
    groups = []
    stats = await run_rollouts(
        env,
        client,
        env.get_examples(n),
        rollouts_per_example=r,
        sampling=SamplingParams(max_tokens=64),
        on_group=groups.append,
        **kw,
    )
    return groups, stats


async def test_in_process_groups_stream_and_score():
    env = reverse_text_with_tags()
    groups, stats = await collect(env, EchoClient(), n=6, r=3, state_columns=["turn"])
    assert stats.groups == 6 and stats.rollouts == 18 and stats.errors == 0
    assert sorted(g.example_id for g in groups) == list(range(6))
    for group in groups:
        assert [r.rollout_index for r in group.rollouts] == [0, 1, 2]
        assert all(r.reward == 1.0 for r in group.rollouts)  # echo reverses exactly
        assert group.rollouts[0].state_columns == {"turn": 1}
        assert group.rollouts[0].timing["total_ms"] >= group.rollouts[0].timing["generation_ms"]


async def test_http_matches_in_process():
    env = reverse_text_with_tags()
    local, _ = await collect(env, EchoClient())
    with serve_in_thread(make_app(EchoBackend())) as url:
        client = OpenAIClient(f"{url}/v1", "echo")
        remote, stats = await collect(env, client)
        await client.close()
    assert stats.errors == 0
    as_text = lambda groups: sorted(
        (g.example_id, r.rollout_index, r.completion[-1]["content"]) for g in groups for r in g.rollouts
    )
    assert as_text(local) == as_text(remote)


async def test_transient_failures_are_retried():
    env = reverse_text_with_tags()
    faults = FaultInjector(fail_first=5, fail_rate=0.2, status=503, seed=1)
    with serve_in_thread(make_app(EchoBackend(), middlewares=(faults.middleware,))) as url:
        client = OpenAIClient(f"{url}/v1", "echo")
        groups, stats = await collect(
            env, client, n=8, r=4, retry=RetryPolicy(max_attempts=10, base_delay_s=0.01, max_delay_s=0.05)
        )
        await client.close()
    assert faults.failed >= 5
    assert stats.errors == 0 and stats.retries == faults.failed
    assert all(r.reward == 1.0 for g in groups for r in g.rollouts)


async def test_stalled_requests_time_out_and_are_retried():
    env = reverse_text_with_tags()
    stall = Gate(after_first(3))  # the first 3 requests never get an answer: each must time out
    with serve_in_thread(make_app(EchoBackend(), middlewares=(stall.middleware,))) as url, stall:
        client = OpenAIClient(f"{url}/v1", "echo", timeout_s=0.5)
        groups, stats = await collect(env, client, n=3, r=2, retry=FAST_RETRY)
        await client.close()
    assert stall.held == 3
    assert stats.errors == 0 and stats.retries >= 3


async def test_permanent_errors_are_recorded_not_retried():
    env = reverse_text_with_tags()
    faults = FaultInjector(fail_first=2, status=400)
    with serve_in_thread(make_app(EchoBackend(), middlewares=(faults.middleware,))) as url:
        client = OpenAIClient(f"{url}/v1", "echo")
        groups, stats = await collect(env, client, n=2, r=2, max_concurrent=1, retry=FAST_RETRY)
        await client.close()
    errors = [r.error for g in groups for r in g.rollouts if r.error]
    assert len(errors) == 2 and stats.retries == 0
    assert all(e.where == "inference" and "injected fault 400" in e.message for e in errors)
    assert all(r.reward == 0.0 for g in groups for r in g.rollouts if r.error)


async def test_a_server_that_dies_mid_run_stops_it_and_finished_groups_are_kept():
    env = reverse_text_with_tags()
    with serve_in_subprocess("echo") as server:
        client = OpenAIClient(f"{server.base_url}/v1", "echo", timeout_s=5)
        groups = []

        def on_group(group):
            groups.append(group)
            if len(groups) == 3:
                server.kill()  # the server crashes while later groups are in flight or queued

        # every try refused: the server is gone (not 12 groups of failures), within the backoff
        with pytest.raises(ServerGone, match="connection refused"):
            await run_rollouts(
                env,
                client,
                env.get_examples(12),
                rollouts_per_example=2,
                sampling=SamplingParams(),
                max_concurrent=2,
                on_group=on_group,
                retry=FAST_RETRY,
            )
        await client.close()
    assert 3 <= len(groups) < 12
    assert all(r.error is None and r.reward == 1.0 for g in groups[:3] for r in g.rollouts)  # nothing lost
    failed = [r for g in groups[3:] for r in g.rollouts if r.error]
    assert all(r.error.where == "inference" and r.error.infrastructure for r in failed)


async def test_concurrency_is_bounded():
    class Tracking(EchoClient):
        in_flight = peak = 0

        async def chat(self, messages, *, sampling, tools=None) -> list[Completion]:
            Tracking.in_flight += 1
            Tracking.peak = max(Tracking.peak, Tracking.in_flight)
            await asyncio.sleep(0.01)
            Tracking.in_flight -= 1
            return await super().chat(messages, sampling=sampling, tools=tools)

    env = reverse_text_with_tags()
    await collect(env, Tracking(), n=10, r=4, max_concurrent=5)
    assert Tracking.peak == 5


async def test_env_crash_is_recorded_per_rollout():
    env = reverse_text_with_tags()

    async def broken_rollout(client, example, sampling):
        if example.example_id == 1:
            raise RuntimeError("env bug")
        return await type(env).rollout(env, client, example, sampling)

    env.rollout = broken_rollout
    groups, stats = await collect(env, EchoClient(), n=3, r=2)
    bad = next(g for g in groups if g.example_id == 1)
    assert all(r.error and r.error.where == "env" and "env bug" in r.error.message for r in bad.rollouts)
    assert stats.errors == 2 and stats.groups == 3


async def test_distinct_seeds_per_rollout():
    seen = []

    class SeedRecorder(EchoClient):
        async def chat(self, messages, *, sampling, tools=None):
            seen.append(sampling.seed)
            return await super().chat(messages, sampling=sampling, tools=tools)

    env = reverse_text_with_tags()
    await run_rollouts(
        env,
        SeedRecorder(),
        env.get_examples(3),
        rollouts_per_example=4,
        sampling=SamplingParams(seed=7),
        on_group=None,
    )
    assert len(set(seen)) == 12
