"""DSPy's optimizers on a metric-call budget: `plan_calls` and `compile_program`.

A metric call is one rollout of one example, the unit GEPA's budget counts. DSPy's optimizers
have no budget of their own, so their settings are derived from `-B` before anything loads,
from an upper bound of what they can spend (T = train examples, V = validation examples):

- bootstrap — `BootstrapFewShotWithRandomSearch`: a zero-shot candidate (the seed prompt), an
  unshuffled bootstrap, then n shuffled ones of random size; each bootstrap pass walks the
  trainset until it has its demos (≤ T calls) and every candidate is scored on the valset:
  ≤ (n+1)·T + (n+2)·V. Labeled (gold-answer) demos are off: a raw dataset answer is not in
  the env's answer format, a rollout that scored well is.
- miprov2 — `MIPROv2` without minibatches: c−1 bootstrap passes give c demo sets (one empty),
  the prompt model proposes c−1 instructions besides the seed's, then k trials of Bayesian
  search each score one (instruction, demo set) on the valset, after the seed's own score:
  ≤ (c−1)·T + (k+1)·V. Proposals go through the reflection model; a reply DSPy cannot parse
  keeps the seed's instruction for that slot and is recorded, like an unusable reflection.

The bound is never passed (the scorer's Budget would refuse the call), so DSPy never sees a
budget error half-way through a search.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from workbench.errors import UserError
from workbench.gepa.dspy_support import swapped_global

OPTIMIZERS = ("gepa", "miprov2", "bootstrap")
DEFAULT_BOOTSTRAP_PROGRAMS = 6  # shuffled bootstrap candidates at most; a bigger budget is left unspent
DEFAULT_MIPRO_CANDIDATES = 3  # the seed + 2 proposals, 3 demo sets: the smallest search worth running


@dataclass(frozen=True)
class DspyPlan:
    optimizer: str
    candidates: (
        int  # bootstrap: shuffled candidate programs (n); miprov2: instruction and demo-set candidates (c)
    )
    trials: int  # miprov2: Bayesian-search trials (k); bootstrap: 0
    bound: int  # metric calls at most
    breakdown: str  # the bound, spelled out


def plan_calls(
    optimizer: str,
    max_calls: int,
    num_train: int,
    num_val: int,
    num_candidates: int | None,
    num_trials: int | None,
) -> DspyPlan:
    """Settings that fit `max_calls`; UserError (one line) when even the smallest search does not."""
    t, v = num_train, num_val
    if optimizer == "bootstrap":
        smallest = t + 2 * v
        if max_calls < smallest:
            raise UserError(
                f"-B {max_calls} is too small for --optimizer bootstrap: one bootstrap pass over {t} train "
                f"examples plus scoring the seed and one candidate on {v} validation examples takes up to "
                f"{smallest} metric calls; raise -B or lower -n/-N"
            )
        n = min(
            (max_calls - smallest) // (t + v),
            DEFAULT_BOOTSTRAP_PROGRAMS if num_candidates is None else num_candidates,
        )
        bound = (n + 1) * t + (n + 2) * v
        return DspyPlan(
            optimizer,
            n,
            0,
            bound,
            f"{n + 1} bootstrap passes × ≤{t} train + {n + 2} candidates × {v} validation",
        )
    if optimizer == "miprov2":
        c = DEFAULT_MIPRO_CANDIDATES if num_candidates is None else num_candidates
        if c < 2:
            raise UserError("--optimizer miprov2 needs at least 2 candidates (the seed and one proposal)")
        most_trials = (max_calls - (c - 1) * t) // v - 1
        if most_trials < 1:
            raise UserError(
                f"-B {max_calls} is too small for --optimizer miprov2: {c - 1} bootstrap passes over {t} "
                f"train examples plus the seed and one trial on {v} validation examples take up to "
                f"{(c - 1) * t + 2 * v} metric calls; raise -B or lower -n/-N/num_candidates"
            )
        k = min(most_trials, c * c if num_trials is None else num_trials)
        bound = (c - 1) * t + (k + 1) * v
        return DspyPlan(
            optimizer,
            c,
            k,
            bound,
            f"{c - 1} bootstrap passes × ≤{t} train + {k + 1} evaluations × {v} validation",
        )
    raise UserError(f"unknown optimizer '{optimizer}': choose {', '.join(OPTIMIZERS)}")


ProposalEvent = Callable[[str, str, str], None]  # (status proposed|unusable|error, detail, reply)


def compile_program(
    dspy: ModuleType,
    plan: DspyPlan,
    student: Any,
    trainset: list[Any],
    valset: list[Any],
    *,
    metric: Callable[..., float],
    max_demos: int,
    demo_threshold: float | None,
    threads: int,
    seed: int,
    prompt_lm: Any = None,
    on_proposal: ProposalEvent | None = None,
) -> Any:
    """The optimized program (its predictor holds the best instructions and demos)."""
    if plan.optimizer == "bootstrap":
        optimizer = dspy.BootstrapFewShotWithRandomSearch(
            metric=metric,
            metric_threshold=demo_threshold,
            max_bootstrapped_demos=max_demos,
            max_labeled_demos=0,
            num_candidate_programs=plan.candidates,
            num_threads=threads,
        )
        # seed -2 would be "labeled demos only": none here, so it would re-score the seed prompt
        restrict = [-3, -1, *range(plan.candidates)]
        return optimizer.compile(student, trainset=trainset, valset=valset, restrict=restrict)
    optimizer = dspy.MIPROv2(
        metric=metric,
        prompt_model=prompt_lm,
        task_model=prompt_lm,
        auto=None,
        num_candidates=plan.candidates,
        max_bootstrapped_demos=max_demos,
        max_labeled_demos=0,
        num_threads=threads,
        metric_threshold=demo_threshold,
        seed=seed,
    )
    with safe_proposals(on_proposal):
        return optimizer.compile(
            student,
            trainset=trainset,
            valset=valset,
            num_trials=plan.trials,
            minibatch=False,
            program_aware_proposer=False,
        )  # our program's source says nothing about the task


def safe_proposals(on_proposal: ProposalEvent | None) -> contextlib.AbstractContextManager[None]:
    """Inside, MIPROv2's instruction proposals cannot crash the run: DSPy's proposer has no error
    handling, and a prompt model that misses DSPy's reply format (any small local model) raises
    a parse error that would end the whole compile. MIPROv2 takes no proposer argument; it builds
    the `GroundedProposer` its module imported, so that name is a safe subclass for the call."""
    from dspy.propose.grounded_proposer import GroundedProposer
    from dspy.teleprompt import mipro_optimizer_v2
    from dspy.teleprompt.utils import get_signature

    def record(status: str, detail: str, reply: str = "") -> None:
        if on_proposal is not None:
            on_proposal(status, detail, reply)

    class SafeProposer(GroundedProposer):
        def propose_instruction_for_predictor(
            self, program: Any, predictor: Any, *args: Any, **kwargs: Any
        ) -> str:
            current = get_signature(predictor).instructions
            try:
                text = super().propose_instruction_for_predictor(program, predictor, *args, **kwargs)
            except Exception as exc:  # the prompt model's reply did not parse, or its call failed
                unusable = "Parse" in type(exc).__name__
                record("unusable" if unusable else "error", f"{type(exc).__name__}: {str(exc)[:500]}")
                return current
            text = str(text or "").strip()
            if not text or text == current.strip():
                record("unusable", "the proposal is empty or the current instruction", text)
                return current
            record("proposed", "new instruction", text)
            return text

    return swapped_global(mipro_optimizer_v2, "GroundedProposer", SafeProposer)
