"""Before launch, an estimate: "about 4 minutes, 250k tokens" for a training config, on this
machine, from this workspace's measured timings (`store/timings.py`). Torch-free: the dry run's
plan and the TUI launcher call it while you choose a config.

A run's seconds = start-up + held-out evaluations + steps x (waiting for rollouts + the training
pass + checkpoints and bookkeeping). Each part comes from the best measurement there is:

1. Earlier training runs of the same model on the same environments (same mode, LoRA or full,
   processes and inference mode) on this machine: their median step, split into its rollout
   part (scaled by rollouts x completion tokens) and its training part (scaled by trained
   tokens), their start-up and their held-out evaluation time per rollout. The newest three
   runs are used, each gives an estimate, the median is the answer.
2. Else evals of the same model on this machine (`workbench eval run`): the fastest one's
   seconds per generated token, turned into a step's parts by ratios measured on the tiny model
   (`estimate_calibration.py`), with the completion and prompt lengths of the
   evals on the same environments. An eval far slower than its model's size says (PRIOR_BAND)
   measured a busy machine, not a slow one: its lengths are used, the prior's speed.
3. Else a prior from the model's size (parameters read from its safetensors headers), labelled
   rough: seconds per generated token grow with the parameters (PRIOR_*).

Every measurement is scaled from the machine's load average when it was taken to the load now
(`slowdown`): on a shared machine that alone moves a run by 2-3x.

Tokens are the completion tokens the training steps sample (held-out evaluation not counted):
steps x batch_size x the mean completion length measured (else half of max_tokens).

What is not modelled: load that changes during the run, completions that lengthen or shorten as
the policy learns (measured runs of the same env carry it; from an eval it is in the calibration
ratio, measured on reverse-text), difficulty-filter oversampling, checkpoint size (a full
fine-tuning checkpoint of a large model takes seconds to write: it is in measured runs only).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from workbench.engine.timings import ModelIdentity, identify_model
from workbench.store.timings import (
    EvalTiming,
    RunEstimate,
    TrainTiming,
    machine_load,
    read_timings,
    this_machine,
)
from workbench.train.estimate_calibration import (
    BETWEEN_STEPS_S,
    GEN_PER_EVAL_TOKEN,
    HELD_OUT_PER_EVAL_TOKEN,
    LOAD_S_PER_PARAM,
    OWN_LOAD,
    PRIOR_BAND,
    PRIOR_PROMPT_TOKENS,
    PRIOR_S_PER_TOKEN,
    PRIOR_S_PER_TOKEN_PER_PARAM,
    STARTUP_S,
    TRAIN_PER_EVAL_TOKEN,
)
from workbench.train.schema import TRAIN_SAMPLING_DEFAULTS, TrainConfig

RECENT = 3  # measured runs used, newest first: a machine's speed drifts (load, updates, thermals)
SPEED_EVALS = 10  # evals the fastest is taken from


@dataclass(frozen=True)
class Workload:
    """What a run will do, read from its config."""

    steps: int
    batch: int  # rollouts (RL, distillation) or demonstrations (SFT) per step
    on_policy: bool
    held_out_evals: int  # baseline (a new run) + every eval.interval-th step + the last
    held_out_rollouts: int  # per held-out evaluation, over every eval environment
    max_tokens: int

    @classmethod
    def of(cls, c: TrainConfig, start_step: int = 0) -> Workload:
        steps = max(c.max_steps - start_step, 0)
        every = c.eval.interval if c.on_policy else 0
        evals = 0
        if every:
            evals = (start_step == 0) + sum(
                1 for s in range(start_step + 1, c.max_steps + 1) if s % every == 0 or s == c.max_steps
            )
        per_eval = c.eval.num_examples * c.eval.rollouts_per_example * max(1, len(c.eval.env))
        max_tokens = c.sampling.max_tokens or int(TRAIN_SAMPLING_DEFAULTS["max_tokens"])
        return cls(steps, c.batch_size, c.on_policy, evals, per_eval, max_tokens)


@dataclass(frozen=True)
class Parts:
    """One estimate's parts, in seconds (a step's parts per step)."""

    startup: float
    held_out_each: float
    wait: float
    train: float
    between: float
    completion_tokens: float

    def seconds(self, w: Workload) -> float:
        return (
            self.startup
            + w.held_out_evals * self.held_out_each
            + w.steps * (self.wait + self.train + self.between)
        )

    def tokens(self, w: Workload) -> int:
        return round(w.steps * w.batch * self.completion_tokens) if w.on_policy else 0

    def scaled(self, factor: float) -> Parts:
        """The same run on a machine `factor` times slower (its tokens unchanged)."""
        return Parts(
            self.startup * factor,
            self.held_out_each * factor,
            self.wait * factor,
            self.train * factor,
            self.between * factor,
            self.completion_tokens,
        )


def slowdown(others: float) -> float:
    """How many times longer a CPU-bound run takes beside `others` runnable tasks (1 while a core
    is free for it). On a GPU machine the CPUs matter less: there the rule overstates."""
    return max(1.0, (others + OWN_LOAD) / (os.cpu_count() or 1))


def slowdown_then(load: float | None) -> float:
    """The slowdown a recorded run had (1 when its load is not recorded)."""
    return 1.0 if load is None else slowdown(load)


def estimate_train(
    config: TrainConfig,
    *,
    start_step: int = 0,
    nproc: int = 1,
    root: Path | None = None,
    identity: ModelIdentity | None = None,
    load: float | None = None,
) -> RunEstimate:
    """The estimate for `config` (from `start_step`: a resumed run) on this machine, whose load
    average (other tasks than this run) is `load` (default: now)."""
    identity = identity or identify_model(config.model)
    now = slowdown(load if load is not None else machine_load() or 0.0)
    busy = f"; x{now:.1f} for the machine's load now" if now >= 1.3 else ""
    w = Workload.of(config, start_step)
    machine = this_machine()
    mine = [t for t in read_timings(root) if t.machine == machine and t.model_key == identity.key]
    envs = sorted(e.id for e in config.env)
    runs = [
        t
        for t in mine
        if isinstance(t, TrainTiming)
        and sorted(t.env_ids) == envs
        and (t.mode, t.lora, t.world_size, t.inference)
        == (config.mode, config.lora.enabled, nproc, config.inference.mode)
    ][-RECENT:]
    if runs:
        n = len(runs)
        basis = f"from your {'earlier run' if n == 1 else f'{n} earlier runs'} of {identity.label} on {'+'.join(envs)}"
        parts = [_from_run(r, w).scaled(now / slowdown_then(r.load)) for r in runs]
        return _median(parts, w, basis + busy, rough=False)
    evals = [t for t in mine if isinstance(t, EvalTiming) and t.local][-SPEED_EVALS:]
    if evals:
        # The fastest eval is the machine's speed: other load only ever slows a measurement, and
        # an eval's small batches suffer from it far more than a training step (on 2 shared cores:
        # 128 tiny rollouts took 0.4-0.9 s or, with OpenMP threads contending, 7-14 s, while the
        # training run beside them went from 44 to 54-92 s).
        fastest = min(evals, key=lambda t: t.seconds_per_token)
        same_env = [t for t in evals if t.env_id in envs][-RECENT:]
        envs_seen = "+".join(sorted({t.env_id for t in evals}))
        what = f"{'eval' if len(evals) == 1 else f'{len(evals)} evals'} of {identity.label} on {envs_seen}"
        speed = fastest.seconds_per_token / slowdown_then(fastest.load)  # as on an idle machine
        prior = prior_seconds_per_token(identity.params)
        if identity.params and speed > PRIOR_BAND * prior:
            basis = (
                f"lengths from your {what}; speed from the model's size: "
                f"{'that eval' if len(evals) == 1 else 'the fastest'} ran {speed / prior:.0f}x slower, "
                "slowed by other work"
            )
            at_prior = _from_eval(prior, identity.params, same_env, w, config).scaled(now)
            return _median([at_prior], w, basis + busy, rough=False)
        measured = _from_eval(speed, identity.params, same_env, w, config).scaled(now)
        return _median([measured], w, f"from your {what}{busy}", rough=False)
    size = f"{token_count(identity.params)} parameters" if identity.params else "size unknown"
    prior_parts = _from_eval(prior_seconds_per_token(identity.params), identity.params, [], w, config)
    basis = f"no measurements yet, rough: from the model's size, {size}{busy}"
    return _median([prior_parts.scaled(now)], w, basis, rough=True)


def prior_seconds_per_token(params: int | None) -> float:
    """Seconds per generated token a model of this size takes at eval's concurrency (`PRIOR_*`)."""
    return PRIOR_S_PER_TOKEN + PRIOR_S_PER_TOKEN_PER_PARAM * (params or 0)


