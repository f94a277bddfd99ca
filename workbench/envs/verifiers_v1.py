"""Environments written for `verifiers.v1` (Taskset / Task / Env), run unchanged.

A v1 environment package exports its `Taskset` subclass through `__all__` (it has no
`load_environment`); the loader turns such a package into a `load_environment(**taskset_config)`
(`taskset_factory`), and `verifiers_env.wrap` hands a v1 object to `V1Env`. Nothing above
`envs/` knows the difference (DESIGN §2):
- examples: the taskset's own tasks, in its order (the task's system prompt and prompt as the
  chat prompt, its `answer` field as the answer, its other data fields as `info`);
- a rollout: one v1 episode, verifiers' own `env.run_slot(...)` inside `env.serving()`: its
  harness program runs in verifiers' subprocess runtime and its model calls go through
  verifiers' interception server to an OpenAI-compatible loopback server in front of the
  engine's client (`_V1Loopback`), so `-m tiny`, `-b URL` and endpoint ids all work, with the
  engine's retries and round-robin;
- scoring: verifiers scores each trace itself at the end of its episode (the task's `@vf.reward`
  and `@vf.metric` methods); `score_group` reports those scores: a reward with a weight is a
  per-function reward column, a weight-0 reward and every metric a metric;
- errors: what verifiers recorded on the trace (or the episode) becomes the rollout's error: a
  failed model call is an inference error (infrastructure on 429/5xx), a failing reward a reward
  error, anything else the env's. Nothing is raised to the engine.
- tokens for training: the loopback server keeps each model call's token ids and sampled
  logprobs by the session id verifiers sends with every call (the trace id), and a rollout's turns
  are assembled like a multi-turn rollout's (environment tokens masked).

Simplifications:
- every agent seat runs in verifiers' `subprocess` runtime, with the package's own harness or,
  when it has none, the `null` harness (verifiers' plain chat loop with MCP tools; the built-in
  default `bash` would give the model a shell on this machine); each seat is capped at
  `MAX_TURNS` model turns (v1's default is no cap);
- the harness program's PEP 723 dependencies are taken from Workbench's own Python when it has
  them (they are verifiers' own dependencies), instead of a `uv`-built environment that needs the
  network (`_use_this_python`); a harness whose dependencies are missing here still goes to uv;
- `load_environment` arguments are the taskset's config fields; env- and agent-level settings
  (runtimes, retries, timeouts) keep verifiers' defaults;
- a multi-agent env's rollout is its first trainable trace (completion, tokens, scores);
- an infinite taskset is read up to `MAX_TASKS` tasks;
- a task's own sampling settings and v1's env server / worker pool are not used.
"""

from __future__ import annotations

import ast
import asyncio
import contextvars
import hashlib
import itertools
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from workbench.envs.environment import Environment, RolloutOutput
from workbench.envs.multiturn import assemble_tokens
from workbench.envs.rubric import RolloutScore
from workbench.envs.verifiers_env import BRIDGE_MODEL, _Loopback
from workbench.errors import UserError
from workbench.inference.client import Client
from workbench.types import Completion, Example, Messages, RolloutError, SamplingParams, TokenData, is_number

MAX_TURNS = 32  # model turns per agent run: a model that never stops calling tools cannot hold a run forever
MAX_TASKS = 10_000  # tasks read from an infinite taskset
SESSION_HEADER = "X-Session-ID"  # verifiers sends the trace id with every model call (clients/client.py)
_session: contextvars.ContextVar[str | None] = contextvars.ContextVar("workbench_v1_session", default=None)


def is_v1_object(obj: object) -> bool:
    """Whether `obj` (or, for a class, the class itself) comes from `verifiers.v1` (no import)."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any(c.__module__.startswith("verifiers.v1") for c in cls.__mro__)


def _is_v1(obj: object, module: str, name: str) -> bool:
    """Whether `obj`, or its class, derives from the v1 class `module.name` (no import)."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any(c.__module__ == module and c.__name__ == name for c in cls.__mro__)


