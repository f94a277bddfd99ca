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
    """`envs` and `env_names` as given (lists, as in verifiers), `env_map` from name to member.

    Names default to the members' `env_id`s when those are distinct, else to verifiers' defaults
    `env_0`, `env_1`, ... `map_kwargs` (verifiers') has no effect: rows are never `map`-ed here.
    """

    def __init__(
        self,
        envs: Sequence[Environment],
        env_names: Sequence[str] | None = None,
        weights: Sequence[float] | None = None,
        map_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not envs:
            raise ValueError("EnvGroup needs at least one environment")
        if env_names is not None:
            names = list(env_names)
        else:
            ids = [e.env_id for e in envs]
            names = ids if len(set(ids)) == len(ids) else [f"env_{i}" for i in range(len(envs))]
        if len(names) != len(envs) or len(set(names)) != len(names):
            raise ValueError("EnvGroup needs one unique name per environment")
        self.envs: list[Environment] = list(envs)
        self.env_names: list[str] = names
        self.env_map: dict[str, Environment] = dict(zip(names, envs, strict=True))
        self.weights = list(weights) if weights is not None else [1.0] * len(envs)
        if len(self.weights) != len(envs):
            raise ValueError("EnvGroup needs one weight per environment")
        super().__init__(
            dataset=lambda: self._merged_rows("train"), eval_dataset=lambda: self._merged_rows("eval")
        )
        self.rubric = Rubric()  # per-member rubrics do the scoring; see rubric_for
        del map_kwargs  # accepted for verifiers, no effect (see above)

    def _merged_rows(self, split: str) -> list[dict[str, Any]]:
        """Round-robin interleave of the members' rows, each tagged with its member name."""
        per_env = {name: env.rows(split) for name, env in self.env_map.items()}
        merged: list[dict[str, Any]] = []
        for i in range(max(len(rows) for rows in per_env.values())):
            for name, rows in per_env.items():
                if i < len(rows):
                    merged.append({"_member": name, "_row": rows[i]})
        return merged

    def example_from_row(self, index: int, row: dict[str, Any]) -> Example:
        member = self.env_map[row["_member"]]
        example = member.example_from_row(index, row["_row"])
        example.task = row["_member"]
        return example

    def sample_examples(self, n: int, split: str, rng: random.Random) -> list[Example]:
        """`n` examples drawn member-by-weight (for training batches)."""
        names = list(self.env_map)
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
        member = self.env_map[example.task]
        return await member.rollout(client, example, sampling)

    def rubric_for(self, task: str) -> Rubric:
        return self.env_map[task].rubric_for(task)

    def reference_completion(self, example: Example) -> Messages | None:
        return self.env_map[example.task].reference_completion(example)
