"""`PromptedEnvs`: the environment as it is with each candidate system prompt.

A GEPA candidate is `{"system_prompt": ...}`. Environments take their instruction as the
`system_prompt` argument of `load_environment`, and may use it in more than the first message
(a tool env may append tool descriptions), so each candidate gets its own env instance, loaded
with that prompt — never a string swap inside ready-made prompts. Rows come from the first load
only, so every candidate is scored on exactly the same examples (and data is built once).
"""

from __future__ import annotations

import inspect
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from workbench.envs.environment import Environment
from workbench.envs.loader import find_environment, import_env_module, load_environment
from workbench.errors import UserError
from workbench.types import Example, Message

SYSTEM_PROMPT_COMPONENT = "system_prompt"  # the one text component GEPA evolves
FEW_SHOT_ARG = "few_shot"  # demonstrations as earlier turns (verifiers' name), which DSPy optimizers pick
_PROBE = "<<workbench-gepa-probe: the candidate system prompt goes here>>"


def load_environment_factory(env_id: str) -> Callable[..., Any]:
    """The env module's load_environment (the loader's own one-line errors when there is none)."""
    source = find_environment(env_id)
    factory = getattr(import_env_module(source), "load_environment", None) if source is not None else None
    if factory is None:
        load_environment(env_id)  # raises the loader's own message ('unknown environment', no factory)
        return lambda **_: None
    return factory


def require_system_prompt_arg(env_id: str) -> None:
    """UserError unless the env's load_environment() accepts `system_prompt` (what GEPA optimizes)."""
    params = inspect.signature(load_environment_factory(env_id)).parameters
    if SYSTEM_PROMPT_COMPONENT in params or any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    raise UserError(
        f"environment '{env_id}' cannot be prompt-optimized: its load_environment() has no "
        f"`system_prompt` argument (GEPA evolves the system prompt; add `system_prompt: str = ...` "
        f"and pass it to the Environment)"
    )


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
        self.takes_few_shot = FEW_SHOT_ARG in inspect.signature(load_environment_factory(env_id)).parameters
        self._envs: OrderedDict[tuple[str, str], Environment] = OrderedDict()
        self._lock = threading.RLock()  # DSPy scores candidates from several threads
        self._envs[(self.seed_prompt, "")] = self.base
        self._check_prompt_is_used()

    def _check_prompt_is_used(self) -> None:
        """An env may accept `system_prompt` through **kwargs and drop it: then GEPA would optimize nothing."""
        rows = self.rows("train") or self.rows("eval")
        if not rows:
            raise UserError(f"environment '{self.env_id}' has no examples")
        probe = self.env_for(_PROBE).example_from_row(0, rows[0])
        if _PROBE not in repr(probe.prompt):
            raise UserError(
                f"environment '{self.env_id}' accepts `system_prompt` but does not put it in its "
                f"prompts, so GEPA has nothing to optimize"
            )
        self._envs.pop((_PROBE, ""), None)

    def rows(self, split: str) -> list[dict[str, Any]]:
        return self.base.rows(split)

    @property
    def sampling_args(self) -> dict[str, Any]:
        return self.base.sampling_args

    def env_for(self, prompt: str, few_shot: Sequence[Message] = ()) -> Environment:
        """The env loaded with `prompt` as its system prompt and `few_shot` turns (cached)."""
        key = (prompt, json.dumps(list(few_shot), sort_keys=True) if few_shot else "")
        with self._lock:
            return self._cached(key, prompt, few_shot)

    def _cached(self, key: tuple[str, str], prompt: str, few_shot: Sequence[Message]) -> Environment:
        env = self._envs.get(key)
        if env is not None:
            self._envs.move_to_end(key)
            return env
        args: dict[str, Any] = {**self.env_args, SYSTEM_PROMPT_COMPONENT: prompt}
        if few_shot:
            if not self.takes_few_shot:
                raise UserError(
                    f"environment '{self.env_id}' has no `few_shot` argument: render demonstrations "
                    f"into the system prompt instead"
                )
            args[FEW_SHOT_ARG] = [dict(m) for m in few_shot]
        env = load_environment(self.env_id, **args)
        self._envs[key] = env
        while len(self._envs) > self.cache_size:
            oldest = next(iter(self._envs))
            if self._envs[oldest] is self.base:  # keep the base: its rows are the dataset
                self._envs.move_to_end(oldest)
                oldest = next(iter(self._envs))
            self._envs.pop(oldest)
        return env

    def examples(
        self, prompt: str, split: str, indices: list[int], few_shot: Sequence[Message] = ()
    ) -> tuple[Environment, list[Example]]:
        """The env for `prompt` (+ `few_shot`) and its examples for rows `indices` of `split` (ids = row indices)."""
        env = self.env_for(prompt, few_shot)
        rows = self.rows(split)
        return env, [env.example_from_row(i, rows[i]) for i in indices]
