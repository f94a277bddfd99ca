"""Is B better than A? The mean reward difference of two evaluations of the *same* examples, with a
confidence interval from a paired bootstrap over examples.

Pairing matters: examples differ far more in difficulty than two prompts differ in quality, so
comparing each example with itself (B's group mean minus A's) removes that spread and a small
gain shows up with a few dozen examples. Resampling examples (not rollouts) keeps each
example's rollouts together, since they are not independent of each other.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RESAMPLES = 2000  # bootstrap resamples: the interval's ends move by well under 0.01 past this


@dataclass(frozen=True)
class PairedDifference:
    n: int  # examples in both evaluations
    mean_a: float
    mean_b: float
    low: float  # the interval for mean(B - A)
    high: float
    confidence: float

    @property
    def diff(self) -> float:
        return self.mean_b - self.mean_a

    @property
    def verdict(self) -> str:
        """'better' / 'worse' when the interval excludes 0, else 'no clear difference'."""
        if self.low > 0:
            return "better"
        if self.high < 0:
            return "worse"
        return "no clear difference"


def paired_difference(
    a: Mapping[int, float],
    b: Mapping[int, float],
    *,
    confidence: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> PairedDifference:
    """Mean of B − A over the examples both have (`{example_id: group mean reward}`), and its
    percentile-bootstrap interval. ValueError when they share no example."""
    shared = sorted(set(a) & set(b))
    if not shared:
        raise ValueError("the two evaluations share no example")
    diffs = [b[i] - a[i] for i in shared]
    n = len(diffs)
    low, high = mean_interval(diffs, confidence=confidence, resamples=resamples, seed=seed)
    return PairedDifference(
        n=n,
        mean_a=sum(a[i] for i in shared) / n,
        mean_b=sum(b[i] for i in shared) / n,
        low=low,
        high=high,
        confidence=confidence,
    )


def mean_interval(
    values: Sequence[float], *, confidence: float = 0.95, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of `values` (one per example: an example's rollouts
    stay together). ValueError for no values."""
    if not values:
        raise ValueError("no values to resample")
    n = len(values)
    rng = random.Random(seed)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    return means[int(tail * (resamples - 1))], means[int((1 - tail) * (resamples - 1))]