def _from_run(r: TrainTiming, w: Workload) -> Parts:
    """Scale a measured run to this workload: rollout time by rollouts x completion tokens,
    training time by trained tokens; completions capped by the new max_tokens."""
    length = min(r.completion_tokens, w.max_tokens) if r.completion_tokens else 0.0
    prompt = max(r.sample_tokens - r.completion_tokens, 0.0)
    rollout_scale = (w.batch * length) / (r.batch_size * r.completion_tokens) if r.completion_tokens else 1.0
    train_scale = (w.batch * (prompt + length if w.on_policy else r.sample_tokens)) / max(
        r.batch_size * r.sample_tokens, 1.0
    )
    wait = r.wait_s * rollout_scale
    if r.held_out_s is not None and r.held_out_rollouts:
        held_out = r.held_out_s * w.held_out_rollouts / r.held_out_rollouts
    else:  # never evaluated: at the speed its steps generated
        held_out = wait * w.held_out_rollouts / max(w.batch, 1)
    return Parts(
        r.startup_s, held_out, wait, max(r.step_s - r.wait_s, 0.0) * train_scale, r.between_steps_s, length
    )


def _from_eval(
    s_token: float, params: int | None, lengths: Sequence[EvalTiming], w: Workload, c: TrainConfig
) -> Parts:
    """From an eval's seconds per generated token; completion and prompt lengths from evals on
    the same environments (another environment's say nothing about these: then the prior's)."""
    if lengths:
        length = min(statistics.median(t.completion_tokens for t in lengths), w.max_tokens)
        prompt = statistics.median(t.prompt_tokens for t in lengths)
    else:
        length, prompt = w.max_tokens / 2, PRIOR_PROMPT_TOKENS
    return _parts(s_token, length, prompt, params, w, c)


