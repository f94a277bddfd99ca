"""Synthetic reverse-text demonstrations for tests and benchmarks.

The real demonstrations come from the bundled environments; this stand-in (same system
prompt and answer format as the reverse-text environment) lets the model builder, the
LocalClient tests and the generation benchmark build a model without importing them.
"""

from __future__ import annotations

import random

from workbench.types import Messages

REVERSE_SYSTEM_PROMPT = "Reverse the text character by character. Put your answer in <reversed_text> tags."

_WORDS = (
    "the quick brown fox jumps over lazy dog river stone cloud apple green light music paper "
    "window garden silver ocean market yellow tiger planet winter summer candle bridge forest "
    "orange purple castle dragon"
).split()


def random_phrase(rng: random.Random, min_chars: int = 5, max_chars: int = 40) -> str:
    """A few words joined by spaces, `min_chars`..`max_chars` long."""
    while True:
        phrase = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6)))
        if min_chars <= len(phrase) <= max_chars:
            return phrase


def reverse_text_demonstrations(count: int, seed: int = 0) -> list[Messages]:
    """`count` seeded system/user/assistant conversations answering with the reversed phrase."""
    rng = random.Random(seed)
    demos: list[Messages] = []
    for _ in range(count):
        phrase = random_phrase(rng)
        demos.append(
            [
                {"role": "system", "content": REVERSE_SYSTEM_PROMPT},
                {"role": "user", "content": phrase},
                {"role": "assistant", "content": f"<reversed_text>\n{phrase[::-1]}\n</reversed_text>"},
            ]
        )
    return demos