def taskset_factory(module: ModuleType) -> Callable[..., Any] | None:
    """A `load_environment(**taskset_config)` for a v1 taskset package (one exporting a
    `Taskset` subclass through `__all__`, as verifiers' own loader requires), else None."""
    exported = [getattr(module, name, None) for name in getattr(module, "__all__", None) or []]
    if not any(isinstance(obj, type) and _is_v1(obj, "verifiers.v1.taskset", "Taskset") for obj in exported):
        return None
    taskset_id = module.__name__
    _share_with_subprocesses(module)

    def load_environment(**taskset_config: Any) -> Any:
        import verifiers.v1 as vf

        return vf.load_environment(_env_config(taskset_id, taskset_config))

    return load_environment


def _share_with_subprocesses(module: ModuleType) -> None:
    """Put a workspace package's folder on PYTHONPATH: verifiers starts a package's tool servers
    as `python -m <package>.<module>` subprocesses, which find the package only that way
    (upstream, v1 packages are pip-installed)."""
    file = getattr(module, "__file__", None)
    if not file:
        return
    path = Path(file).resolve()
    folder = str(path.parent.parent if path.name == "__init__.py" else path.parent)
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in entries:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *entries])


def _env_config(taskset_id: str, taskset_config: dict[str, Any]) -> Any:
    """The v1 env config for `taskset_id`: each agent seat in the subprocess runtime, with the
    package's own harness (else `null`), capped at MAX_TURNS."""
    import verifiers.v1 as vf

    harness = vf.default_harness_id(taskset_id)
    harness = "null" if harness == "bash" else harness  # bash hands the model a shell on this machine
    config_cls = vf.env_config_type(taskset_id)
    seats: dict[str, Any] = {}
    for name, field in config_cls.model_fields.items():
        if not isinstance(field.default, vf.AgentConfig):
            continue
        seat: dict[str, Any] = {
            "runtime": {"type": "subprocess"},
            "max_turns": field.default.max_turns or MAX_TURNS,
        }
        if field.default.harness is None:  # a seat the env pinned keeps its own harness
            seat["harness"] = {"id": harness}
        seats[name] = seat
    return vf.resolve_env_config({"taskset": {"id": taskset_id, **taskset_config}, **seats})


def wrap_v1(env_id: str, obj: object) -> V1Env:
    """A v1 `Env` (or a `Taskset`, played by its default env) as a Workbench environment."""
    if _is_v1(obj, "verifiers.v1.env", "Env"):
        return V1Env(env_id, obj)
    if _is_v1(obj, "verifiers.v1.taskset", "Taskset"):
        import verifiers.v1 as vf

        # verifiers builds an env from a taskset id (the module exporting it through __all__)
        taskset_id = getattr(obj.config, "id", "") or type(obj).__module__.split(".")[0]  # type: ignore[attr-defined]
        try:
            env = vf.load_environment(_env_config(taskset_id, obj.config.model_dump(exclude={"id"})))  # type: ignore[attr-defined]
        except Exception as exc:
            raise UserError(
                f"environment '{env_id}': verifiers could not build an env for taskset "
                f"'{taskset_id}': {type(exc).__name__}: {exc}"
            ) from exc
        env.taskset = obj  # this very taskset: its tasks, its config
        return V1Env(env_id, env)
    raise UserError(
        f"environment '{env_id}' is a verifiers v1 {type(obj).__name__}; Workbench runs a v1 "
        f"Env or Taskset (a package exporting its Taskset subclass through __all__)"
    )


