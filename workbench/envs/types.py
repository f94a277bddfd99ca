"""Type names as verifiers spells them (`from verifiers.types import Messages, State` ports to
`from workbench.envs.types import Messages, State`). Workbench's own record types live in
`workbench.types`; these are the names environment code annotates with."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from workbench.envs.messages import (
    AssistantMessage,
    ChatMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from workbench.types import Completion, TokenData

if TYPE_CHECKING:
    from datasets import Dataset

Message = ChatMessage
Messages = list[ChatMessage]
State = dict[str, Any]  # a rollout's state: Workbench keeps it a plain dict
Info = dict[str, Any]
SamplingArgs = dict[str, Any]
MessageType = Literal["chat"]  # verifiers' "completion" format is not supported
IndividualRewardFunc = Callable[..., float | Awaitable[float]]
GroupRewardFunc = Callable[..., list[float] | Awaitable[list[float]]]
RewardFunc = IndividualRewardFunc | GroupRewardFunc
DatasetBuilder = Callable[[], "Dataset"]


class TrajectoryStep(TypedDict):
    """One model turn of a rollout, as `state["trajectory"]` holds it (verifiers' keys)."""

    prompt: list[ChatMessage]  # the conversation the model saw this turn
    completion: list[ChatMessage]  # what it answered (one assistant message)
    response: Completion  # Workbench's client response for the turn
    tokens: TokenData | None  # token ids and logprobs, when the client returns them
    reward: float | None
    advantage: float | None
    is_truncated: bool
    trajectory_id: str
    extras: dict[str, Any]


__all__ = [
    "AssistantMessage",
    "ChatMessage",
    "DatasetBuilder",
    "GroupRewardFunc",
    "IndividualRewardFunc",
    "Info",
    "Message",
    "MessageType",
    "Messages",
    "RewardFunc",
    "SamplingArgs",
    "State",
    "SystemMessage",
    "ToolCall",
    "ToolMessage",
    "TrajectoryStep",
    "UserMessage",
]
