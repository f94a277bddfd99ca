"""GSM8K-format data for math environments: read the JSONL (question / answer ending in `#### n`,
gzipped or not), and make seeded, disjoint train / eval splits. Shared by the gsm8k and
math-python environments.

GSM8K's training split ships with Workbench, in the bundled gsm8k environment
(`environments/gsm8k/data/`, MIT, see its ORIGIN.md), so the environments and the scaffolded
configs run offline with no data to fetch. `openai/gsm8k` is still downloaded on request
(`from_hub`), when `datasets` is installed and the hub is reachable.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.envs.loader import bundled_environments_dir
from workbench.envs.math_answers import format_number, parse_number

Rows = list[dict[str, Any]]

_CALCULATOR = re.compile(r"<<[^<>]*>>")


def gsm8k_row(question: str, solution: str) -> dict[str, Any]:
    """A dataset row from a GSM8K question and its solution text (`... #### 72`)."""
    final = solution.split("####")[-1].strip()
    number = parse_number(final)
    answer = final.replace(",", "") if number is None else format_number(number)
    return {"question": question.strip(), "answer": answer, "info": {"solution": solution.strip()}}


def solution_to_completion(solution: str, answer: str) -> str:
    """A GSM8K worked solution as a model answer: calculator annotations dropped, `\\boxed{}` last."""
    steps = _CALCULATOR.sub("", solution.split("####")[0]).strip()
    return f"{steps}\nThe answer is \\boxed{{{answer}}}." if steps else f"\\boxed{{{answer}}}"


def shipped_gsm8k_path() -> Path:
    """GSM8K's training split (7,473 rows, gzipped JSONL) as shipped in the bundled gsm8k environment."""
    return bundled_environments_dir() / "gsm8k" / "data" / "train.jsonl.gz"


def read_gsm8k_jsonl(path: str | Path) -> Rows:
    """Rows from a GSM8K JSONL file (`question`, `answer` ending in `#### n`), gzipped when its name
    ends in `.gz`. ValueError with the file and line on bad input, so the loader shows one clear line."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"data file not found: {path}")
    rows = []
    opened = gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")
    with opened as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                rows.append(gsm8k_row(str(record["question"]), str(record["answer"])))
            except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as exc:
                raise ValueError(
                    f"{path}:{lineno}: expected a JSON object with 'question' and 'answer' "
                    f"({type(exc).__name__}: {exc})"
                ) from None
    if not rows:
        raise ValueError(f"{path} has no examples")
    return rows


def load_gsm8k_hub(split: str) -> Rows:
    """`openai/gsm8k` (config `main`) from the Hugging Face hub via `datasets`, when installed and
    reachable. ValueError (one line, saying to pass `data_path` or use the shipped copy) otherwise."""
    try:
        import datasets  # optional: not a workbench dependency
    except ImportError:
        raise ValueError(
            "from_hub needs the `datasets` library, which is not installed (pip install datasets "
            "to download openai/gsm8k; or drop from_hub for the shipped copy, or pass data_path=PATH.jsonl)"
        ) from None
    from workbench.models.hub import go_offline, hub_reachable

    reachable = hub_reachable()
    if not reachable:  # the cache alone: no minute of retries printed to the terminal
        go_offline()
    try:
        data = datasets.load_dataset("openai/gsm8k", "main", split=split)
    except Exception as exc:  # offline, hub down, auth: all mean "use a local file"
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        why = (
            f"from the Hugging Face hub ({message[:200]})"
            if reachable
            else "(the Hugging Face hub is unreachable and it is not in the local datasets cache)"
        )
        raise ValueError(
            f"could not load openai/gsm8k {why}; drop from_hub for the shipped copy of its train split, "
            "or pass data_path=PATH.jsonl with GSM8K-format data"
        ) from None
    return [gsm8k_row(str(r["question"]), str(r["answer"])) for r in data]


def held_out_split(rows: Rows, num_eval: int, seed: int) -> tuple[Rows, Rows]:
    """A seeded, disjoint (train, eval) split: `num_eval` rows held out for eval, the rest train."""
    if num_eval >= len(rows):
        raise ValueError(f"num_eval_examples={num_eval} leaves no training data ({len(rows)} examples)")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[:num_eval])
    eval_rows = [rows[i] for i in order[:num_eval]]
    train_rows = [row for i, row in enumerate(rows) if i not in held]
    return train_rows, eval_rows


def _capped(rows: Rows, n: int) -> Rows:
    return rows if n < 0 else rows[:n]


def gsm8k_datasets(
    data_path: str | None,
    eval_data_path: str | None,
    num_train_examples: int,
    num_eval_examples: int,
    seed: int,
    from_hub: bool = False,
) -> tuple[Callable[[], Rows] | None, Callable[[], Rows] | None]:
    """(train, eval) dataset builders for an environment, from GSM8K-format data.

    - `eval_data_path` given: train = `data_path` (if any), eval = that file.
    - otherwise `data_path`, or without it GSM8K's train split shipped with Workbench
      (`shipped_gsm8k_path`): `num_eval_examples` rows held out for eval (seeded, disjoint;
      0 = none, eval then uses train).
    - `from_hub` (no paths): `openai/gsm8k` from the hub (train / test splits), loaded now so that
      an offline machine fails at load time with a one-line message.
    Sizes: -1 = all. Files are checked now and read on first use (once for both splits).
    """
    if num_eval_examples < -1 or num_train_examples < -1:
        raise ValueError("num_train_examples and num_eval_examples must be -1 (all) or more")
    if from_hub:
        if data_path is not None or eval_data_path is not None:
            raise ValueError("from_hub loads openai/gsm8k: give it or data_path/eval_data_path, not both")
        train_rows, eval_rows = load_gsm8k_hub("train"), load_gsm8k_hub("test")
        return (lambda: _capped(train_rows, num_train_examples)), (
            lambda: _capped(eval_rows, num_eval_examples)
        )
    if data_path is None and eval_data_path is None:
        data_path = str(shipped_gsm8k_path())
    for path in (data_path, eval_data_path):
        if path is not None and not Path(path).expanduser().is_file():
            raise ValueError(f"data file not found: {path}")
    if eval_data_path is not None:
        train = (
            None if data_path is None else (lambda: _capped(read_gsm8k_jsonl(data_path), num_train_examples))
        )
        return train, (lambda: _capped(read_gsm8k_jsonl(eval_data_path), num_eval_examples))
    if num_eval_examples < 0:
        raise ValueError("num_eval_examples must be the number of rows to hold out of data_path (0: none)")
    assert data_path is not None
    split = cached(lambda: held_out_split(read_gsm8k_jsonl(data_path), num_eval_examples, seed))
    train = lambda: _capped(split()[0], num_train_examples)  # noqa: E731
    return train, ((lambda: split()[1]) if num_eval_examples > 0 else None)


def cached(build: Callable[[], Any]) -> Callable[[], Any]:
    """`build` run once, on first call (datasets stay lazy, and two splits share one read)."""
    box: list[Any] = []

    def get() -> Any:
        if not box:
            box.append(build())
        return box[0]

    return get