class V1Env(Environment):
    """A verifiers v1 `Env` behind Workbench's environment API. See the module doc."""

    def __init__(self, env_id: str, vf_env: Any) -> None:
        super().__init__(dataset=self._task_rows, eval_dataset=self._task_rows)
        self.env_id = env_id
        self.vf_env = vf_env
        self._tasks: list[Any] | None = None
        self._loopback = _V1Loopback()
        self._serving = _Serving(vf_env)
        for harness in {id(h): h for h in getattr(vf_env, "_harnesses", {}).values()}.values():
            _use_this_python(harness)

    # ----- data: the taskset's own tasks --------------------------------------------------
    def tasks(self) -> list[Any]:
        if self._tasks is None:
            taskset = self.vf_env.taskset
            try:
                tasks = itertools.islice(iter(taskset), MAX_TASKS) if taskset.INFINITE else iter(taskset)
                self._tasks = list(tasks)
            except Exception as exc:  # the taskset's own loading code: one line, not a traceback
                raise UserError(
                    f"environment '{self.env_id}' could not load its tasks: {type(exc).__name__}: {exc}"
                ) from exc
        return self._tasks

    def _task_rows(self) -> list[dict[str, Any]]:
        return [_row(task) for task in self.tasks()]

    def example_from_row(self, index: int, row: dict[str, Any]) -> Example:
        return Example(
            example_id=index,
            prompt=[dict(m) for m in row["prompt"]],
            answer=row["answer"],
            info=dict(row["info"]),
            task=self.env_id,
        )

    def _task_for(self, example: Example) -> Any:
        """The example's task; with the system prompt the example carries when it differs
        (GEPA rewrites system prompts)."""
        task = self.tasks()[example.example_id]
        system = (
            example.prompt[0].get("content")
            if example.prompt and example.prompt[0].get("role") == "system"
            else None
        )
        if isinstance(system, str) and system != (task.data.system_prompt or ""):
            task = task.with_system_prompt(system)
        return task

    # ----- a rollout: one v1 episode, our model ---------------------------------------------
    async def rollout(self, client: Client, example: Example, sampling: SamplingParams) -> RolloutOutput:
        from verifiers.v1 import EvalClientConfig, ModelContext
        from verifiers.v1.env import RunSlot

        started = time.perf_counter()
        try:
            base_url = await self._loopback.client_for(client)
            await self._serving.ready()
            ctx = ModelContext(
                model=BRIDGE_MODEL,
                sampling=_sampling(sampling),
                client=EvalClientConfig(base_url=base_url, api_key_var="WORKBENCH_LOOPBACK_KEY"),
            )
            episode = await self.vf_env.run_slot(RunSlot(self._task_for(example)), ctx)
        except Exception as exc:  # verifiers records its own failures; this is one it could not
            return RolloutOutput(
                completion=[],
                state={},
                error=RolloutError.from_exception(exc, "env"),
                stop_condition="error",
                generation_ms=(time.perf_counter() - started) * 1000,
            )
        turns = {trace.id: self._loopback.take(trace.id) for trace in episode.traces}
        return _output(episode, turns, (time.perf_counter() - started) * 1000)

    async def score_group(self, example: Example, outputs: Sequence[RolloutOutput]) -> list[RolloutScore]:
        # verifiers scored each trace at the end of its episode (Rollout.close); report those scores
        return [_score(output.state) for output in outputs]


def _row(task: Any) -> dict[str, Any]:
    """A task as a row: its chat prompt, answer and other data fields (JSON values)."""
    from verifiers.v1.dialects.chat import message_to_wire

    data = task.data
    prompt: Messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        prompt.append({"role": "user", "content": data.prompt})
    elif data.prompt is not None:
        prompt.extend(message_to_wire(m) for m in data.prompt)
    answer = getattr(data, "answer", None)
    info = data.model_dump(mode="json", exclude_unset=True, exclude={"prompt", "system_prompt", "answer"})
    return {"prompt": prompt, "answer": "" if answer is None else str(answer), "info": info}


