"""`Environment`: a dataset, an interaction protocol and a rubric.

Datasets are plain lists of rows (dicts) or a `datasets.Dataset` — or a zero-argument callable
that builds either, so an environment loads instantly and makes its data only when asked. A row
has `question` (a user message) or `prompt` (chat messages), and optionally `answer`, `info` (a
dict or a JSON string) and `task`. Subclasses implement `rollout`; `MultiTurnEnv` (multiturn.py)
provides the usual loop.

The constructor also takes verifiers' `Environment` arguments, so a verifiers environment ports by
changing its import; each is either used or documented as having no effect here.
"""

from __future__ import annotations

import copy
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.envs.dataset_rows import RowTable, row_info, rows_of
from workbench.envs.messages import as_messages
from workbench.envs.parsers import Parser
from workbench.envs.rubric import RolloutScore, Rubric, ScoringInput
from workbench.inference.client import Client
from workbench.types import (
    Example,
    Messages,
    RolloutError,
    SamplingParams,
    State,
    TokenData,
)

Rows = list[dict[str, Any]]
# A list of rows or a `datasets.Dataset` (`datasets` is not imported here), or a builder of either.
Dataset = Rows | RowTable | Callable[[], Rows | RowTable]


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
    tokens: TokenData | None = None  # the whole rollout as one sequence (see multiturn.assemble_tokens)
    turn_tokens: list[TokenData] = field(default_factory=list)  # each model turn's own ids, for RL


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
        *,
        env_id: str | None = None,
        env_args: dict[str, Any] | None = None,
        message_type: str = "chat",
        tool_defs: list[dict[str, Any]] | None = None,
        score_rollouts: bool = True,
        max_workers: int | None = None,
        max_concurrent: int | None = None,
        max_seq_len: int | None = None,
        map_kwargs: dict[str, Any] | None = None,
        pass_threshold: float = 0.5,
    ) -> None:
        """The keyword-only arguments are verifiers' (so its environments port by an import):

        - `env_id`, `env_args`: kept (the loader sets `env_id` to the id the env was loaded by).
        - `message_type`: "chat", or verifiers' deprecated "completion" (a text prompt the model
          continues): its text is sent as one user message through the chat API, as Workbench's
          verifiers adapter sends it too; no raw-text completions endpoint is used.
        - `tool_defs`: tools offered to the model, in verifiers' form `{"name", "description",
          "parameters"}` or OpenAI's `{"type": "function", "function": ...}`; the environment's
          `env_response` answers the calls (ToolEnv builds its own from its functions).
        - `score_rollouts=False`: rollouts are not scored (reward 0, no reward columns).
        - `max_workers`, `max_concurrent`: no effect; concurrency is the engine's (`--max-concurrent`).
        - `max_seq_len`: no effect; the server's context length and `max_tokens` bound a rollout.
        - `map_kwargs`: no effect; datasets are read row by row, never `map`-ed here.
        - `pass_threshold`: verifiers' pass@k threshold: a rollout with reward >= it counts as
          passed in the eval summary's and held-out eval's pass@k.
        """
        if dataset is None and eval_dataset is None:
            raise ValueError("an environment needs a dataset or an eval_dataset")
        if message_type not in ("chat", "completion"):
            raise ValueError(f"message_type must be 'chat' or 'completion', not {message_type!r}")
        self._dataset = dataset
        self._eval_dataset = eval_dataset
        self._rows: dict[str, Rows] = {}
        self.system_prompt = system_prompt
        self.few_shot = few_shot or []
        self.parser = parser or Parser()
        self.rubric = rubric or Rubric(parser=self.parser)
        # Environment-preferred sampling settings (e.g. a stop string); user flags override them.
        # verifiers nests server-specific settings under "extra_body": they go to the server as they are.
        sampling_args = dict(sampling_args or {})
        self.sampling_args = {
            **{k: v for k, v in sampling_args.items() if k != "extra_body"},
            **(sampling_args.get("extra_body") or {}),
        }
        if env_id:
            self.env_id = env_id
        self.env_args = dict(env_args or {})
        self.message_type = message_type
        self.tool_defs = [_openai_tool(t) for t in tool_defs] if tool_defs else None
        self.score_rollouts = score_rollouts
        self.pass_threshold = pass_threshold
        del (
            max_workers,
            max_concurrent,
            max_seq_len,
            map_kwargs,
        )  # accepted for verifiers, no effect (see above)

    # ----- data -------------------------------------------------------------------------
    def rows(self, split: str) -> Rows:
        """The raw rows of `split` ('train' or 'eval'; eval falls back to train and vice versa)."""
        if split not in self._rows:
            source = self._eval_dataset if split == "eval" else self._dataset
            source = (
                source if source is not None else (self._dataset if split == "eval" else self._eval_dataset)
            )
            assert source is not None  # the constructor refuses an environment without either
            self._rows[split] = rows_of(source() if callable(source) else source)
        return self._rows[split]

    def format_prompt(self, row: dict[str, Any]) -> Messages:
        if "prompt" in row:
            if self.few_shot:  # as in verifiers: a row that brings its own prompt keeps it as it is
                warnings.warn("the dataset has a 'prompt' column, so few_shot is not used", stacklevel=2)
            prompt = copy.deepcopy(row["prompt"])
            if isinstance(prompt, str):  # a completion-style env's text (see message_type)
                prompt = [{"role": "user", "content": prompt}]
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
            answer="" if row.get("answer") is None else str(row["answer"]),
            info=row_info(row),
            task=row.get("task", self.env_id),
        )

    # ----- interaction ------------------------------------------------------------------
    @property
    def oai_tools(self) -> list[dict[str, Any]] | None:
        return self.tool_defs

    def init_state(self, example: Example) -> State:
        """A fresh rollout state. Its messages are ChatMessages (dict and attribute access)."""
        return {
            "example_id": example.example_id,
            "prompt": as_messages(example.prompt),
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
        if not self.score_rollouts:
            return [RolloutScore(reward=0.0, rewards={}, metrics={}) for _ in outputs]
        items = [  # reward functions get ChatMessages: `m.content` works as well as `m["content"]`
            ScoringInput(
                prompt=as_messages(example.prompt),
                completion=as_messages(o.completion),
                answer=example.answer,
                state=o.state,
                info=example.info,
                task=example.task,
                example_id=example.example_id,
            )
            for o in outputs
        ]
        return await self.rubric_for(example.task).score_group(items)

    def reference_completion(self, example: Example) -> Messages | None:
        """A demonstration of a correct answer (used to warm-start models with SFT), if the env has one."""
        return None


def _openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool definition in OpenAI's form, from verifiers' flat form or OpenAI's own."""
    if tool.get("type") == "function" and "function" in tool:
        return tool
    if "name" not in tool:
        raise ValueError(f"a tool definition needs a name: {tool!r}")
    function = {
        "name": tool["name"],
        "description": tool.get("description", ""),
        "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
    }
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}
