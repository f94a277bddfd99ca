"""Issue 19 item 4: an eval keeps no finished rollout in memory.

- `RunningSummary` (running aggregates) gives exactly what the all-in-memory `summarize` gave,
  whatever order the groups finish in (checked against a copy of that implementation).
- The engine drops each group once it is handed over, and keeps a bounded number of rollouts
  in flight however many examples there are.
- `run_eval` streams groups to results.jsonl and keeps none: its summary is what results.jsonl
  summarizes to, its result reads groups back from disk, and a resume streams the saved file.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import random
import statistics
import weakref
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from workbench.engine import run_rollouts
from workbench.engine.difficulty import run_verdict
from workbench.engine.summary import RunningSummary, pass_at_k, std_bucket, summarize
from workbench.envs import load_environment
from workbench.inference.echo import EchoClient
from workbench.store.results import read_groups
from workbench.types import Completion, Group, Rollout, RolloutError, SamplingParams


def _server_errors(failed: Sequence[Group]) -> list[dict[str, Any]]:
    """The first 3 distinct failed-call messages met, with their counts, the most frequent first."""
    counts: dict[str, int] = {}
    for r in (r for g in failed for r in g.rollouts if r.error is not None and r.error.infrastructure):
        if r.error.message in counts or len(counts) < 3:
            counts[r.error.message] = counts.get(r.error.message, 0) + 1
    return [
        {"message": m, "count": c} for m, c in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    ]


def reference_summarize(groups: Sequence[Group], elapsed_s: float | None = None) -> dict[str, Any]:
    """`summarize` as it was before issue 19: every rollout in memory at once."""
    failed = [g for g in groups if g.infrastructure_failures]
    groups = [g for g in groups if not g.infrastructure_failures]
    rollouts = [r for g in groups for r in g.rollouts]
    lost = (
        {
            "infrastructure_failures": sum(g.infrastructure_failures for g in failed),
            "incomplete_groups": len(failed),
            "server_errors": _server_errors(failed),
        }
        if failed
        else {}
    )
    if not rollouts:
        return {"num_groups": 0, "num_rollouts": 0, **lost}
    rewards = [r.reward for r in rollouts]
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards)
    per_func: dict[str, list[float]] = {}
    for r in rollouts:
        for name, value in {**r.rewards, **r.metrics}.items():
            per_func.setdefault(name, []).append(value)
    group_stds = [g.std for g in groups]
    zero_var = sum(s < 1e-9 for s in group_stds)
    buckets = Counter(std_bucket(s) for s in group_stds)
    ordered = sorted(group_stds)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]

    summary: dict[str, Any] = {
        "num_groups": len(groups),
        "num_rollouts": len(rollouts),
        "reward_mean": mean,
        "reward_std": std,
        "reward_funcs": {name: statistics.fmean(values) for name, values in per_func.items()},
        "group_std_mean": statistics.fmean(group_stds),
        "group_std_quantiles": {"p10": q(0.1), "p50": q(0.5), "p90": q(0.9), "max": ordered[-1]},
        "group_std_histogram": dict(buckets),
        "zero_variance_frac": zero_var / len(groups),
        "verdict": run_verdict(mean),
        "prompt_tokens_mean": statistics.fmean(r.usage.get("prompt_tokens", 0) for r in rollouts),
        "completion_tokens_mean": statistics.fmean(r.usage.get("completion_tokens", 0) for r in rollouts),
        "num_turns_mean": statistics.fmean(r.num_turns for r in rollouts),
        "truncated_frac": sum(r.is_truncated for r in rollouts) / len(rollouts),
        "errors": sum(r.error is not None for r in rollouts),
        "error_types": dict(Counter(f"{r.error.where}:{r.error.type}" for r in rollouts if r.error)),
    }
    # issue 34: avg@k and pass@k for any rewards (correct: reward >= 0.5); pass@k over the groups
    # with at least k rollouts, for k = 1, 2, 4, ... and n (the most common group size)
    sizes = Counter(len(g.rollouts) for g in groups)
    n = sizes.most_common(1)[0][0]
    summary["avg_at_k"] = {f"avg@{n}": statistics.fmean(g.mean for g in groups)}
    summary["pass_at_k"] = {
        f"pass@{k}": statistics.fmean(
            pass_at_k(len(g.rollouts), sum(r >= 0.5 for r in g.rewards), k)
            for g in groups
            if len(g.rollouts) >= k
        )
        for k in sorted({*(2**i for i in range(n.bit_length())), n})
    }
    summary["pass_threshold"] = 0.5
    if elapsed_s is not None:
        summary["elapsed_s"] = elapsed_s
    return {**summary, **lost}


def random_groups(rng: random.Random, n: int, *, binary: bool) -> list[Group]:
    """Groups with everything the summary looks at varying: sizes, reward functions that only some
    tasks have, errors (some of them server failures), tokens, turns, truncation."""
    groups = []
    for example_id in rng.sample(range(10 * n), n):
        size = rng.choice((4, 4, 4, 3, 8))
        rollouts = []
        for index in range(size):
            if binary:
                reward = float(rng.random() < 0.4)
            else:
                reward = rng.choice((0.0, 1.0, rng.random(), rng.random() * 1e-9, rng.uniform(-3, 3), 1 / 3))
            funcs = {"correct": reward, f"task_{example_id % 3}": rng.random()}
            metrics = {"format": rng.choice((0.0, 0.5, 1.0, 0.1)), "len": float(rng.randrange(100))}
            if rng.random() < 0.2:
                metrics["correct"] = rng.random()  # a name in both: its rewards position, its metrics value
            error = None
            if rng.random() < 0.05:
                where, infra = rng.choice(
                    (("reward", False), ("env", False), ("inference", True), ("inference", False))
                )
                error = RolloutError(
                    type=rng.choice(("ValueError", "KeyError", "HTTP")),
                    message="x",
                    where=where,
                    infrastructure=infra,
                )
            rollouts.append(
                Rollout(
                    example_id=example_id,
                    rollout_index=index,
                    prompt=[],
                    reward=reward,
                    rewards=funcs,
                    metrics=metrics,
                    num_turns=rng.randrange(1, 5),
                    is_truncated=rng.random() < 0.1,
                    error=error,
                    usage={"prompt_tokens": rng.randrange(1000), "completion_tokens": rng.randrange(500)},
                )
            )
        groups.append(Group(example_id, rollouts))
    return groups


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("fold", [4096, 5])
def test_running_summary_equals_the_in_memory_summary(
    seed: int, binary: bool, fold: int, monkeypatch: pytest.MonkeyPatch
):
    from workbench.engine import summary

    monkeypatch.setattr(summary._ExactSum, "FOLD", fold)  # 5: the exact sums fold all along
    rng = random.Random(seed)
    groups = random_groups(rng, rng.choice((1, 5, 60, 300)), binary=binary)
    by_id = sorted(groups, key=lambda g: g.example_id)
    expected = reference_summarize(by_id, 12.5)
    assert summarize(by_id, 12.5) == expected
    assert json.dumps(summarize(by_id, 12.5)) == json.dumps(expected)  # key order and every digit
    running = RunningSummary()
    arrival = groups[:]
    rng.shuffle(arrival)  # groups finish in any order; the summary is of the run sorted by example
    for group in arrival:
        running.add(group, order=group.example_id)
    assert json.dumps(running.summary(12.5)) == json.dumps(expected)


def test_running_summary_edge_cases():
    empty = RunningSummary()
    assert empty.summary(3.0) == reference_summarize([], 3.0) == {"num_groups": 0, "num_rollouts": 0}
    server_down = Group(
        0, [Rollout(0, 0, [], error=RolloutError("E", "m", "inference", infrastructure=True))]
    )
    assert summarize([server_down]) == reference_summarize([server_down])
    one = Group(5, [Rollout(5, 0, [], reward=0.7)])
    assert json.dumps(summarize([one])) == json.dumps(reference_summarize([one]))
    tiny = [
        Group(i, [Rollout(i, j, [], reward=v) for j, v in enumerate(values)])
        for i, values in enumerate(
            [(1e-300, 5e-324, 1e150), (0.1, 0.2, 0.3), (2**60, 1.0, -(2**60)), (1e16, 1.0, -1e16)]
        )
    ]
    assert json.dumps(summarize(tiny)) == json.dumps(reference_summarize(tiny))
    odd = [
        Group(0, [Rollout(0, 0, [], reward=math.inf), Rollout(0, 1, [], reward=1.0)])
    ]  # statistics raises here
    assert summarize(odd)["reward_mean"] == math.inf and math.isnan(summarize(odd)["reward_std"])


def test_running_summary_memory_does_not_grow_with_rollouts():
    """What a RunningSummary holds grows by one float per group (its std, for the quantiles), not
    with the rollouts: 15x the groups of 16 rollouts each costs next to nothing more."""
    import tracemalloc

    rng = random.Random(0)

    def held_after(groups: int) -> int:
        running = RunningSummary()
        tracemalloc.start()
        for example_id in range(groups):
            running.add(
                Group(
                    example_id,
                    [
                        Rollout(
                            example_id,
                            i,
                            [{"role": "user", "content": "x" * 200}],
                            reward=rng.random(),
                            rewards={"a": rng.random(), "b": rng.random()},
                            metrics={"m": rng.random()},
                            usage={
                                "prompt_tokens": rng.randrange(500),
                                "completion_tokens": rng.randrange(500),
                            },
                        )
                        for i in range(16)
                    ],
                ),
                order=example_id,
            )
        assert running.summary()["num_rollouts"] == 16 * groups  # (folds what waits in the buffers)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return held

    small, large = held_after(100), held_after(1_500)
    per_group = (large - small) / 1_400
    assert per_group < 32, f"{per_group:.0f} bytes per group of 16 rollouts"


def reverse_text(n: int):
    from workbench.envs import Parser

    env = load_environment("reverse-text", num_eval_examples=n)
    env.rubric.parser = Parser()  # EchoClient answers with the bare reversal
    return env


def test_engine_keeps_no_finished_group_and_bounds_what_is_in_flight():
    """Each group handed over is free once the caller lets go of it, and the engine never holds more
    than a few groups' worth of rollouts, however many examples it is given."""
    in_flight = peak = 0

    class Counting(EchoClient):
        async def chat(self, messages, *, sampling, tools=None) -> list[Completion]:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0)
            in_flight -= 1
            return await super().chat(messages, sampling=sampling, tools=tools)

    env = reverse_text(300)
    refs: list[weakref.ref] = []
    tasks_seen: list[int] = []

    def on_group(group: Group) -> None:
        refs.append(weakref.ref(group.rollouts[0]))
        tasks_seen.append(len(asyncio.all_tasks()))

    stats = asyncio.run(
        run_rollouts(
            env,
            Counting(),
            env.get_examples(300),
            rollouts_per_example=4,
            sampling=SamplingParams(max_tokens=64),
            max_concurrent=8,
            on_group=on_group,
        )
    )
    assert stats.groups == 300 and stats.errors == 0 and peak <= 8
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 0  # every finished rollout is gone
    # tasks alive at any time: the run, its group workers and their rollouts (8 slots, 4 per group:
    # 3 groups of 4 plus the workers), not one per example
    assert max(tasks_seen) <= 1 + 3 + 3 * 4