def _sampling(sampling: SamplingParams) -> Any:
    """Workbench's sampling settings as the v1 sampling config verifiers imposes on every model
    call of the episode (the non-OpenAI ones ride along as extra fields)."""
    from verifiers.v1 import SamplingConfig

    extra: dict[str, Any] = dict(sampling.extra)
    if sampling.top_k != -1:
        extra["top_k"] = sampling.top_k
    if sampling.stop:
        extra["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        extra["seed"] = sampling.seed
    return SamplingConfig(
        temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens, **extra
    )


def _policy_trace(episode: Any) -> Any | None:
    """The trace a Workbench rollout stands for: the (first) trainable one."""
    traces = list(episode.traces)
    trainable = [t for t in traces if getattr(t.agent, "trainable", True)]
    return (trainable or traces or [None])[0]


def _output(episode: Any, turns: dict[str, list[TokenData | None]], generation_ms: float) -> RolloutOutput:
    trace = _policy_trace(episode)
    if trace is None:  # the env's run() failed before any agent ran
        return RolloutOutput(
            completion=[],
            state={},
            error=_error(episode.last_error),
            stop_condition="error",
            generation_ms=generation_ms,
        )
    usage = trace.usage
    steps = turns.get(trace.id) or []
    return RolloutOutput(
        completion=_completion(trace),
        state={
            **trace.to_record(),
            "state": trace.state.model_dump(mode="json"),
        },  # scoring and -C columns read it
        num_turns=trace.num_turns,
        is_truncated=trace.is_truncated,
        stop_condition=str(trace.stop_condition or ""),
        error=_error(trace.last_error or (None if episode.ok else episode.last_error)),
        usage={
            "prompt_tokens": (usage.prompt_tokens + (usage.cached_input_tokens or 0)) if usage else 0,
            "completion_tokens": usage.completion_tokens if usage else 0,
        },
        generation_ms=generation_ms,
        # a turn whose tokens are missing (or an extra recorded call) leaves the rollout without tokens
        tokens=assemble_tokens(steps) if len(steps) == trace.num_turns else None,
    )


def _completion(trace: Any) -> Messages:
    """The final branch's messages from the first model turn on, as OpenAI-style dicts."""
    from verifiers.v1.dialects.chat import message_to_wire

    from workbench.envs.verifiers_env import _message

    branches = trace.branches
    nodes = branches[-1].nodes if branches else []
    first = next((i for i, node in enumerate(nodes) if node.sampled), len(nodes))
    return [_message(message_to_wire(node.message)) for node in nodes[first:]]


def _error(error: Any) -> RolloutError | None:
    """verifiers' recorded error (type name, message, status) as ours: a failed model call is an
    inference error and no result (infrastructure); a prompt too long for the model is the env's
    truncation, not a server failure; a failing reward or
    metric a reward error; the rest (harness, tools, task hooks) the env's."""
    if error is None:
        return None
    if error.type in {"ProviderError", "OverlongPromptError"}:
        where = "inference"
    elif error.type == "TaskError" and " scoring: " in error.message:
        where = "reward"
    else:
        where = "env"
    message = f"{error.type}: {error.message}"[:2000]
    return RolloutError(
        type=error.type,
        message=message,
        where=where,
        infrastructure=error.type == "ProviderError",
    )


def _score(state: dict[str, Any]) -> RolloutScore:
    """The scores verifiers recorded on a trace (None = scoring did not run: no column)."""
    rewards: dict[str, float] = {}
    metrics: dict[str, float] = {}
    total = 0.0
    for name, reward in (state.get("rewards") or {}).items():
        if reward is None:
            continue
        score, weight = float(reward["score"]), float(reward.get("weight", 1.0))
        total += score * weight
        (rewards if weight != 0.0 else metrics)[name] = score
    for name, value in (state.get("metrics") or {}).items():
        if is_number(value):
            metrics[name] = float(value)
    return RolloutScore(total, rewards, metrics)


class _V1Loopback(_Loopback):
    """The classic adapter's loopback server, answering verifiers' v1 eval client (a base URL,
    not a client object), and keeping each call's tokens under the session id verifiers sends
    (the trace id), since v1's eval client does not read token ids back."""

    def __init__(self) -> None:
        super().__init__()
        self._turns: dict[str, list[TokenData | None]] = {}

    async def chat(
        self, messages: Messages, *, sampling: SamplingParams, tools: list[dict[str, Any]] | None = None
    ) -> list[Completion]:
        completions = await super().chat(messages, sampling=sampling, tools=tools)
        session = _session.get()
        if session is not None and completions:
            self._turns.setdefault(session, []).append(completions[0].tokens)
        return completions

    def take(self, session: str) -> list[TokenData | None]:
        return self._turns.pop(session, [])

    async def _start(self) -> str:
        from aiohttp import web

        from workbench.inference.server import create_app

        @web.middleware
        async def remember_session(request: web.Request, handler: Any) -> web.StreamResponse:
            # the handler runs in this task, so `chat` sees the session of its own request
            _session.set(request.headers.get(SESSION_HEADER))
            return await handler(request)

        app = create_app(self, served_model_name=BRIDGE_MODEL)
        app.middlewares.append(remember_session)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}/v1"


