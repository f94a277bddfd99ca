"""Core record types shared by every layer: examples, sampling, model responses, rollouts, groups.

One JSON line per rollout on disk (`Rollout.to_record`), the same schema for eval, train and
GEPA, versioned by `SCHEMA_VERSION` so one reader serves the CLI, pandas and the TUI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard, get_args

from workbench.errors import redact_credentials

# An in-process model's weights (`--dtype`, as vLLM's): "auto" is float32 on a CPU.
ModelDtype = Literal["auto", "float32", "bfloat16"]
MODEL_DTYPES: tuple[str, ...] = get_args(ModelDtype)

SCHEMA_VERSION = 1

Message = dict[str, Any]
Messages = list[Message]
State = dict[str, Any]


def is_number(value: object) -> TypeGuard[int | float]:
    """A JSON number: an int or a float, not a bool (`True` is an int in Python, never a reward)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class Example:
    """One dataset row, already turned into a chat prompt."""

    example_id: int
    prompt: Messages
    answer: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    task: str = "default"


@dataclass
class SamplingParams:
    """Sampling settings understood by every client (the OpenAI names)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = off, as in vLLM
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    n: int = 1
    seed: int | None = None
    # Anything else a server understands (min_p, repetition_penalty, ...): passed through as is.
    extra: dict[str, Any] = field(default_factory=dict)

    def merged(self, overrides: dict[str, Any]) -> SamplingParams:
        """A copy with `overrides` applied; unknown keys go to `extra` (they reach the server)."""
        known = {f for f in self.__dataclass_fields__ if f != "extra"}
        values = {f: getattr(self, f) for f in known}
        extra = dict(self.extra)
        for key, value in overrides.items():
            if key in known:
                values[key] = value
            else:
                extra[key] = value
        if isinstance(values["stop"], str):
            values["stop"] = [values["stop"]]
        return SamplingParams(**values, extra=extra)


@dataclass
class TokenData:
    """Token ids and sampled logprobs of one generation (what RL trains on)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    # 1 where the model sampled the token, 0 for tokens the environment wrote between turns
    # (multi-turn); None means all ones. Logprobs of masked tokens are 0 and never trained on.
    completion_mask: list[int] | None = None
    # Per completion token, the k most likely (token id, logprob) when a request asked for
    # `top_logprobs` (the OpenAI API's alternatives); None otherwise. Never trained on.
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class Completion:
    """One choice returned by a model: the assistant message plus accounting."""

    message: Message  # {"role": "assistant", "content": ..., optional "tool_calls": [...]}
    finish_reason: str  # "stop" | "length" | "tool_calls"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens: TokenData | None = None


@dataclass
class RolloutError:
    """Why a rollout failed; recorded on the rollout, never fatal to the run."""

    type: str
    message: str
    where: str = "rollout"  # "inference" | "env" | "reward" | "rollout"
    # The model call failed (no answer after the retries, 4xx such as a bad key, 5xx, a malformed
    # reply), not the rollout: it is no result at all. Reward statistics leave it out, the run is
    # `failed`, and `--resume` redoes its group. (A conversation that outgrew the context window is
    # a truncated rollout, not an error.)
    infrastructure: bool = False

    def __post_init__(self) -> None:
        self.message = redact_credentials(self.message)  # a server URL's key stays out of results

    @classmethod
    def from_exception(cls, exc: BaseException, where: str) -> RolloutError:
        infrastructure = where == "inference"
        return cls(
            type=type(exc).__name__, message=str(exc)[:2000], where=where, infrastructure=infrastructure
        )


@dataclass
class Rollout:
    """One trajectory through an environment, scored."""

    example_id: int
    rollout_index: int
    prompt: Messages
    completion: Messages = field(default_factory=list)
    answer: str = ""
    task: str = "default"
    info: dict[str, Any] = field(default_factory=dict)
    reward: float = 0.0
    rewards: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    num_turns: int = 0
    is_truncated: bool = False
    stop_condition: str = ""
    error: RolloutError | None = None
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0})
    timing: dict[str, float] = field(default_factory=dict)
    policy_version: int = 0
    tokens: TokenData | None = None
    state_columns: dict[str, Any] = field(default_factory=dict)
    # Each model turn's prompt and sampled ids (multi-turn RL builds its samples from these).
    # Kept in memory only: records carry `tokens`, the whole rollout as one sequence.
    turn_tokens: list[TokenData] = field(default_factory=list)

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "example_id": self.example_id,
            "rollout_index": self.rollout_index,
            "task": self.task,
            "prompt": self.prompt,
            "completion": self.completion,
            "answer": self.answer,
            "info": self.info,
            "reward": self.reward,
            "rewards": self.rewards,
            "metrics": self.metrics,
            "num_turns": self.num_turns,
            "is_truncated": self.is_truncated,
            "stop_condition": self.stop_condition,
            "error": None if self.error is None else vars(self.error),
            "usage": self.usage,
            "timing": self.timing,
            "policy_version": self.policy_version,
            "state": self.state_columns,
        }
        if self.tokens is not None:  # (top_logprobs only when a request asked for them)
            record["tokens"] = {
                k: v for k, v in vars(self.tokens).items() if v is not None or k != "top_logprobs"
            }
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Rollout:
        error = record.get("error")
        tokens = record.get("tokens")
        return cls(
            example_id=record["example_id"],
            rollout_index=record["rollout_index"],
            prompt=record["prompt"],
            completion=record.get("completion", []),
            answer=record.get("answer", ""),
            task=record.get("task", "default"),
            info=record.get("info", {}),
            reward=record.get("reward", 0.0),
            rewards=record.get("rewards", {}),
            metrics=record.get("metrics", {}),
            num_turns=record.get("num_turns", 0),
            is_truncated=record.get("is_truncated", False),
            stop_condition=record.get("stop_condition", ""),
            error=None if error is None else RolloutError(**error),
            usage=record.get("usage", {}),
            timing=record.get("timing", {}),
            policy_version=record.get("policy_version", 0),
            tokens=None if tokens is None else TokenData(**tokens),
            state_columns=record.get("state", {}),
        )


@dataclass
class Group:
    """The rollouts of one example: the unit that is scored, streamed and resumed."""

    example_id: int
    rollouts: list[Rollout]

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts]

    @property
    def mean(self) -> float:
        return sum(self.rewards) / len(self.rollouts) if self.rollouts else 0.0

    @property
    def std(self) -> float:
        """Population standard deviation of the group's rewards (what advantages use)."""
        if not self.rollouts:
            return 0.0
        mean = self.mean
        return math.sqrt(sum((r - mean) ** 2 for r in self.rewards) / len(self.rollouts))

    @property
    def infrastructure_failures(self) -> int:
        """Rollouts the serving side failed (see RolloutError.infrastructure): the group is no result."""
        return sum(r.error is not None and r.error.infrastructure for r in self.rollouts)

    def advantages(self, scale_by_std: bool = False, eps: float = 1e-6) -> list[float]:
        mean, std = self.mean, self.std
        if scale_by_std:
            return [(r - mean) / (std + eps) for r in self.rewards]
        return [r - mean for r in self.rewards]