def test_eval_streams_groups_and_keeps_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, young_heap: None
):
    """`run_eval`'s summary is the summary of what it wrote; the groups it hands the reporter are
    freed as it goes; its result reads groups back from results.jsonl on demand."""
    from workbench.evaluate import EvalConfig, run_eval
    from workbench.events import NullReporter

    monkeypatch.chdir(tmp_path)
    refs: list[weakref.ref] = []

    class Watching(NullReporter):
        def group_done(self, group: Group, stats: dict[str, Any]) -> None:
            refs.append(weakref.ref(group))
            gc.collect()
            self.alive = sum(ref() is not None for ref in refs)
            self.most = max(getattr(self, "most", 0), self.alive)

    reporter = Watching()
    config = EvalConfig(
        env_id="reverse-text", model="echo", num_examples=40, rollouts_per_example=3, max_concurrent=4
    )
    result = run_eval(config, reporter, client=EchoClient())
    assert result.status == "finished" and len(refs) == 40
    assert reporter.most <= 4  # the group being reported, and the few in flight
    saved = sorted(read_groups(result.run_dir, 3), key=lambda g: g.example_id)
    expected = summarize(saved, result.summary["elapsed_s"])
    assert json.dumps(result.summary) == json.dumps(expected)
    metadata = json.loads((result.run_dir / "metadata.json").read_text())
    assert metadata["summary"] == json.loads(json.dumps(expected)) and metadata["completed_rollouts"] == 120
    assert [g.example_id for g in result.groups] == list(range(40))  # read back from disk, by example
    assert [r.reward for g in result.groups for r in g.rollouts] == [
        r.reward for g in saved for r in g.rollouts
    ]


