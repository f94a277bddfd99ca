"""`EnvGroup`: several environments behind one, routed by each example's `task`.

Examples are interleaved across members (so the first n cover every env), `task` is the
member's name, and rollouts and scoring go to that member. `weights` set how often training
samples each member (see `sample_examples`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from workbench.envs.environment import Environment, RolloutOutput
from workbench.envs.rubric import Rubric
from workbench.inference.client import Client
from workbench.types import Example, Messages, SamplingParams


class EnvGroup(Environment):
    def __init__(self, envs: Sequence[Environment], env_names: Sequence[str] | None = None,
                 weights: Sequence[float] | None = None) -> None:
        if not envs:
            raise ValueError("EnvGroup needs at least one environment")
        names = list(env_names) if env_names is not None else [e.env_id for e in envs]
        if len(names) != len(envs) or len(set(names)) != len(names):
            raise ValueError("EnvGroup needs one unique name per environment")
        self.envs: dict[str, Environment] = dict(zip(names, envs, strict=True))
        self.weights = list(weights) if weights is not None else [1.0] * len(envs)
        super().__init__(dataset=lambda: self._merged_rows("train"), eval_dataset=lambda: self._merged_rows("eval"))
        self.rubric = Rubric()  # per-member rubrics do the scoring; see rubric_for

    def _merged_rows(self, split: str) -> list[dict[str, Any]]:
        """Round-robin interleave of the members' rows, each tagged with its member name."""
        per_env = {name: env.rows(split) for name, env in self.envs.items()}
        merged: list[dict[str, Any]] = []
        for i in range(max(len(rows) for rows in per_env.values())):
            for name, rows in per_env.items():
                if i < len(rows):
                    merged.append({"_member": name, "_row": rows[i]})
        return merged

    def example_from_row(self, index: int, row: dict[str, Any]) -> Example:
        member = self.envs[row["_member"]]
        example = member.example_from_row(index, row["_row"])
        example.task = row["_member"]
        return example

    def sample_examples(self, n: int, split: str, rng: random.Random) -> list[Example]:
        """`n` examples drawn member-by-weight (for training batches)."""
        names = list(self.envs)
        rows = self.rows(split)
        by_member: dict[str, list[int]] = {name: [] for name in names}
        for index, row in enumerate(rows):
            by_member[row["_member"]].append(index)
        picks = rng.choices(names, weights=self.weights, k=n)
        return [self.example_from_row(i, rows[i]) for i in (rng.choice(by_member[name]) for name in picks)]

    @property
    def oai_tools(self) -> list[dict[str, Any]] | None:
        return None  # each member passes its own tools in its own rollout

    async def rollout(self, client: Client, example: Example, sampling: SamplingParams) -> RolloutOutput:
        member = self.envs[example.task]
        return await member.rollout(client, example, sampling)

    def rubric_for(self, task: str) -> Rubric:
        return self.envs[task].rubric_for(task)

    def reference_completion(self, example: Example) -> Messages | None:
        return self.envs[example.task].reference_completion(example)
