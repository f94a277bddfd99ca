"""The environment API: environments, rubrics, parsers and the loader (verifiers-compatible names)."""

from workbench.envs.env_group import EnvGroup
from workbench.envs.environment import Environment, RolloutOutput
from workbench.envs.loader import load_environment
from workbench.envs.multiturn import MultiTurnEnv, SingleTurnEnv
from workbench.envs.parsers import Parser, ThinkParser, XMLParser
from workbench.envs.rubric import Rubric
from workbench.envs.tool_env import ToolEnv, tool_schema

__all__ = [
    "EnvGroup", "Environment", "MultiTurnEnv", "Parser", "RolloutOutput", "Rubric", "SingleTurnEnv",
    "ThinkParser", "ToolEnv", "XMLParser", "load_environment", "tool_schema",
]
