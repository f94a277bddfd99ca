"""`workbench.envs.rubrics`: the rubric classes under the module path verifiers gives them, so
`from verifiers.rubrics.math_rubric import MathRubric` ports by its prefix alone."""

from workbench.envs.judge import JudgeRubric
from workbench.envs.math_rubric import MathRubric
from workbench.envs.rubric import Rubric
from workbench.envs.rubric_group import RubricGroup

__all__ = ["JudgeRubric", "MathRubric", "Rubric", "RubricGroup"]
