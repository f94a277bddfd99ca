"""Synthetic reverse-text rollouts for the TUI benchmarks (`tui_open_run.py`, `tui_variance.py`):
one record as an eval writes it, about 1.5 KB, built with the project's own `Rollout`."""

from __future__ import annotations

import random
from typing import Any

WORDS = "apple river stone cloud green quiet light table paper music bread water night house".split()


def random_text(rng: random.Random, words: int = 30) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def reverse_text_rollout(
    example_id: int, index: int, text: str, *, reward: float, error: Any, rng: random.Random
) -> Any:
    """One scored rollout of `text` (truncated 5% of the time, by `rng`)."""
    from workbench.types import Rollout

    return Rollout(
        example_id,
        index,
        prompt=[
            {"role": "system", "content": "Reverse the text character by character. " * 4},
            {"role": "user", "content": text},
        ],
        completion=[{"role": "assistant", "content": f"<reversed_text>{text[::-1]}</reversed_text>"}],
        answer=text[::-1],
        reward=reward,
        rewards={"lcs_reward": reward},
        metrics={"format_reward": 1.0},
        num_turns=1,
        is_truncated=rng.random() < 0.05,
        stop_condition="completed",
        error=error,
        usage={"prompt_tokens": 250, "completion_tokens": 200},
        timing={"total_ms": 12.5},
    )
