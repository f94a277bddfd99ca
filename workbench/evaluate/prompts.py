"""`compare_env_args`: evaluate one environment with two candidates — two overlays of env
arguments, e.g. `{"system_prompt": ...}` or, for a DSPy candidate, `{"system_prompt": ...,
"few_shot": [...]}` — on the same examples, same seed, and say whether the second is better: the
"Verify improvement" step of prompt optimization (`workbench gepa verify`), done as two ordinary
eval runs (their folders show in `eval show` and the TUI, where Compare puts them side by side).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.engine.paired import PairedDifference, paired_difference
from workbench.errors import UserError
from workbench.evaluate.config import EvalConfig
from workbench.evaluate.service import run_eval
from workbench.events import Reporter

SYSTEM_PROMPT_ARG = "system_prompt"  # what a prompt-optimizable env's load_environment takes


@dataclass(frozen=True)
class PromptCheck:
    labels: tuple[str, str]
    runs: tuple[Path, Path]  # the two eval run folders
    difference: PairedDifference


def compare_env_args(
    config: EvalConfig,
    overlays: tuple[dict[str, Any], dict[str, Any]],
    labels: tuple[str, str],
    reporter: Reporter,
) -> PromptCheck:
    """Evaluate `config` twice, its env_args overlaid with each of `overlays` in turn (A first; an
    overlay's keys replace the config's), then the paired difference of B over A. A run that did
    not finish (Ctrl-C, a server that went away) is no result: UserError names its folder."""
    runs, means = [], []
    for overlay, label in zip(overlays, labels, strict=True):
        reporter.message(
            f"evaluating the {label} {_what(overlay)} on {config.num_examples} examples "
            f"(from example {config.example_offset})"
        )
        result = run_eval(config.model_copy(update={"env_args": {**config.env_args, **overlay}}), reporter)
        if result.status != "finished":
            raise UserError(f"the {label} {_what(overlay)}'s evaluation {result.status}: {result.run_dir}")
        runs.append(result.run_dir)
        means.append(result.group_means())
    return PromptCheck(
        labels, (runs[0], runs[1]), paired_difference(means[0], means[1], seed=config.seed or 0)
    )


def _what(overlay: dict[str, Any]) -> str:
    """How the messages name a candidate: 'prompt' when it is only a system prompt."""
    return "prompt" if set(overlay) <= {SYSTEM_PROMPT_ARG} else "candidate"