class _Serving:
    """`env.serving()` (the interception server, shared tool servers) held open for the event
    loop's life by a task of its own: entering and leaving it in one task keeps its servers'
    task-bound scopes sound, and the loop's shutdown cancels the task, which tears it down."""

    def __init__(self, vf_env: Any) -> None:
        self._vf_env = vf_env
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def ready(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._ready = loop, loop.create_future()
            self._task = loop.create_task(self._hold(self._ready))
        assert self._ready is not None
        await asyncio.shield(self._ready)

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        try:
            async with self._vf_env.serving():
                ready.set_result(None)
                await asyncio.Event().wait()  # until the loop shuts down
        except Exception as exc:  # each rollout records it
            if not ready.done():
                ready.set_exception(exc)


def _use_this_python(harness: Any) -> None:
    """Let verifiers' subprocess runtime run the harness program with this Python when the
    program's PEP 723 dependencies are installed here, instead of a uv-built environment (which
    needs uv and the network). The runtime keeps prepared scripts in a class-level cache keyed
    by the script's digest; a script found there is run as is."""
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    source = getattr(sys.modules.get(type(harness).__module__), "PROGRAM_SOURCE", None)
    cache = getattr(SubprocessRuntime, "_interpreters", None)
    if (
        not isinstance(source, str)
        or not isinstance(cache, dict)
        or not _installed(_script_dependencies(source))
    ):
        return
    digest = hashlib.sha256(source.encode()).hexdigest()
    path = Path(SubprocessRuntime.scripts_dir) / f"{digest}.py"
    if not path.is_file() or path.read_text() != source:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # atomic: other runs may read it
        partial.write_text(source)
        partial.replace(path)
    cache.setdefault(digest, sys.executable)


def _script_dependencies(source: str) -> list[str] | None:
    """The `dependencies` of a PEP 723 `# /// script` block (None when unreadable)."""
    match = re.search(r"^# /// script$(.*?)^# ///$", source, re.MULTILINE | re.DOTALL)
    if match is None:
        return []
    found = re.search(r"^# dependencies = (\[.*?\])$", match.group(1), re.MULTILINE | re.DOTALL)
    try:
        return list(ast.literal_eval(found.group(1))) if found else []
    except (ValueError, SyntaxError):
        return None


def _installed(requirements: list[str] | None) -> bool:
    """Whether every requirement is installed here at a matching version."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import InvalidRequirement, Requirement

    if requirements is None:
        return False
    for text in requirements:
        try:
            requirement = Requirement(text)
            if not requirement.specifier.contains(version(requirement.name), prereleases=True):
                return False
        except (InvalidRequirement, PackageNotFoundError):
            return False
    return True
