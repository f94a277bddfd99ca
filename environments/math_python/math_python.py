"""math-python: math problems solved with a Python tool (multi-turn, tool use).

The model may call `python(code)` any number of times (up to `max_turns` model turns); each call
runs the code in the workbench sandbox (`workbench.envs.sandbox`: separate process, wall-clock,
CPU, memory and process limits, fresh temp dir, no inherited environment, no network where the
OS allows it) and returns what it printed. A failing call — an exception, or a sandbox limit hit —
comes back to the model as a tool error and is counted in `state["tool_errors"]`; the rollout goes
on. The final answer goes in `\\boxed{}`; reward = numeric match with the reference.
Data: by default a seeded generator of problems that need computation (big products, sums of
long lists, modular powers, prime counts, ...), offline; `dataset="gsm8k"`: GSM8K's train split as
shipped with Workbench (offline too); or your own GSM8K-format JSONL via `data_path`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from math import lcm
from typing import Any, Literal

from workbench.envs import Rubric, ToolEnv
from workbench.envs.gsm8k_data import cached, gsm8k_datasets, solution_to_completion
from workbench.envs.math_answers import BoxedAnswerParser, correct_answer
from workbench.envs.sandbox import SandboxError, SandboxLimits, run_python
from workbench.types import Example, Messages, State

SYSTEM_PROMPT = (
    "Solve the problem. You can run Python code with the `python` tool: it runs a script and returns "
    "what it prints, so use print(). When you know the result, reply with the final answer as a "
    "number in \\boxed{}."
)


# ----- generated problems -------------------------------------------------------------------
def _product(rng: random.Random) -> tuple[str, int, str]:
    a, b, days = rng.randint(1000, 99999), rng.randint(100, 9999), rng.randint(7, 400)
    question = (
        f"A factory fills {a:,} boxes a day and each box holds {b:,} screws. "
        f"How many screws does it pack in {days} days?"
    )
    return question, a * b * days, f"print({a} * {b} * {days})"


def _list_sum(rng: random.Random) -> tuple[str, int, str]:
    sales = [rng.randint(100, 99999) for _ in range(rng.randint(12, 25))]
    question = (
        f"A shop recorded its daily sales in dollars: {', '.join(map(str, sales))}. "
        "What were the total sales?"
    )
    return question, sum(sales), f"print(sum({sales}))"


def _mod_power(rng: random.Random) -> tuple[str, int, str]:
    base, exp, mod = rng.randint(2, 99), rng.randint(50, 500), rng.randint(1000, 99999)
    return (
        f"What is the remainder when {base}^{exp} is divided by {mod}?",
        pow(base, exp, mod),
        f"print(pow({base}, {exp}, {mod}))",
    )


def _prime_count(rng: random.Random) -> tuple[str, int, str]:
    lo = rng.randint(1, 5000)
    hi = lo + rng.randint(1000, 20000)
    sieve = bytearray([1]) * (hi + 1)
    sieve[0:2] = b"\x00\x00"
    for i in range(2, int(hi**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, hi + 1, i)))
    code = (
        f"n = {hi}\nsieve = [True] * (n + 1)\nsieve[0] = sieve[1] = False\n"
        "for i in range(2, int(n**0.5) + 1):\n    if sieve[i]:\n        for j in range(i*i, n + 1, i):\n"
        f"            sieve[j] = False\nprint(sum(sieve[{lo}:]))"
    )
    return f"How many prime numbers are there from {lo} to {hi}, inclusive?", sum(sieve[lo:]), code


def _digit_sum(rng: random.Random) -> tuple[str, int, str]:
    base, exp = rng.randint(2, 9), rng.randint(50, 300)
    return (
        f"What is the sum of the digits of {base}^{exp}?",
        sum(map(int, str(base**exp))),
        f"print(sum(int(d) for d in str({base}**{exp})))",
    )


def _square_sum(rng: random.Random) -> tuple[str, int, str]:
    lo = rng.randint(1, 500)
    hi = lo + rng.randint(100, 5000)
    return (
        f"What is the sum of the squares of every whole number from {lo} to {hi}?",
        sum(i * i for i in range(lo, hi + 1)),
        f"print(sum(i * i for i in range({lo}, {hi} + 1)))",
    )


def _divisible_count(rng: random.Random) -> tuple[str, int, str]:
    n = rng.randint(10_000, 1_000_000)
    p, q = rng.sample([3, 4, 5, 6, 7, 9, 11, 13], 2)
    r = rng.choice([2, 17, 19, 23])
    # Inclusion-exclusion (the model is expected to just loop): |P or Q| - |(P or Q) and R|.
    count = (n // p + n // q - n // lcm(p, q)) - (n // lcm(p, r) + n // lcm(q, r) - n // lcm(p, q, r))
    return (
        f"How many whole numbers from 1 to {n:,} are divisible by {p} or by {q}, but not by {r}?",
        count,
        f"print(sum(1 for i in range(1, {n} + 1) if (i % {p} == 0 or i % {q} == 0) and i % {r}))",
    )


GENERATORS: dict[str, Callable[[random.Random], tuple[str, int, str]]] = {
    "product": _product,
    "list_sum": _list_sum,
    "mod_power": _mod_power,
    "prime_count": _prime_count,
    "digit_sum": _digit_sum,
    "square_sum": _square_sum,
    "divisible_count": _divisible_count,
}


def make_rows(n: int, seed: int, exclude: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """`n` distinct generated problems, none of whose questions is in `exclude`; every kind in turn
    (a seeded order per round), so each kind is equally common."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    seen = set(exclude)
    kinds: list[str] = []
    while len(rows) < n:
        if not kinds:
            kinds = rng.sample(list(GENERATORS), len(GENERATORS))
        kind = kinds.pop()
        question, answer, code = GENERATORS[kind](rng)
        if question in seen:
            continue
        seen.add(question)
        rows.append({"question": question, "answer": str(answer), "info": {"kind": kind, "code": code}})
    return rows


