"""Environments written for `verifiers` (its classic API, 0.1.11 to 0.3.x), run unchanged.

When a package's `load_environment()` returns a `verifiers.Environment`, the loader wraps it in
`VerifiersEnv`, and nothing above `envs/` knows the difference (DESIGN §2):
- examples: the env's own datasets, as it formats them (`get_eval_dataset()`, `get_dataset()`);
- a rollout: verifiers' own `env.rollout(input, client, model, sampling_args)`, its model calls
  sent to an OpenAI-compatible loopback server in front of the engine's client (`_Loopback`), so
  `-m tiny`, `-b URL` and endpoint ids all work, with the engine's retries, timeouts and
  round-robin, and token ids and sampled logprobs come back for training (the vLLM fields);
- scoring a group: verifiers' own `rubric.score_group(states)`; a function with a weight is a
  per-function reward column, a weight-0 one (and `num_turns`, tool counts) a metric;
- errors: a model call the server failed is an inference error (infrastructure when the server
  answered 429/5xx or not at all); anything else the env raised is an env error on that rollout.

A `verifiers.v1` object (Taskset / Env) goes to its own adapter, `verifiers_v1.py`.

Simplifications: a row's extra dataset columns are not forwarded to reward functions (only
prompt, answer, info, example_id); verifiers' env server (`start_server`) is never used.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from workbench.envs.environment import Environment, RolloutOutput
from workbench.envs.multiturn import assemble_tokens
from workbench.envs.rubric import RolloutScore
from workbench.envs.verifiers_rewards import collecting, record_reward_errors, reward_weights
from workbench.errors import UserError
from workbench.inference.client import Client
from workbench.types import Completion, Example, Messages, RolloutError, SamplingParams, TokenData, is_number

INSTALL = "pip install 'workbench[verifiers]'"
SUPPORTED = "0.1.11 to 0.3.x"  # the classic rollout API (run_group, vf.Client); 0.4 has only verifiers.v1
BRIDGE_MODEL = (
    "workbench"  # the model name verifiers sends; the loopback server answers it with the engine's client
)


def is_verifiers_object(obj: object) -> bool:
    """Whether `obj` comes from the verifiers library (checked by module name: no import)."""
    return any(cls.__module__.split(".")[0] == "verifiers" for cls in type(obj).__mro__)


def wrap(env_id: str, obj: object) -> Environment:
    """`obj` as a Workbench environment, or a one-line UserError saying why it cannot be."""
    import verifiers

    from workbench.envs.verifiers_v1 import is_v1_object, wrap_v1

    version = getattr(verifiers, "__version__", "0")
    if is_v1_object(obj):  # verifiers.v1 (Taskset / Env): its own adapter
        return wrap_v1(env_id, obj)
    if not _supported(version) or not isinstance(obj, verifiers.Environment):
        raise UserError(
            f"environment '{env_id}' needs verifiers {version}, but Workbench's adapter supports "
            f"verifiers {SUPPORTED} ({INSTALL} installs a supported one)"
        )
    _quiet_datasets()
    return VerifiersEnv(env_id, obj)


def _quiet_datasets() -> None:
    """No per-dataset progress bars from `datasets` (verifiers formats rows with `map`)."""
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:
        pass


def _supported(version: str) -> bool:
    try:
        major, minor, patch = (
            int("".join(ch for ch in part if ch.isdigit()) or 0) for part in version.split(".")[:3]
        )
    except ValueError:
        return False
    return (0, 1, 11) <= (major, minor, patch) < (0, 4, 0)


@contextmanager
def kept_signal_handlers() -> Iterator[None]:
    """Building a verifiers env installs its own SIGINT/SIGTERM handlers (they would replace the
    ones that make Ctrl-C save a run and stop it cleanly): put ours back afterwards."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread has handlers
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def silence_disabled_logging() -> None:
    """Without VF_LOG_LEVEL, verifiers' `setup_logging(None)` means "logging disabled", but it
    leaves its logger with no handler, so Python's last-resort handler still prints its warnings,
    bare, into our progress display ("The parser and rubric parser are different..."). A
    NullHandler makes disabled mean disabled; with VF_LOG_LEVEL set, verifiers' own handler
    prints what the user asked for."""
    import logging

    logger = logging.getLogger("verifiers")
    if "verifiers" in sys.modules and not logger.handlers and not os.environ.get("VF_LOG_LEVEL"):
        logger.addHandler(logging.NullHandler())


