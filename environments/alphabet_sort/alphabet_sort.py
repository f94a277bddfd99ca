"""alphabet-sort: keep a sorted list of names over several turns (multi-turn).

Turn 1: the user sends a few names; the model answers with them sorted alphabetically inside
`<alphabetical_sorted>` tags, one per line. Each later turn adds more names and the model must
answer with the whole list, old and new, sorted again. Reward: per-turn similarity of the
answer to the correct list, averaged over the turns the example has. Seeded synthetic names.
"""

from __future__ import annotations

import random
from difflib import SequenceMatcher

from workbench.envs import MultiTurnEnv, Parser, Rubric, XMLParser
from workbench.types import Example, Messages, State

SYSTEM_PROMPT = (
    "Sort the names alphabetically, one per line, inside <alphabetical_sorted> tags. "
    "When more names arrive, answer with the whole list sorted again."
)

NAMES = (
    "Ada Ben Cal Dana Eli Fay Gus Hana Ivan Jo Kai Lea Max Nia Omar Pia Quin Rae Sam Tia Uma Vic "
    "Wes Xia Yara Zed Ava Bo Cy Dev Eve Finn Gil Hugo Ida Jay Kim Liv Mo Ned Ola Pax Rex Sol Tom "
    "Ugo Val Wil Yul Zoe"
).split()


def make_rows(n: int, seed: int, min_turns: int, max_turns: int, names_per_turn: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        turns = rng.randint(min_turns, max_turns)
        pool = rng.sample(NAMES, turns * names_per_turn)
        batches = [pool[i * names_per_turn : (i + 1) * names_per_turn] for i in range(turns)]
        rows.append(
            {
                "question": _user_message(batches[0], first=True),
                "answer": "\n".join(sorted(pool)),
                "info": {"batches": batches},
            }
        )
    return rows


def _user_message(names: list[str], first: bool) -> str:
    return ("Sort these names: " if first else "Add these names: ") + ", ".join(names)


def expected_lists(info: dict) -> list[list[str]]:
    """The correct sorted list after each turn."""
    seen: list[str] = []
    out = []
    for batch in info["batches"]:
        seen = seen + batch
        out.append(sorted(seen))
    return out


def sorted_similarity(completion: Messages, info: dict, parser: Parser) -> float:
    """Mean over the example's turns of the similarity of each answer to the correct list."""
    answers = [m for m in completion if m.get("role") == "assistant"]
    expected = expected_lists(info)
    total = 0.0
    for turn, target in enumerate(expected):
        if turn >= len(answers):
            break
        parsed = parser.parse_answer([answers[turn]])
        if parsed is not None:
            got = "\n".join(line.strip() for line in parsed.splitlines() if line.strip())
            total += SequenceMatcher(None, got, "\n".join(target)).ratio()
    return total / len(expected)


def turns_completed(completion: Messages, info: dict) -> float:
    """Share of the example's turns that the model answered (a metric)."""
    return min(1.0, sum(m.get("role") == "assistant" for m in completion) / len(info["batches"]))


class AlphabetSortEnv(MultiTurnEnv):
    async def is_completed(self, messages: Messages, state: State) -> bool:
        return state["turn"] >= len(state["info"]["batches"])

    async def env_response(self, messages: Messages, state: State) -> Messages:
        batch = state["info"]["batches"][state["turn"]]
        return [{"role": "user", "content": _user_message(batch, first=False)}]

    def reference_completion(self, example: Example) -> Messages:
        messages: Messages = []
        for turn, target in enumerate(expected_lists(example.info)):
            if turn:
                messages.append(
                    {"role": "user", "content": _user_message(example.info["batches"][turn], first=False)}
                )
            messages.append(
                {"role": "assistant", "content": self.parser.format(alphabetical_sorted="\n".join(target))}
            )
        return messages


def load_environment(
    num_train_examples: int = 2000,
    num_eval_examples: int = 200,
    min_turns: int = 1,
    max_turns: int = 3,
    names_per_turn: int = 2,
    system_prompt: str = SYSTEM_PROMPT,
    few_shot: list[dict] | None = None,
    seed: int = 0,
) -> AlphabetSortEnv:
    """min_turns/max_turns: turns per example (uniform); names_per_turn: names added each turn;
    system_prompt: the instruction (GEPA optimizes it); few_shot: few-shot turns shown before each
    question, as verifiers' few_shot; seed: data seed (eval uses seed+1)."""
    if not 1 <= min_turns <= max_turns:
        raise ValueError(
            f"need 1 <= min_turns <= max_turns, got min_turns={min_turns}, max_turns={max_turns}"
        )
    if max_turns * names_per_turn > len(NAMES):
        raise ValueError(f"max_turns * names_per_turn must be at most {len(NAMES)}")
    parser = XMLParser(["alphabetical_sorted"], answer_field="alphabetical_sorted")
    rubric = Rubric(
        [sorted_similarity, turns_completed, parser.get_format_reward_func()],
        weights=[1.0, 0.0, 0.0],
        parser=parser,
    )
    return AlphabetSortEnv(
        dataset=lambda: make_rows(num_train_examples, seed, min_turns, max_turns, names_per_turn),
        eval_dataset=lambda: make_rows(num_eval_examples, seed + 1, min_turns, max_turns, names_per_turn),
        system_prompt=system_prompt,
        few_shot=few_shot,
        parser=parser,
        rubric=rubric,
        max_turns=max_turns,
    )
