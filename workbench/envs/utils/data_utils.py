"""Dataset helpers at verifiers' path (`verifiers.utils.data_utils`): answer extractors, the
standard boxed-answer system prompts, and `load_example_dataset`, which reads local files.

verifiers' `load_example_dataset` downloads from the Hugging Face hub; Workbench runs offline, so
it reads the same rows from a local JSON-lines file instead:

    $WORKBENCH_DATA_DIR/<name>/<split>.jsonl     (when the variable is set)
    <workspace>/data/<name>/<split>.jsonl        (otherwise)

one hub row per line, with the hub's columns (GSM8K: `question`, `answer` ending in `#### n`; the
layout of `../shared/data/gsm8k/train.jsonl`). To make one on a machine with a connection:
`datasets.load_dataset("openai/gsm8k", "main", split="test").to_json("data/gsm8k/test.jsonl")`.
A missing file is a one-line error naming the path looked for.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.envs.utils.example_datasets import EXAMPLE_DATASETS, Row, boxed_answer, hash_answer

if TYPE_CHECKING:
    from datasets import Dataset

DATA_DIR_VAR = "WORKBENCH_DATA_DIR"

# The prompts verifiers ships, verbatim: environments written against them should see the same
# text (the run of spaces in the second is in verifiers' string too).
BOXED_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
THINK_BOXED_SYSTEM_PROMPT = (
    "Think step-by-step inside <think>...</think> tags.     Then, give your final answer inside \\boxed{}."
)


def extract_boxed_answer(text: str, strict: bool = False) -> str:
    """The content of the last `\\boxed{...}` (braces balanced). Without one: `text` unchanged, or
    '' when `strict` (for scoring, where a missing box must not pass as an answer)."""
    return boxed_answer(text, strict)


def extract_hash_answer(text: str) -> str:
    """GSM8K's final answer: the text after `####`, stripped (`text` unchanged when there is none)."""
    return hash_answer(text)


def example_data_dir() -> Path:
    """Where example datasets are read from: $WORKBENCH_DATA_DIR, else <workspace>/data."""
    from workbench.workspace import workspace_root

    configured = os.environ.get(DATA_DIR_VAR)
    return Path(configured).expanduser() if configured else workspace_root() / "data"


def read_jsonl_rows(path: Path) -> list[Row]:
    """The JSON objects of a JSON-lines file; ValueError naming file and line on a bad line."""
    rows: list[Row] = []
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not a JSON object ({exc})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def as_dataset(rows: list[Row]) -> Dataset | list[Row]:
    """A `datasets.Dataset` when the library is installed (environments call `.map`, `.select`,
    `.shuffle` on it), else the rows themselves. Imported here, never when Workbench starts."""
    try:
        from datasets import Dataset
    except ImportError:
        return rows
    return Dataset.from_list(rows)


def load_example_dataset(
    name: str = "gsm8k", split: str | None = None, n: int | None = None, seed: int = 0
) -> Dataset | list[Row]:
    """`{"question", "answer"}` rows of a known example dataset, read from a local file (see the
    module docstring). `split` defaults to the one verifiers uses for that dataset; `n` > 0 keeps a
    seeded random sample of `n` rows."""
    spec = EXAMPLE_DATASETS.get(name)
    if spec is None:
        raise ValueError(f"unknown example dataset '{name}' (known: {', '.join(sorted(EXAMPLE_DATASETS))})")
    split = split or spec.default_split
    path = example_data_dir() / name / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"example dataset '{name}' split '{split}' not found: no file {path} (one {spec.hub_id} row "
            f"per JSON line; set ${DATA_DIR_VAR} to the folder holding {name}/{split}.jsonl)"
        )
    rows = [row for row in read_jsonl_rows(path) if spec.keep(row)]
    rng = random.Random(seed)
    if n is not None and n > 0:
        rng.shuffle(rows)
        rows = rows[:n]
    try:
        return as_dataset([spec.preprocess(row, rng) for row in rows])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"{path}: a row lacks what '{name}' needs ({type(exc).__name__}: {exc}); "
            f"expected the columns of {spec.hub_id}"
        ) from None
