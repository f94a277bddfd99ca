"""`Environment`: a dataset, an interaction protocol and a rubric.

Datasets are plain lists of rows (dicts) — or a zero-argument callable that builds them, so an
environment loads instantly and makes its data only when asked. A row has `question` (a user
message) or `prompt` (chat messages), and optionally `answer`, `info` and `task`.
Subclasses implement `rollout`; `MultiTurnEnv` (multiturn.py) provides the usual loop.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.envs.parsers import Parser
from workbench.envs.rubric import Rubric, RolloutScore, ScoringInput
from workbench.inference.client import Client
from workbench.types import Example, Messages, RolloutError, SamplingParams, State, TokenData

Rows = list[dict[str, Any]]
Dataset = Rows | Callable[[], Rows]


@dataclass
class RolloutOutput:
    """What an environment returns for one rollout (before scoring)."""

    completion: Messages
    state: State
    num_turns: int = 0
    is_truncated: bool = False
    stop_condition: str = ""
    error: RolloutError | None = None
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0})
    generation_ms: float = 0.0
    tokens: TokenData | None = None


class Environment(ABC):
    """Base class of every environment. `env_id` is set by the loader."""

    env_id: str = "environment"

    def __init__(
        self,
        dataset: Dataset | None = None,
        eval_dataset: Dataset | None = None,
        system_prompt: str | None = None,
        few_shot: Messages | None = None,
        parser: Parser | None = None,
        rubric: Rubric | None = None,
        sampling_args: dict[str, Any] | None = None,
    ) -> None:
        if dataset is None and eval_dataset is None:
            raise ValueError("an environment needs a dataset or an eval_dataset")
        self._dataset = dataset
        self._eval_dataset = eval_dataset
        self._rows: dict[str, Rows] = {}
        self.system_prompt = system_prompt
        self.few_shot = few_shot or []
        self.parser = parser or Parser()
        self.rubric = rubric or Rubric(parser=self.parser)
        # Environment-preferred sampling settings (e.g. a stop string); user flags override them.
        self.sampling_args = sampling_args or {}

    # ----- data -------------------------------------------------------------------------
    def rows(self, split: str) -> Rows:
        """The raw rows of `split` ('train' or 'eval'; eval falls back to train and vice versa)."""
        if split not in self._rows:
            source = self._eval_dataset if split == "eval" else self._dataset
            source = source if source is not None else (self._dataset if split == "eval" else self._eval_dataset)
            self._rows[split] = list(source() if callable(source) else source)  # type: ignore[misc]
        return self._rows[split]

    def format_prompt(self, row: dict[str, Any]) -> Messages:
        if "prompt" in row:
            prompt = copy.deepcopy(row["prompt"])
            if self.system_prompt and not (prompt and prompt[0].get("role") == "system"):
                prompt.insert(0, {"role": "system", "content": self.system_prompt})
            return prompt
        messages: Messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.extend(copy.deepcopy(self.few_shot))
        messages.append({"role": "user", "content": row["question"]})
        return messages

    def get_examples(self, n: int = -1, split: str = "eval", offset: int = 0) -> list[Example]:
        """The first `n` examples of `split` (all when n < 0), ids stable across calls."""
        rows = self.rows(split)
        end = len(rows) if n < 0 else min(len(rows), offset + n)
        return [self.example_from_row(i, rows[i]) for i in range(offset, end)]

    def example_from_row(self, index: int, row: dict[str, Any]) -> Example:
        return Example(
            example_id=index,
            prompt=self.format_prompt(row),
            answer=str(row.get("answer", "")),
            info=dict(row.get("info", {})),
            task=row.get("task", self.env_id),
        )

    # ----- interaction ------------------------------------------------------------------
    @property
    def oai_tools(self) -> list[dict[str, Any]] | None:
        return None

    def init_state(self, example: Example) -> State:
        return {
            "example_id": example.example_id,
            "prompt": example.prompt,
            "answer": example.answer,
            "info": example.info,
            "task": example.task,
            "completion": [],
            "responses": [],
            "turn": 0,
        }

    @abstractmethod
    async def rollout(self, client: Client, example: Example, sampling: SamplingParams) -> RolloutOutput:
        """Run one trajectory. Must not raise for env or model errors: set `error` instead."""

    # ----- scoring ----------------------------------------------------------------------
    def rubric_for(self, task: str) -> Rubric:
        return self.rubric

    async def score_group(self, example: Example, outputs: Sequence[RolloutOutput]) -> list[RolloutScore]:
        items = [
            ScoringInput(prompt=example.prompt, completion=o.completion, answer=example.answer, state=o.state,
                         info=example.info, task=example.task, example_id=example.example_id)
            for o in outputs
        ]
        return await self.rubric_for(example.task).score_group(items)

    def reference_completion(self, example: Example) -> Messages | None:
        """A demonstration of a correct answer (used to warm-start models with SFT), if the env has one."""
        return None
