"""The environment API: environments, rubrics, parsers and the loader (verifiers-compatible names)."""

from workbench.envs.decorators import cleanup, stop
from workbench.envs.env_group import EnvGroup
from workbench.envs.environment import Environment, RolloutOutput
from workbench.envs.judge import JudgeRubric
from workbench.envs.loader import load_environment
from workbench.envs.math_rubric import MathRubric
from workbench.envs.messages import (
    AssistantMessage,
    ChatMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from workbench.envs.multiturn import MultiTurnEnv, SingleTurnEnv
from workbench.envs.parsers import MaybeThinkParser, Parser, ThinkParser, XMLParser
from workbench.envs.rubric import Rubric
from workbench.envs.rubric_group import RubricGroup
from workbench.envs.stateful_tool_env import StatefulToolEnv
from workbench.envs.tool_env import ToolEnv, tool_schema
from workbench.envs.types import Info, Message, Messages, RewardFunc, SamplingArgs, State, TrajectoryStep
from workbench.envs.utils.data_utils import extract_boxed_answer, extract_hash_answer, load_example_dataset

__all__ = [
    "EnvGroup",
    "Environment",
    "MultiTurnEnv",
    "Parser",
    "RolloutOutput",
    "Rubric",
    "SingleTurnEnv",
    "ThinkParser",
    "ToolEnv",
    "XMLParser",
    "load_environment",
    "tool_schema",
    # scoring names as verifiers has them at its top level
    "JudgeRubric",
    "MathRubric",
    "MaybeThinkParser",
    "RubricGroup",
    "extract_boxed_answer",
    "extract_hash_answer",
    "load_example_dataset",
    # messages, decorators, tool env and type names as verifiers has them at its top level
    "AssistantMessage",
    "ChatMessage",
    "Info",
    "Message",
    "Messages",
    "RewardFunc",
    "SamplingArgs",
    "State",
    "StatefulToolEnv",
    "SystemMessage",
    "ToolCall",
    "ToolMessage",
    "TrajectoryStep",
    "UserMessage",
    "cleanup",
    "stop",
]
