"""reverse-text: reverse a short phrase character by character (single turn).

The answer goes in `<reversed_text>` tags; the reward is the longest-common-subsequence
similarity (difflib ratio) between the parsed answer and the true reversal, so partly right
answers earn partial credit — a smooth signal for RL. Data is synthetic, seeded and offline.
"""

from __future__ import annotations

import random
from difflib import SequenceMatcher

from workbench.envs import Parser, Rubric, SingleTurnEnv, XMLParser
from workbench.types import Example, Messages

SYSTEM_PROMPT = "Reverse the text character by character. Put your answer in <reversed_text> tags."

# 48 common words: phrases are new combinations of a small vocabulary, so a small model can
# partly learn the reversals and RL has room to improve them.
WORDS = (
    "apple river stone cloud green quiet light table paper music bread water night house smile "
    "dance field storm ocean tiger lemon candle forest garden window silver planet rocket winter "
    "summer yellow purple orange banana cherry violin guitar pencil rabbit turtle dragon castle "
    "bridge market sunset island desert valley"
).split()


def make_rows(n: int, seed: int, max_words: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max_words)))
        rows.append({"question": text, "answer": text[::-1]})
    return rows


def lcs_reward(completion: Messages, answer: str, parser: Parser) -> float:
    """Similarity of the parsed answer to the reversed text (0..1)."""
    parsed = parser.parse_answer(completion)
    if parsed is None:
        return 0.0
    return SequenceMatcher(None, parsed, answer).ratio()


class ReverseTextEnv(SingleTurnEnv):
    def reference_completion(self, example: Example) -> Messages:
        return [{"role": "assistant", "content": self.parser.format(reversed_text=example.answer)}]


def load_environment(
    num_train_examples: int = 2000,
    num_eval_examples: int = 200,
    max_words: int = 3,
    system_prompt: str = SYSTEM_PROMPT,
    few_shot: list[dict] | None = None,
    seed: int = 0,
) -> ReverseTextEnv:
    """num_train_examples/num_eval_examples: split sizes; max_words: phrase length (1..max_words
    words); system_prompt: the instruction (GEPA optimizes it); few_shot: few-shot turns shown
    before each question, as verifiers' few_shot; seed: data seed (eval uses seed+1)."""
    parser = XMLParser(["reversed_text"], answer_field="reversed_text")
    format_reward = parser.get_format_reward_func()
    rubric = Rubric([lcs_reward, format_reward], weights=[1.0, 0.0], parser=parser)
    return ReverseTextEnv(
        dataset=lambda: make_rows(num_train_examples, seed, max_words),
        eval_dataset=lambda: make_rows(num_eval_examples, seed + 1, max_words),
        system_prompt=system_prompt,
        few_shot=few_shot,
        parser=parser,
        rubric=rubric,
    )
