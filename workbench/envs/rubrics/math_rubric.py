"""`workbench.envs.rubrics.math_rubric`, as `verifiers.rubrics.math_rubric` (see ../math_rubric.py)."""

from workbench.envs.math_rubric import MathRubric

__all__ = ["MathRubric"]
