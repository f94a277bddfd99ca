"""A training run's clock: the estimate it starts with (`TrainRun.estimate`), where its seconds
went, and the line it adds to the workspace's `outputs/timings.jsonl` when it ends (what the next
run's estimate is made from: `estimate.py`).

The loop calls it at five places: `begin` once the run's metadata exists, `held_out` around each
held-out evaluation, `steps_begin` before the first step, `finish` as the run ends. Rank 0 alone
estimates and records (the other ranks' steps are the same steps). Nothing here may fail a run:
an estimate or a record that cannot be made is left out.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from workbench.engine.timings import ModelIdentity, identify_model
from workbench.store.runs import TrainRun, now_iso
from workbench.store.timings import TrainTiming, append_timing, machine_load, this_machine
from workbench.train.distributed import DistInfo
from workbench.train.estimate import Workload, estimate_train
from workbench.train.schema import TrainConfig

T = TypeVar("T")
Metrics = dict[str, float]


class RunTimer:
    def __init__(self, config: TrainConfig, dist: DistInfo) -> None:
        self.config, self.dist = config, dist
        self.started = time.monotonic()
        self.steps_started: float | None = None
        self.baseline_s = 0.0  # the held-out evaluation before step 1
        self.held_out_s: list[float] = []  # every held-out evaluation, the baseline's included
        self.start_step = 0
        self.identity: ModelIdentity | None = None
        self.loads: list[float] = []  # other tasks' load, sampled while it runs (at evals and the ends)
        # The load the estimate scales to, taken before the run starts helpers of its own (W&B's
        # service process, data loading) that machine_load would count as other work.
        self.load_before = machine_load()

    def begin(self, metadata: TrainRun, start_step: int) -> None:
        """Estimate the run (its remaining steps, when resumed) into its metadata."""
        self.start_step = start_step
        if not self.dist.is_main:
            return
        with contextlib.suppress(Exception):  # an estimate is a courtesy, never a reason to stop
            self.identity = identify_model(self.config.model)
            metadata.estimate = estimate_train(
                self.config,
                start_step=start_step,
                nproc=self.dist.world_size,
                identity=self.identity,
                load=self.load_before,
            )

    async def held_out(self, evaluation: Awaitable[T]) -> T:
        began = time.monotonic()
        result = await evaluation
        spent = time.monotonic() - began
        self._sample_load()
        self.held_out_s.append(spent)
        if self.steps_started is None:
            self.baseline_s += spent
        return result

    def steps_begin(self) -> None:
        self.steps_started = time.monotonic()
        self._sample_load()

    def _sample_load(self) -> None:
        if (load := machine_load()) is not None:
            self.loads.append(load)

    def finish(self, metadata: TrainRun, history: Sequence[Metrics], status: str) -> None:
        """The actual seconds and tokens beside the estimate; this session's timing appended to
        the workspace's when it ran at least two steps (a median after the first needs them)."""
        if not self.dist.is_main:
            return
        ended = time.monotonic()
        self._sample_load()
        with contextlib.suppress(Exception):
            if metadata.estimate is not None:
                metadata.estimate.actual_s = ended - self.started
                metadata.estimate.actual_tokens = round(
                    sum(m.get("rollout/mean_length", 0.0) for m in history) * self.config.batch_size
                )
            if status in ("finished", "stopped") and len(history) >= 2 and self.steps_started is not None:
                append_timing(self._timing(metadata, history, ended))

    def _timing(self, metadata: TrainRun, history: Sequence[Metrics], ended: float) -> TrainTiming:
        c = self.config
        identity = self.identity or identify_model(c.model)
        assert self.steps_started is not None
        steps = [m.get("time/step", 0.0) for m in history]
        samples = [m.get("rollout/trained_samples", c.batch_size) or c.batch_size for m in history]
        sample_tokens = [
            m.get("perf/tokens_per_s", 0.0) * m.get("time/step", 0.0) / n
            for m, n in zip(history, samples, strict=True)
        ]
        in_loop_held_out = sum(self.held_out_s) - self.baseline_s
        between = (ended - self.steps_started - sum(steps) - in_loop_held_out) / len(history)
        evals = len(self.held_out_s)
        return TrainTiming(
            run_id=metadata.run_id,
            recorded_at=now_iso(),
            machine=this_machine(),
            model=c.model,
            model_key=identity.key,
            model_label=identity.label,
            params=identity.params,
            load=statistics.fmean(self.loads) if self.loads else None,
            env_ids=[e.id for e in c.env],
            mode=c.mode,
            lora=c.lora.enabled,
            world_size=self.dist.world_size,
            inference=c.inference.mode,
            steps=len(history),
            batch_size=c.batch_size,
            completion_tokens=statistics.fmean(m.get("rollout/mean_length", 0.0) for m in history),
            sample_tokens=statistics.fmean(sample_tokens),
            step_s=statistics.median(steps[1:]),
            first_step_s=steps[0],
            wait_s=statistics.median(m.get("time/wait_rollouts", 0.0) for m in history[1:]),
            startup_s=self.steps_started - self.started - self.baseline_s,
            held_out_evals=evals,
            held_out_rollouts=Workload.of(c).held_out_rollouts if evals else 0,
            held_out_s=sum(self.held_out_s) / evals if evals else None,
            between_steps_s=max(between, 0.0),
            total_s=ended - self.started,
        )
