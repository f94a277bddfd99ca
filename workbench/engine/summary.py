"""Reward statistics of a set of scored groups: what `eval run` prints, `eval show` reads and the
TUI's variance view shows.

The point of an eval here is to decide whether an environment is ready for RL, so besides the
mean reward it reports how rewards vary *inside* groups: RL learns only from groups whose
rollouts disagree.

It also reports the numbers prime-rl and verifiers log for an eval with k rollouts per example:
avg@k, the mean over examples of the mean reward of their k rollouts, and pass@k, the chance
that at least one of k rollouts of an example is correct (unbiased estimator from the example's
n rollouts; for k = n the share of examples with a correct rollout). A rollout is correct when
its reward is at least the environment's `pass_threshold` (verifiers' rule and default, 0.5):
for 0/1 rewards exactly the rollouts that scored 1, as prime-rl counts them.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

from workbench.engine.difficulty import SIGNAL_STD, run_verdict
from workbench.types import Group

# Within-group std bucket edges for the distribution line; a std of 0 teaches RL nothing.
STD_EDGES = (SIGNAL_STD, 0.1, 0.2, 0.3)
# A rollout counts as correct for pass@k from this reward up: verifiers' Environment.pass_threshold
# default (an environment may set its own), which for 0/1 rewards counts exactly the 1s.
DEFAULT_PASS_THRESHOLD = 0.5
MAX_SERVER_ERRORS = 3  # distinct failed-call messages kept for the summary (a bad key repeats one)


def std_bucket(std: float) -> str:
    if std < 1e-9:
        return "0"
    lower = "0"
    for edge in STD_EDGES:
        if std < edge:
            return f"{lower}-{edge:g}"
        lower = f"{edge:g}"
    return f">={lower}"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021): chance that k of n samples include a pass.
    Defined for k <= n only (a group of 3 says nothing about 4 tries)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def at_k_totals(groups: Sequence[Group], k: int, pass_threshold: float) -> list[float]:
    """What avg@k and pass@k of `groups` (k rollouts each) are made of, as sums that add up over
    shards: [sum of group mean rewards, groups, sum of pass@k estimates, groups with >= k rollouts].
    avg@k = first / second, pass@k = third / fourth."""
    scored = [g for g in groups if g.rollouts]
    full = [g for g in scored if len(g.rollouts) >= k]
    return [
        math.fsum(g.mean for g in scored),
        len(scored),
        math.fsum(pass_at_k(len(g.rollouts), correct(g, pass_threshold), k) for g in full),
        len(full),
    ]


def correct(group: Group, pass_threshold: float) -> int:
    """How many of the group's rollouts are correct (reward >= pass_threshold)."""
    return sum(r.reward >= pass_threshold for r in group.rollouts)


def summarize(
    groups: Sequence[Group], elapsed_s: float | None = None, pass_threshold: float = DEFAULT_PASS_THRESHOLD
) -> dict[str, Any]:
    """Statistics of the groups that are results. A group with a rollout whose model call failed
    (no answer after retries, a 4xx such as a bad key, a 5xx, a malformed reply) is none: it is
    counted apart with the server's first distinct messages, never as a 0 reward.
    (The same numbers as adding each group to a `RunningSummary`, in this order.)"""
    running = RunningSummary(pass_threshold)
    for group in groups:
        running.add(group)
    return running.summary(elapsed_s)