# ----- the tool and the env -----------------------------------------------------------------
def make_python_tool(limits: SandboxLimits) -> Callable[[str], Any]:
    """The `python` tool, bound to `limits`. Failures raise `SandboxError` (a tool error)."""

    async def python(code: str) -> str:
        """Run a Python script in a sandbox and return what it prints (stdout, then stderr).

        Args:
            code: a complete Python script; print() the values you need
        """
        result = await run_python(code, limits)
        if result.failure:
            raise SandboxError(result.describe())
        return result.describe()

    return python


def num_tool_calls(state: State) -> float:
    """How many tool calls the rollout made (a metric)."""
    return float(state.get("tool_calls", 0))


def num_tool_errors(state: State) -> float:
    """How many tool calls failed: exceptions and sandbox limits (a metric)."""
    return float(state.get("tool_errors", 0))


class MathPythonEnv(ToolEnv):
    def reference_completion(self, example: Example) -> Messages | None:
        if example.info.get("code"):
            call = {
                "id": "call_0",
                "type": "function",
                "function": {"name": "python", "arguments": json.dumps({"code": example.info["code"]})},
            }
            return [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_0", "content": example.answer},
                {"role": "assistant", "content": f"The answer is \\boxed{{{example.answer}}}."},
            ]
        if example.info.get("solution"):
            return [
                {
                    "role": "assistant",
                    "content": solution_to_completion(example.info["solution"], example.answer),
                }
            ]
        return None


def load_environment(
    data_path: str | None = None,
    eval_data_path: str | None = None,
    num_train_examples: int = -1,
    num_eval_examples: int = 200,
    max_turns: int = 5,
    timeout_s: float = 10.0,
    cpu_time_s: int = 5,
    memory_mb: int = 1024,
    max_processes: int = 16,
    max_output_chars: int = 4000,
    system_prompt: str = SYSTEM_PROMPT,
    seed: int = 0,
    dataset: Literal["generated", "gsm8k"] = "generated",
) -> MathPythonEnv:
    """dataset: "generated" problems (train from `seed`, eval from seed+1) or "gsm8k", GSM8K's train
    split as shipped with Workbench (as in gsm8k: `num_eval_examples` rows held out for eval).
    data_path/eval_data_path: your own GSM8K-format JSONL instead (as in gsm8k: eval held out of
    data_path unless eval_data_path is given). num_train_examples/num_eval_examples: split sizes
    (-1: all rows of GSM8K data, or 2000 generated). max_turns: model turns, tool calls included.
    timeout_s (wall clock), cpu_time_s, memory_mb, max_processes, max_output_chars: sandbox limits of
    each tool call. system_prompt: the instruction (GEPA optimizes it). seed: data seed."""
    train: Callable[[], list[dict[str, Any]]] | None
    held_out: Callable[[], list[dict[str, Any]]] | None
    if dataset == "generated" and data_path is None and eval_data_path is None:
        n_train = 2000 if num_train_examples < 0 else num_train_examples
        n_eval = 200 if num_eval_examples < 0 else num_eval_examples
        train_rows = cached(lambda: make_rows(n_train, seed))
        train = train_rows
        # Eval never repeats a training question (some kinds have small parameter spaces).
        held_out = lambda: make_rows(n_eval, seed + 1, frozenset(r["question"] for r in train_rows()))
    else:
        train, held_out = gsm8k_datasets(
            data_path, eval_data_path, num_train_examples, num_eval_examples, seed
        )
    limits = SandboxLimits(
        timeout_s=timeout_s,
        cpu_time_s=cpu_time_s,
        memory_mb=memory_mb,
        max_processes=max_processes,
        max_output_chars=max_output_chars,
    )
    parser = BoxedAnswerParser()
    rubric = Rubric(
        [correct_answer, parser.get_format_reward_func(), num_tool_calls, num_tool_errors],
        weights=[1.0, 0.0, 0.0, 0.0],
        parser=parser,
    )
    return MathPythonEnv(
        tools=[make_python_tool(limits)],
        dataset=train,
        eval_dataset=held_out,
        system_prompt=system_prompt,
        parser=parser,
        rubric=rubric,
        max_turns=max_turns,
        max_tool_output_chars=max_output_chars + 200,  # room for the failure line after cut output
        sampling_args={"max_tokens": 512},
    )
