"""`MathRubric`: verifiers' math-answer rubric on Workbench's own answer checker.

As in verifiers, the default parser takes the last `\\boxed{...}` after any `<think>` block (no box,
no answer) and the rubric adds one reward function, `correct_answer`: 1.0 when the parsed answer
equals the reference. verifiers checks with `math-verify` (sympy); here the check is exact and
needs nothing beyond the standard library:

- numbers compare exactly as rationals after cleanup: "1/2" = "0.5" = "\\frac{1}{2}" = "\\dfrac12",
  "1,000" = "1000" = "$1000" = "\\text{1000}";
- anything else compares as normalized LaTeX: spacing, `\\left`/`\\right`, `\\dfrac`/`\\tfrac`,
  `\\text{}` wrappers, degree marks and a final period do not matter ("25 \\pi" = "25\\pi").

Symbolic equivalence beyond that ("\\frac{\\sqrt{2}}{2}" vs "\\frac{1}{\\sqrt{2}}") scores 0, where
math-verify might score 1; a rubric that needs it can add its own function.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import partial

from workbench.envs.math_answers import parse_exact_number
from workbench.envs.parsers import MaybeThinkParser, Parser
from workbench.envs.rubric import RewardFunc, Rubric
from workbench.envs.utils.data_utils import extract_boxed_answer
from workbench.types import Messages

_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_BARE_FRAC = re.compile(r"\\frac\s*(\d)\s*(\d)")  # \frac12 -> \frac{1}{2}
_BARE_SQRT = re.compile(r"\\sqrt\s*(\d+)")  # \sqrt2 -> \sqrt{2}
_DROPPED = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "$", "^\\circ", "^{\\circ}", "\\%", "%")


def normalize_latex(text: str) -> str:
    """A canonical spelling of a LaTeX answer, for comparing answers that are not plain numbers."""
    s = text.strip().replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("{,}", ",")
    s = _WRAPPERS.sub(r"\1", s)
    for token in _DROPPED:
        s = s.replace(token, "")
    s = _BARE_FRAC.sub(r"\\frac{\1}{\2}", s)
    s = _BARE_SQRT.sub(r"\\sqrt{\1}", s)
    return re.sub(r"\s+", "", s).rstrip(".")


def math_answers_equal(response: str, answer: str) -> bool:
    """True when `response` states the same answer as `answer` (see the module docstring)."""
    if not response.strip() or not answer.strip():
        return False
    got, want = normalize_latex(response), normalize_latex(answer)
    got_number, want_number = parse_exact_number(got), parse_exact_number(want)
    if got_number is not None and want_number is not None:
        return got_number == want_number
    return got == want


class MathRubric(Rubric):
    """A rubric whose `correct_answer` checks the boxed final answer against the reference.

    `max_workers` and `timeout_seconds` are accepted for verifiers' signature; the check here is
    fast and in-process, so they change nothing. Responses over `max_verify_chars` score 0."""

    MAX_VERIFY_CHARS: int = 50_000

    def __init__(
        self,
        funcs: Sequence[RewardFunc] | None = None,
        weights: Sequence[float] | None = None,
        parser: Parser | None = None,
        max_workers: int = 8,
        timeout_seconds: float = 5,
        max_verify_chars: int = MAX_VERIFY_CHARS,
    ) -> None:
        parser = parser or MaybeThinkParser(extract_fn=partial(extract_boxed_answer, strict=True))
        super().__init__(funcs, weights, parser)
        self.max_verify_chars = max_verify_chars
        self.timeout_seconds = timeout_seconds
        self.add_reward_func(self.correct_answer)

    def correct_answer(self, parser: Parser, completion: Messages, answer: str) -> float:
        """1.0 when the parsed final answer equals `answer` mathematically, else 0.0."""
        response = parser.parse_answer(completion) or ""
        if len(response) > self.max_verify_chars:
            return 0.0
        return 1.0 if math_answers_equal(str(response), str(answer)) else 0.0
