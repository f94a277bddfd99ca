"""The example datasets `load_example_dataset` knows: each one's default split and how one raw row
(as the Hugging Face hub has it) becomes `{"question", "answer"}`, the shape verifiers gives them.

Kept apart from data_utils.py so the public helpers stay short; nothing here reads files.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.envs.math_answers import extract_boxed

Row = dict[str, Any]


def hash_answer(text: str) -> str:
    """GSM8K's final answer: what follows `####` (the whole text when there is none)."""
    return text.split("####")[1].strip() if "####" in text else text


def boxed_answer(text: str, strict: bool = False) -> str:
    """The last `\\boxed{...}`'s content; when there is none: '' if `strict`, else `text` itself."""
    boxed = extract_boxed(text)
    if boxed is None:
        return "" if strict else text
    return boxed


def _lettered(question: str, options: list[str]) -> str:
    """`Question: ...`, a blank line, then one `A: option` line per option."""
    lines = [f"{letter}: {option}" for letter, option in zip(string.ascii_uppercase, options, strict=False)]
    return f"Question: {question}\n\n" + "\n".join(lines)


def _gpqa(row: Row, rng: random.Random) -> Row:
    """The four GPQA answers in a seeded random order; the answer is the correct one's letter."""
    answers = [
        row["Correct Answer"],
        row["Incorrect Answer 1"],
        row["Incorrect Answer 2"],
        row["Incorrect Answer 3"],
    ]
    order = list(range(4))
    rng.shuffle(order)  # order[k] = which answer is shown as letter k
    shown = [answers[i] for i in order]
    return {"question": _lettered(row["Question"], shown), "answer": "ABCD"[order.index(0)]}


def _mmlu(row: Row, _: random.Random) -> Row:
    return {
        "question": _lettered(row["question"], list(row["choices"])),
        "answer": "ABCD"[int(row["answer"])],
    }


def _openbookqa(row: Row, _: random.Random) -> Row:
    choices = "\n".join(
        f"{label}. {text}"
        for label, text in zip(row["choices"]["label"], row["choices"]["text"], strict=True)
    )
    return {
        "question": f"Question: {row['question_stem']}\n\nChoices:\n{choices}",
        "answer": row["answerKey"],
    }


def _fields(question: str, answer: str) -> Callable[[Row, random.Random], Row]:
    """A row mapped by renaming two columns."""
    return lambda row, _: {"question": row[question], "answer": row[answer]}


@dataclass(frozen=True)
class ExampleDataset:
    """One known dataset: where it comes from on the hub (for the hint), its default split, how to
    turn a raw row into a question/answer row, and which raw rows to keep."""

    hub_id: str
    default_split: str
    preprocess: Callable[[Row, random.Random], Row]
    keep: Callable[[Row], bool] = lambda row: True


PYTHON_PROMPT = "Solve the following coding problem using the programming language python:"

EXAMPLE_DATASETS: dict[str, ExampleDataset] = {
    "aime2024": ExampleDataset(
        "HuggingFaceH4/aime_2024",
        "train",
        lambda row, _: {"question": row["problem"], "answer": str(int(row["answer"]))},
    ),
    "aime2025": ExampleDataset(
        "opencompass/AIME2025 (AIME2025-I and AIME2025-II)",
        "test",
        lambda row, _: {
            "question": row["question"],
            "answer": "".join(c for c in str(row["answer"]) if c.isdigit() or c == "."),
        },
    ),
    "amc2023": ExampleDataset("knoveleng/AMC-23", "train", _fields("problem", "answer")),
    "gpqa_diamond": ExampleDataset("Idavidrein/gpqa (gpqa_diamond)", "train", _gpqa),
    "gpqa_main": ExampleDataset("Idavidrein/gpqa (gpqa_main)", "train", _gpqa),
    "gsm8k": ExampleDataset(
        "openai/gsm8k (main)",
        "test",
        lambda row, _: {"question": row["question"], "answer": hash_answer(row["answer"])},
    ),
    "math": ExampleDataset(
        "chiayewken/competition_math",
        "train",
        lambda row, _: {"question": row["problem"], "answer": boxed_answer(row["solution"])},
    ),
    "math500": ExampleDataset("HuggingFaceH4/MATH-500", "test", _fields("problem", "answer")),
    "mmlu": ExampleDataset("cais/mmlu (all)", "dev", _mmlu),
    "mmlu_pro": ExampleDataset(
        "TIGER-Lab/MMLU-Pro",
        "validation",
        lambda row, _: {
            "question": _lettered(row["question"], list(row["options"])),
            "answer": row["answer"],
        },
    ),
    "openbookqa": ExampleDataset("allenai/openbookqa (main)", "train", _openbookqa),
    "openrs": ExampleDataset("knoveleng/open-rs", "train", _fields("problem", "answer")),
    "openrs_easy": ExampleDataset(
        "knoveleng/open-rs",
        "train",
        _fields("problem", "answer"),
        keep=lambda row: row.get("level") == "Easy",
    ),
    "openrs_hard": ExampleDataset(
        "knoveleng/open-rs",
        "train",
        _fields("problem", "answer"),
        keep=lambda row: row.get("level") == "Hard",
    ),
    "prime_code": ExampleDataset(
        "PrimeIntellect/verifiable-coding-problems",
        "train",
        _fields("prompt", "verification_info"),
        keep=lambda row: str(row.get("prompt", "")).startswith(PYTHON_PROMPT),
    ),
}
