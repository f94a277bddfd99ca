"""Numeric answers for math environments: extract them from model output and compare them robustly.

Extraction prefers the last `\\boxed{...}` (balanced braces) and falls back to the last number in
the text. Comparison is exact on rationals after normalization, so "1,000", "1000.0", "$1000",
"1000." and "\\boxed{1{,}000}" all equal 1000, and "3/4" equals "0.75"; answers that are not
numbers fall back to a normalized string comparison. No dependency beyond the standard library.
"""

from __future__ import annotations

import re
from fractions import Fraction

from workbench.envs.parsers import Parser, assistant_texts, last_assistant_text
from workbench.types import Messages

# A number as people write it: optional sign, thousands separators or plain digits, decimals,
# an exponent; or a simple fraction "a/b".
_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|-?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_EXPONENT_RE = re.compile(r"[eE][-+]?(\d+)")
_MAX_EXPONENT = 400  # beyond any float: no real answer needs more, and exact expansion is costly
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_LATEX_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None if absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        rest = text[start + len("\\boxed") :].strip()  # "\boxed 42" (no braces) is valid LaTeX
        return rest.split()[0] if rest else None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i].strip()
    return None  # unbalanced: the model was cut off mid-answer


def extract_final_number(text: str) -> str | None:
    """The last number written in `text` (e.g. 'so she has $1,250.' -> '1,250'); None if none."""
    matches = _NUMBER_RE.findall(text)
    return matches[-1].strip() if matches else None


def extract_answer(text: str) -> str | None:
    """The model's final answer: the last `\\boxed{}`, else the last number. Reasoning inside a
    `<think>` block is ignored when the block is closed."""
    if "</think>" in text:
        text = text.split("</think>")[-1]
    boxed = extract_boxed(text)
    return boxed if boxed is not None else extract_final_number(text)


def _clean(text: str) -> str:
    """Strip what surrounds a number in answers: LaTeX wrappers, currency, units markers, spaces."""
    s = text.strip()
    s = _LATEX_FRAC.sub(r"(\1)/(\2)", s)
    s = _LATEX_WRAPPERS.sub(r"\1", s)
    s = s.replace("{,}", ",").replace("\\!", "").replace("\\,", "").replace("\\$", "$").replace("\\%", "%")
    s = s.replace("$", "").replace("\\left", "").replace("\\right", "").replace("−", "-")
    if "=" in s:  # "x = 5" -> "5"
        s = s.rsplit("=", 1)[1]
    return s.strip().rstrip(".").strip()


def _to_fraction(token: str) -> Fraction | None:
    token = token.strip().replace("(", "").replace(")", "").lstrip("+")
    if not _NUMBER_RE.fullmatch(token):  # "2,3" is not 23: commas only as thousands separators
        return None
    token = token.replace(",", "").replace(" ", "")
    if any(int(e) > _MAX_EXPONENT for e in _EXPONENT_RE.findall(token)):
        return None  # "1e999999999" would take minutes to expand into an exact integer
    try:
        if "/" in token:
            num, den = token.split("/", 1)
            return Fraction(num) / Fraction(den)
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def parse_number(text: str | None) -> Fraction | None:
    """`text` as an exact number, or None when it is not (just) a number.

    Accepts thousands separators, currency signs, a trailing period, percent signs ("50%" -> 50,
    as GSM8K writes them), decimals, exponents, "a/b" and `\\frac{a}{b}`; a single number with
    words around it ("18 dollars") is that number.
    """
    if text is None:
        return None
    s = _clean(text).rstrip("%").strip()
    if not s:
        return None
    direct = _to_fraction(s)
    if direct is not None:
        return direct
    numbers = _NUMBER_RE.findall(s)
    if len(numbers) == 1:
        return _to_fraction(numbers[0])
    return None


def parse_exact_number(text: str) -> Fraction | None:
    """`text` as a number only when it is nothing but one ("$1,000", "\\frac{3}{4}", "x = 5", "50%"):
    unlike `parse_number`, "25\\pi" or "x^2" are not numbers here (for symbolic math answers)."""
    return _to_fraction(_clean(text).rstrip("%").strip())


def _normalize_text(text: str) -> str:
    return re.sub(r"\s+", " ", _clean(text)).strip().lower()


def answers_match(predicted: str | None, expected: str, rel_tol: float = 1e-9) -> bool:
    """True when `predicted` equals `expected` as numbers (exactly, or within `rel_tol` for long
    decimals), or — when either is not a number — as normalized text."""
    if predicted is None:
        return False
    got, want = parse_number(predicted), parse_number(expected)
    if got is not None and want is not None:
        if got == want:
            return True
        return abs(got - want) <= rel_tol * max(Fraction(1), abs(want))
    return _normalize_text(predicted) == _normalize_text(expected) != ""


class BoxedAnswerParser(Parser):
    """Parses the final answer from `\\boxed{}` or the last number; format = a boxed answer."""

    def parse(self, text: str) -> str | None:
        return extract_answer(text)

    def parse_answer(self, completion: Messages | str) -> str | None:
        return extract_answer(last_assistant_text(completion))

    def format_score(self, completion: Messages | str) -> float:
        """1.0 when the final assistant message has a complete `\\boxed{}` answer."""
        texts = assistant_texts(completion)
        return 1.0 if texts and extract_boxed(texts[-1]) is not None else 0.0


def correct_answer(completion: Messages, answer: str, parser: Parser) -> float:
    """1.0 when the parsed final answer equals the reference answer numerically, else 0.0."""
    return 1.0 if answers_match(parser.parse_answer(completion), answer) else 0.0


def format_number(value: Fraction) -> str:
    """A canonical string for a parsed answer: '72', '0.75', or 'p/q' when no short decimal exists."""
    if value.denominator == 1:
        return str(value.numerator)
    as_float = str(float(value))
    return (
        as_float
        if len(as_float) < 18 and Fraction(as_float) == value
        else f"{value.numerator}/{value.denominator}"
    )
