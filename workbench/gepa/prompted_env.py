"""`PromptedEnvs`: the environment as it is with each candidate system prompt.

A GEPA candidate is `{"system_prompt": ...}`. Environments take their instruction as the
`system_prompt` argument of `load_environment`, and may use it in more than the first message
(a tool env may append tool descriptions), so each candidate gets its own env instance, loaded
with that prompt — never a string swap inside ready-made prompts. Rows come from the first load
only, so every candidate is scored on exactly the same examples (and data is built once).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any

from workbench.envs.environment import Environment
from workbench.envs.loader import find_environment, import_env_module, load_environment
from workbench.errors import UserError
from workbench.types import Example

SYSTEM_PROMPT_COMPONENT = "system_prompt"  # the one text component GEPA evolves
_PROBE = "<<workbench-gepa-probe: the candidate system prompt goes here>>"


def require_system_prompt_arg(env_id: str) -> None:
    """UserError unless the env's load_environment() accepts `system_prompt` (what GEPA optimizes)."""
    source = find_environment(env_id)
    if source is None:
        load_environment(env_id)  # raises the loader's own 'unknown environment' message
        return
    factory = getattr(import_env_module(source), "load_environment", None)
    if factory is None:
        return  # the loader reports this one
    params = inspect.signature(factory).parameters
    if SYSTEM_PROMPT_COMPONENT in params or any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    raise UserError(f"environment '{env_id}' cannot be prompt-optimized: its load_environment() has no "
                    f"`system_prompt` argument (GEPA evolves the system prompt; add `system_prompt: str = ...` "
                    f"and pass it to the Environment)")


class PromptedEnvs:
    """Loads the env once per candidate prompt (a small LRU cache) and builds its examples."""

    def __init__(self, env_id: str, env_args: dict[str, Any], cache_size: int = 8) -> None:
        require_system_prompt_arg(env_id)
        self.env_id = env_id
        self.env_args = {k: v for k, v in env_args.items() if k != SYSTEM_PROMPT_COMPONENT}
        self.base = load_environment(env_id, **env_args)
        seed = env_args.get(SYSTEM_PROMPT_COMPONENT, self.base.system_prompt)
        self.seed_prompt: str = seed if isinstance(seed, str) else ""
        self.cache_size = cache_size
        self._envs: OrderedDict[str, Environment] = OrderedDict()
        self._envs[self.seed_prompt] = self.base
        self._check_prompt_is_used()

    def _check_prompt_is_used(self) -> None:
        """An env may accept `system_prompt` through **kwargs and drop it: then GEPA would optimize nothing."""
        rows = self.rows("train") or self.rows("eval")
        if not rows:
            raise UserError(f"environment '{self.env_id}' has no examples")
        probe = self.env_for(_PROBE).example_from_row(0, rows[0])
        if _PROBE not in repr(probe.prompt):
            raise UserError(f"environment '{self.env_id}' accepts `system_prompt` but does not put it in its "
                            f"prompts, so GEPA has nothing to optimize")
        self._envs.pop(_PROBE, None)

    def rows(self, split: str) -> list[dict[str, Any]]:
        return self.base.rows(split)

    @property
    def sampling_args(self) -> dict[str, Any]:
        return self.base.sampling_args

    def env_for(self, prompt: str) -> Environment:
        """The env loaded with `prompt` as its system prompt (cached)."""
        env = self._envs.get(prompt)
        if env is not None:
            self._envs.move_to_end(prompt)
            return env
        env = load_environment(self.env_id, **self.env_args, system_prompt=prompt)
        self._envs[prompt] = env
        while len(self._envs) > self.cache_size:
            oldest = next(iter(self._envs))
            if self._envs[oldest] is self.base:  # keep the base: its rows are the dataset
                self._envs.move_to_end(oldest)
                oldest = next(iter(self._envs))
            self._envs.pop(oldest)
        return env

    def examples(self, prompt: str, split: str, indices: list[int]) -> tuple[Environment, list[Example]]:
        """The env for `prompt` and its examples for rows `indices` of `split` (ids = row indices)."""
        env = self.env_for(prompt)
        rows = self.rows(split)
        return env, [env.example_from_row(i, rows[i]) for i in indices]
