"""Evaluation service: `run_eval` runs an environment against a model and saves the results."""

from workbench.evaluate.config import EvalConfig
from workbench.evaluate.service import EvalResult, run_eval

__all__ = ["EvalConfig", "EvalResult", "run_eval"]