class VerifiersEnv(Environment):
    """A verifiers classic `Environment` behind Workbench's environment API. See the module doc."""

    def __init__(self, env_id: str, vf_env: Any) -> None:
        super().__init__(
            dataset=lambda: self._vf_rows("train"),
            eval_dataset=lambda: self._vf_rows("eval"),
            system_prompt=vf_env.system_prompt,
            sampling_args=_own_sampling_args(vf_env),
            # The env's own pass@k threshold, where its verifiers version has one.
            pass_threshold=float(getattr(vf_env, "pass_threshold", 0.5)),
        )
        self.env_id = env_id
        self.vf_env = vf_env
        self._loopback = _Loopback()
        record_reward_errors(vf_env.rubric)

    # ----- data: the env's own formatting ------------------------------------------------
    def _vf_rows(self, split: str) -> list[dict[str, Any]]:
        vf = self.vf_env
        has_eval = vf.eval_dataset is not None or getattr(vf, "eval_dataset_source", None) is not None
        try:
            dataset = vf.get_eval_dataset() if split == "eval" and has_eval else vf.get_dataset()
            return [dict(row) for row in dataset]
        except Exception as exc:  # the env's own dataset code: one line, not a traceback
            raise UserError(
                f"environment '{self.env_id}' could not build its {split} dataset: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def format_prompt(self, row: dict[str, Any]) -> Messages:
        # verifiers already added the system prompt and few-shot; a completion-style env's prompt
        # is a plain string, shown as a user message (and sent back as the string, `_vf_prompt`)
        prompt = row["prompt"]
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        messages = [dict(message) for message in prompt]
        # GEPA formats one env's rows with another env's system prompt: this env's prompt wins
        if self.system_prompt is not None:
            system = {"role": "system", "content": self.system_prompt}
            if messages and messages[0].get("role") == "system":
                messages[0] = system
            else:
                messages.insert(0, system)
        return messages

    def _vf_prompt(self, prompt: Messages) -> Messages | str:
        if getattr(self.vf_env, "message_type", "chat") == "completion":
            return "".join(str(m.get("content") or "") for m in prompt)
        return prompt

    def example_from_row(self, index: int, row: dict[str, Any]) -> Example:
        info = row.get("info") or {}
        if isinstance(info, str):
            import json

            info = json.loads(info)
        task = row.get("task")
        return Example(
            example_id=index,
            prompt=self.format_prompt(row),
            answer=str(row.get("answer") or ""),
            info=dict(info),
            task=task if isinstance(task, str) else self.env_id,
        )

    # ----- a rollout: verifiers' own code, our model ----------------------------------------
    async def rollout(self, client: Client, example: Example, sampling: SamplingParams) -> RolloutOutput:
        started = time.perf_counter()
        vf_client = await self._loopback.client_for(client)
        vf_input = {
            "prompt": self._vf_prompt(example.prompt),
            "answer": example.answer,
            "info": example.info,
            "example_id": example.example_id,
        }
        try:
            state = await self.vf_env.rollout(vf_input, vf_client, BRIDGE_MODEL, _sampling_args(sampling))
        except Exception as exc:  # the env's own code failed (verifiers lets non-verifiers errors through)
            return RolloutOutput(
                completion=[],
                state={},
                error=RolloutError.from_exception(exc, "env"),
                stop_condition="error",
                generation_ms=(time.perf_counter() - started) * 1000,
            )
        return _output(state, (time.perf_counter() - started) * 1000)

    async def score_group(self, example: Example, outputs: Sequence[RolloutOutput]) -> list[RolloutScore]:
        states = [o.state for o in outputs if o.state.get("trajectory") is not None]
        rubric = self.vf_env.rubric
        with collecting() as errors:
            if states:
                await (
                    rubric.score_group(states)
                    if self.vf_env.score_rollouts
                    else rubric.dummy_score_group(states)
                )
                for state in states:
                    await rubric.cleanup(state)
        weights = reward_weights(rubric)
        scores = []
        for output in outputs:
            values = {k: float(v) for k, v in (output.state.get("metrics") or {}).items() if is_number(v)}
            rewards = {k: v for k, v in values.items() if weights.get(k, 0.0) != 0.0}
            metrics = {k: v for k, v in values.items() if k not in rewards}
            error = errors.get(id(output.state))  # a reward function raised: 0, as for native envs
            reward = 0.0 if error else float(output.state.get("reward") or 0.0)
            scores.append(RolloutScore(reward, rewards, metrics, error=error))
        return scores


def _own_sampling_args(vf_env: Any) -> dict[str, Any]:
    """The env's preferred sampling settings (e.g. a stop string), under Workbench's names."""
    own = dict(getattr(vf_env, "sampling_args", None) or {})
    extra = own.pop("extra_body", None) or {}
    own.pop("n", None)
    if "max_completion_tokens" in own:
        own["max_tokens"] = own.pop("max_completion_tokens")
    return {**own, **extra}


def _sampling_args(sampling: SamplingParams) -> dict[str, Any]:
    """Workbench's sampling settings as verifiers passes them on (extra_body for the non-OpenAI ones),
    always asking for token ids and sampled logprobs (what training needs; the vLLM fields)."""
    args: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
        "logprobs": True,
    }
    if sampling.stop:
        args["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        args["seed"] = sampling.seed
    extra: dict[str, Any] = {"return_token_ids": True, **sampling.extra}
    if sampling.top_k != -1:
        extra["top_k"] = sampling.top_k
    args["extra_body"] = extra
    return args


def _output(state: Any, generation_ms: float) -> RolloutOutput:
    from verifiers.utils.save_utils import state_to_output

    saved = state_to_output(state, [])
    usage = saved.get("token_usage") or {}
    trajectory = state.get("trajectory") or []
    return RolloutOutput(
        completion=[_message(m) for m in saved.get("completion") or []],
        state=state,  # verifiers' State: scoring reads it, -C state columns come from it
        num_turns=len(trajectory),
        is_truncated=bool(state.get("is_truncated")),
        stop_condition=str(state.get("stop_condition") or ""),
        error=_error(state.get("error")),
        usage={
            "prompt_tokens": int(usage.get("input_tokens") or 0),
            "completion_tokens": int(usage.get("output_tokens") or 0),
        },
        generation_ms=generation_ms,
        tokens=assemble_tokens([_step_tokens(step) for step in trajectory]),
    )


def _message(message: Any) -> dict[str, Any]:
    """A verifiers message (a pydantic model, or already a dict) as an OpenAI-style dict, with tool
    calls in the OpenAI shape (verifiers keeps them as name/arguments)."""
    data = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
    data = {k: v for k, v in data.items() if v not in (None, [], {}) or k == "content"}
    if data.get("content") is None:
        data["content"] = ""
    if data.get("tool_calls"):
        data["tool_calls"] = [_tool_call(call) for call in data["tool_calls"]]
    return data


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    if "function" in call:
        return call
    return {
        "id": call.get("id", ""),
        "type": "function",
        "function": {"name": call.get("name", ""), "arguments": call.get("arguments", "")},
    }


def _step_tokens(step: Any) -> TokenData | None:
    tokens = step.get("tokens") if isinstance(step, dict) else None
    if not tokens or not tokens.get("completion_ids"):
        return None
    return TokenData(
        prompt_ids=list(tokens["prompt_ids"]),
        completion_ids=list(tokens["completion_ids"]),
        completion_logprobs=[float(x) for x in tokens.get("completion_logprobs") or []],
    )


def _error(error: BaseException | None) -> RolloutError | None:
    """verifiers' recorded error as ours: a failed model call is an inference error and no result
    (infrastructure: no answer, a bad key, 4xx, 5xx); the rest (tools, prompts too long) the env's."""
    if error is None:
        return None
    from verifiers import ModelError

    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 10:
        chain.append(chain[-1].__cause__)
    model = any(isinstance(e, ModelError) for e in chain)
    message = " <- ".join(f"{type(e).__name__}: {e}" for e in chain)[:2000]
    return RolloutError(
        type=type(error).__name__,
        message=message,
        where="inference" if model else "env",
        infrastructure=model,
    )


class _Loopback:
    """The engine's client served as an OpenAI-compatible endpoint on a free 127.0.0.1 port, in the
    running event loop (one server per loop; each rollout's client replaces the previous one, so a
    training run's new weights and a new step's retries are used at once)."""

    def __init__(self) -> None:
        self._target: Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._vf_client: Any = None
        self._starting: asyncio.Lock | None = None

    @property
    def model(self) -> str:
        return BRIDGE_MODEL

    async def chat(
        self, messages: Messages, *, sampling: SamplingParams, tools: list[dict[str, Any]] | None = None
    ) -> list[Completion]:
        assert self._target is not None
        return await self._target.chat(messages, sampling=sampling, tools=tools)

    async def close(self) -> None:
        return None

    async def client_for(self, client: Client) -> Any:
        self._target = client
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._vf_client, self._starting = loop, None, asyncio.Lock()
        assert self._starting is not None
        async with self._starting:
            if self._vf_client is None:
                self._vf_client = await self._start()
        return self._vf_client

    async def _start(self) -> Any:
        from openai import AsyncOpenAI
        from verifiers import OpenAIChatCompletionsClient

        from workbench.inference.loopback import serve_loopback

        loopback = await serve_loopback(self, BRIDGE_MODEL)
        # Retries and timeouts are the engine client's (behind the server): none on this side.
        native = AsyncOpenAI(
            base_url=loopback.base_url, api_key="workbench", max_retries=0, timeout=24 * 3600.0
        )
        return OpenAIChatCompletionsClient(native)