class _ExactSum:
    """The exact sum of many floats, whatever order they come in: `total()` is what `math.fsum` of
    all of them gives (the correctly rounded sum). Values are appended to `buffer` (all that is
    paid per value) and folded, every FOLD values, into integer numerators by (power of two)
    denominator, so memory stays bounded. With `squares`, the sum of squares too (for `pstdev`)."""

    FOLD = 4096

    __slots__ = ("buffer", "folded", "partials", "square_partials", "special")

    def __init__(self, squares: bool = False) -> None:
        self.buffer = array("d")  # converts as fsum does: an int to the nearest float
        self.folded = 0
        self.partials: dict[int, int] = defaultdict(int)
        self.square_partials: dict[int, int] | None = defaultdict(int) if squares else None
        self.special: float | None = None  # the sum of the infinities and NaNs seen

    @property
    def count(self) -> int:
        return self.folded + len(self.buffer)

    def add(self, value: float, times: int = 1) -> None:
        """Add `value` (`times` times over)."""
        self._fold([(float(value), times)])

    def fold(self) -> None:
        """Move the buffered values into the exact partials (a value met again costs nothing)."""
        if self.buffer:
            buffer, self.buffer = self.buffer, array("d")
            self._fold(Counter(buffer).items())

    def _fold(self, counted: Iterable[tuple[float, int]]) -> None:
        partials, squares = self.partials, self.square_partials
        for value, times in counted:
            self.folded += times
            try:
                n, d = value.as_integer_ratio()
            except (OverflowError, ValueError):  # inf or nan
                for _ in range(times):
                    self.special = value if self.special is None else self.special + value
                continue
            partials[d] += n * times
            if squares is not None:
                squares[d] += n * n * times

    def _exact(self) -> tuple[int, int]:
        """(numerator, denominator) of the exact sum."""
        self.fold()
        denominator = max(self.partials, default=1)
        return sum(n * (denominator // d) for d, n in self.partials.items()), denominator

    def total(self) -> float:
        numerator, denominator = self._exact()
        if self.special is not None:
            return self.special
        return numerator / denominator  # int division rounds correctly

    def mean(self) -> float:
        """`statistics.fmean` of the values (fsum / count)."""
        return self.total() / self.count

    def pstdev(self) -> float:
        """`statistics.pstdev` of the values: the correctly rounded square root of the exact
        population variance (nan where a value is not finite; statistics raises there)."""
        assert self.square_partials is not None
        sx = Fraction(*self._exact())
        if self.special is not None:
            return math.nan
        denominator = max(self.square_partials, default=1)
        sxx = Fraction(
            sum(n * (denominator // d) ** 2 for d, n in self.square_partials.items()), denominator**2
        )
        variance = (self.count * sxx - sx * sx) / self.count / self.count
        return _float_sqrt_of_frac(variance.numerator, variance.denominator)


_SQRT_BIT_WIDTH = 2 * sys.float_info.mant_dig + 3


def _float_sqrt_of_frac(n: int, m: int) -> float:
    """Square root of n/m as a float, correctly rounded (as `statistics` computes it)."""
    q = (n.bit_length() - m.bit_length() - _SQRT_BIT_WIDTH) // 2
    if q >= 0:
        numerator, denominator = _isqrt_frac_rto(n, m << 2 * q) << q, 1
    else:
        numerator, denominator = _isqrt_frac_rto(n << -2 * q, m), 1 << -q
    return numerator / denominator


def _isqrt_frac_rto(n: int, m: int) -> int:
    """Square root of n/m, rounded to an integer using round-to-odd."""
    a = math.isqrt(n // m)
    return a | (a * a * m != n)


class _FirstSeen:
    """Counts by key, whose keys come out in the order `summarize` first met them when it walked
    the groups in their sort order, however the groups arrived."""

    __slots__ = ("first",)

    def __init__(self) -> None:
        self.first: dict[Any, tuple[Any, ...]] = {}

    def see(self, key: Any, position: tuple[Any, ...]) -> None:
        if key not in self.first or position < self.first[key]:
            self.first[key] = position

    def ordered(self) -> list[Any]:
        return sorted(self.first, key=self.first.__getitem__)


class RunningSummary:
    """`summarize` as running aggregates: add groups as they finish (and drop them); `summary()`
    gives exactly what `summarize` gives for the same groups sorted by the `order` they were
    added with (their arrival, when not given; ties keep arrival order). Memory grows with the
    number of groups by one float (each group's std, for its quantiles), not with the rollouts.

    Every mean is an exact sum (so the order groups finish in changes no digit), and the dicts
    whose key order depends on what was met first (per-function means, std histogram, error
    types) keep the position where each key first appears."""

    def __init__(self, pass_threshold: float = DEFAULT_PASS_THRESHOLD) -> None:
        self.pass_threshold = pass_threshold  # a rollout with at least this reward is correct (pass@k)
        self._seq = 0
        self.groups = 0  # result groups (no server failure)
        self.rollouts = 0
        self.failed_groups = 0
        self.infrastructure_failures = 0
        self.server_errors: Counter[str] = Counter()  # the first distinct failed-call messages
        self.rewards = _ExactSum(squares=True)
        self.funcs: dict[str, _ExactSum] = {}
        self._func_order = _FirstSeen()
        self.group_stds = array("d")
        self.zero_variance = 0
        self.buckets: Counter[str] = Counter()
        self._bucket_order = _FirstSeen()
        self.prompt_tokens = _ExactSum()
        self.completion_tokens = _ExactSum()
        self.turns = _ExactSum()
        self.truncated = 0
        self.errors = 0
        self.error_types: Counter[str] = Counter()
        self._error_order = _FirstSeen()
        self.group_sizes: Counter[int] = Counter()
        self._size_order = _FirstSeen()
        self.passes: Counter[tuple[int, int]] = Counter()  # (rollouts, correct rollouts) per group
        self.group_means = _ExactSum()  # avg@k: the mean of the groups' mean rewards

    def add(self, group: Group, order: Any = None) -> None:
        self._seq += 1
        rollouts = group.rollouts
        if failures := group.infrastructure_failures:
            self.failed_groups += 1
            self.infrastructure_failures += failures
            for r in rollouts:
                if r.error is not None and r.error.infrastructure:
                    message = r.error.message
                    if message in self.server_errors or len(self.server_errors) < MAX_SERVER_ERRORS:
                        self.server_errors[message] += 1
            return
        key: tuple[Any, ...] = (self._seq if order is None else order, self._seq)
        self.groups += 1
        self.rollouts += len(rollouts)
        rewards, funcs = self.rewards.buffer, self.funcs
        prompt_tokens, completion_tokens, turns = (
            self.prompt_tokens.buffer,
            self.completion_tokens.buffer,
            self.turns.buffer,
        )
        first: dict[str, tuple[int, int]] = {}  # where this group first has each function
        for i, r in enumerate(rollouts):
            rewards.append(r.reward)
            for j, (name, value) in enumerate(
                ({**r.rewards, **r.metrics} if r.metrics else r.rewards).items()
            ):
                if (values := funcs.get(name)) is None:
                    values = funcs[name] = _ExactSum()
                values.buffer.append(value)
                if name not in first:
                    first[name] = (i, j)
            usage = r.usage
            prompt_tokens.append(usage.get("prompt_tokens", 0))
            completion_tokens.append(usage.get("completion_tokens", 0))
            turns.append(r.num_turns)
            self.truncated += r.is_truncated
            if r.error is not None:
                self.errors += 1
                error_type = f"{r.error.where}:{r.error.type}"
                self.error_types[error_type] += 1
                self._error_order.see(error_type, (*key, i))
        for name, position in first.items():
            self._func_order.see(name, (*key, *position))
        std = group.std
        self.group_stds.append(std)
        self.zero_variance += std < 1e-9
        bucket = std_bucket(std)
        self.buckets[bucket] += 1
        self._bucket_order.see(bucket, key)
        self.group_sizes[len(rollouts)] += 1
        self._size_order.see(len(rollouts), key)
        self.passes[len(rollouts), correct(group, self.pass_threshold)] += 1
        self.group_means.buffer.append(group.mean)
        if len(rewards) >= _ExactSum.FOLD:
            for values in (
                self.rewards,
                self.prompt_tokens,
                self.completion_tokens,
                self.turns,
                self.group_means,
                *funcs.values(),
            ):
                values.fold()

    def summary(self, elapsed_s: float | None = None) -> dict[str, Any]:
        lost = (
            {
                "infrastructure_failures": self.infrastructure_failures,
                "incomplete_groups": self.failed_groups,
                "server_errors": [  # the most frequent first
                    {"message": message, "count": count}
                    for message, count in sorted(
                        self.server_errors.items(), key=lambda item: (-item[1], item[0])
                    )
                ],
            }
            if self.failed_groups
            else {}
        )
        if not self.rollouts:
            return {"num_groups": 0, "num_rollouts": 0, **lost}
        mean = self.rewards.mean()
        summary: dict[str, Any] = {
            "num_groups": self.groups,
            "num_rollouts": self.rollouts,
            "reward_mean": mean,
            "reward_std": self.rewards.pstdev(),
            "reward_funcs": {name: self.funcs[name].mean() for name in self._func_order.ordered()},
            "group_std_mean": math.fsum(self.group_stds) / len(self.group_stds),
            "group_std_quantiles": _quantiles(self.group_stds),
            "group_std_histogram": {b: self.buckets[b] for b in self._bucket_order.ordered()},
            "zero_variance_frac": self.zero_variance / self.groups,
            "verdict": run_verdict(mean),
            "prompt_tokens_mean": self.prompt_tokens.mean(),
            "completion_tokens_mean": self.completion_tokens.mean(),
            "num_turns_mean": self.turns.mean(),
            "truncated_frac": self.truncated / self.rollouts,
            "errors": self.errors,
            "error_types": {t: self.error_types[t] for t in self._error_order.ordered()},
        }
        n = max(self._size_order.ordered(), key=self.group_sizes.__getitem__)  # the first of the most common
        summary["avg_at_k"] = {f"avg@{n}": self.group_means.mean()}
        summary["pass_at_k"] = {f"pass@{k}": self._pass_at(k) for k in ks(n)}
        summary["pass_threshold"] = self.pass_threshold
        if elapsed_s is not None:
            summary["elapsed_s"] = elapsed_s
        return {**summary, **lost}

    def _pass_at(self, k: int) -> float:
        """The mean over the groups with at least k rollouts of the pass@k estimate (each group
        has its own (n, c))."""
        total = _ExactSum()
        for (size, c), count in self.passes.items():
            if size >= k:
                total.add(pass_at_k(size, c, k), count)
        return total.mean()


def ks(n: int) -> list[int]:
    """The k of pass@k for groups of n: the powers of two up to n (as verifiers and prime-rl
    report them), and n itself (at least one correct among all of an example's rollouts)."""
    powers = [2**i for i in range(n.bit_length())]
    return powers if powers[-1] == n else [*powers, n]


def _quantiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]

    return {"p10": q(0.1), "p50": q(0.5), "p90": q(0.9), "max": ordered[-1]}