def test_resume_streams_the_saved_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A resumed run keeps the complete groups it finds (a partial or server-failed one is redone)
    and its summary covers the old groups and the new ones exactly."""
    from workbench.evaluate import EvalConfig, run_eval

    monkeypatch.chdir(tmp_path)
    config = EvalConfig(env_id="reverse-text", model="echo", num_examples=12, rollouts_per_example=2)
    first = run_eval(config, client=EchoClient())
    path = first.run_dir / "results.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    keep = [line for line, rec in zip(lines, records, strict=True) if rec["example_id"] < 6]
    failed = [json.loads(line) for line in lines if json.loads(line)["example_id"] == 7]
    for rec in failed:
        rec["error"] = {"type": "HTTP", "message": "503", "where": "inference", "infrastructure": True}
        rec["reward"] = 0.0
    partial = [line for line in lines if json.loads(line)["example_id"] == 9][:1]
    path.write_bytes(
        b"".join(keep) + b"".join(json.dumps(r).encode() + b"\n" for r in failed) + b"".join(partial)
    )
    meta = json.loads((first.run_dir / "metadata.json").read_text())
    meta["status"] = "stopped"
    (first.run_dir / "metadata.json").write_text(json.dumps(meta))

    resumed = run_eval(config, resume=str(first.run_dir), client=EchoClient())
    assert resumed.status == "finished"
    saved = read_groups(resumed.run_dir, 2)
    assert sorted(g.example_id for g in saved) == list(range(12))  # each example once, complete
    assert [json.loads(line)["example_id"] for line in path.read_bytes().splitlines()][:12] == [
        rec["example_id"] for rec in records if rec["example_id"] < 6
    ]  # the kept groups first, as they were
    expected = summarize(sorted(saved, key=lambda g: g.example_id), resumed.summary["elapsed_s"])
    assert json.dumps(resumed.summary) == json.dumps(expected)


def test_eval_examples_are_made_lazily_and_match_get_examples():
    from workbench.evaluate.service import LazyExamples, eval_examples

    env = load_environment("reverse-text", num_eval_examples=30)
    for n, offset in ((10, 0), (10, 25), (-1, 5), (100, 0), (5, 40)):
        lazy = eval_examples(env, n, offset)
        assert isinstance(lazy, LazyExamples)
        expected = env.get_examples(n, split="eval", offset=offset)
        assert len(lazy) == len(expected) and list(lazy) == expected
        if expected:
            assert lazy[-1] == expected[-1] and lazy[1:3] == expected[1:3]

    class OwnExamples(type(env)):  # an env that makes its own examples keeps its list
        def get_examples(self, n=-1, split="eval", offset=0):
            return super().get_examples(n, split, offset)[:2]

    env.__class__ = OwnExamples
    assert eval_examples(env, 10, 0) == env.get_examples(10)