def _parts(
    s_token: float, length: float, prompt: float, params: int | None, w: Workload, c: TrainConfig
) -> Parts:
    """A run's parts from the seconds per generated token an eval measured (or the prior gives)."""
    wait = GEN_PER_EVAL_TOKEN[c.lora.enabled] * w.batch * length * s_token if w.on_policy else 0.0
    train = TRAIN_PER_EVAL_TOKEN[c.lora.enabled] * w.batch * (prompt + length) * s_token
    held_out = HELD_OUT_PER_EVAL_TOKEN * w.held_out_rollouts * length * s_token
    startup = STARTUP_S + LOAD_S_PER_PARAM * (params or 0)
    return Parts(startup, held_out, wait, train, BETWEEN_STEPS_S, length if w.on_policy else 0.0)


def _median(parts: Sequence[Parts], w: Workload, basis: str, *, rough: bool) -> RunEstimate:
    return RunEstimate(
        seconds=statistics.median(p.seconds(w) for p in parts),
        tokens=round(statistics.median(p.tokens(w) for p in parts)),
        basis=basis,
        rough=rough,
        steps=w.steps,
    )


# ----- words ----------------------------------------------------------------------------------
def duration(seconds: float) -> str:
    """'40 seconds', '3 minutes', '1.5 hours': as precise as an estimate deserves."""
    if seconds < 90:
        return f"{max(5, 5 * round(seconds / 5))} seconds"
    if seconds < 90 * 60:
        minutes = round(seconds / 60)
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds / 3600:.1f} hours"


def token_count(tokens: int) -> str:
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if tokens >= size:
            value = tokens / size
            return f"{value:.{0 if value >= 10 else 1}f}{suffix}"
    return str(tokens)


def describe(estimate: RunEstimate) -> str:
    """'about 3 minutes, 250k tokens (from your 2 earlier runs of tiny on reverse-text)'."""
    tokens = f", {token_count(estimate.tokens)} tokens" if estimate.tokens else ""
    return (
        f"{'roughly' if estimate.rough else 'about'} {duration(estimate.seconds)}{tokens} ({estimate.basis})"
    )


def estimate_text(config: TrainConfig, *, nproc: int = 1, root: Path | None = None) -> str:
    """`describe(estimate_train(...))`, or why there is none: an estimate never stops a plan."""
    return _safely(lambda: describe(estimate_train(config, nproc=nproc, root=root)))


def _safely(make: Callable[[], str]) -> str:
    try:
        return make()
    except Exception as exc:  # a damaged timings file, a model folder being written: say so, go on
        return f"unavailable ({type(exc).__name__}: {exc})"
