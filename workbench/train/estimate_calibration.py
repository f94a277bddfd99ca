"""The numbers `estimate.py` turns measurements into seconds with, each with how it was measured.

They were measured on this repo's development machine: 2 CPU cores shared with other jobs, the
tiny model. `python benchmarks/estimate_accuracy.py --calibrate N` measures the eval-to-training
ratios again for N new README pairs; `python benchmarks/estimate_accuracy.py` checks the estimate
against the README's training run.
"""

from __future__ import annotations

# ----- calibration: measured on the tiny model on this repo's machine (2 shared CPU cores) ---------
# Ratios of a training run's parts to an eval's seconds per generated token ("s/token") times that
# part's tokens, for the README sequence: `eval run reverse-text -m tiny -n 64 -r 2` (128 rollouts,
# 32 in flight, 22 completion and 122 prompt tokens each), then configs/rl/reverse-text.toml with
# max_steps=20 (LoRA r 16, 128 rollouts a step, held-out eval of 128 rollouts before the first step
# and at steps 10 and 20). On the idle-ish machine (load averages ~2, runs included) evals took 0.4 to
# 0.9 s (0.14-0.32 ms a token: 0.2 ms is the typical one used below) and three training runs
# 41-44 s: a median step of 1.75-1.79 s, of which 0.83-1.0 s waiting for rollouts, 4.7-5.6 s
# start-up, 1.3-1.5 s per held-out eval, 0.014 s between steps. `python
# benchmarks/estimate_accuracy.py --calibrate N` prints these ratios for N new pairs. They carry
# what an eval does not show: LoRA layers generating, a step's 128 rollouts in flight against the
# eval's 32, completions lengthening as RL learns the answer format (22 -> 36 tokens on average).
# Full fine-tuning (lora.enabled = false, 8-step runs back to back with LoRA ones, same load): its
# rollouts took 0.6x as long (no adapter layers), its training pass 0.7-1.0x (tiny's weights are few).
# keyed by lora.enabled: a step's rollout wait / (batch x completion x s/token), and its training
# pass / (batch x (prompt + completion) x s/token)
GEN_PER_EVAL_TOKEN = {True: 1.7, False: 1.0}
TRAIN_PER_EVAL_TOKEN = {True: 0.22, False: 0.2}
HELD_OUT_PER_EVAL_TOKEN = 2.5  # one held-out evaluation / (its rollouts x completion x s/token)
STARTUP_S = 5.0  # run start to step 1, baseline eval excluded (model, LoRA, envs, W&B offline)
BETWEEN_STEPS_S = 0.015  # checkpoints (LoRA: a few MB), metadata, run.log, per step
# The prior (no measurement of the model here): s/token at eval's 32 in flight =
# PRIOR_S_PER_TOKEN + PRIOR_S_PER_TOKEN_PER_PARAM x parameters. tiny (0.67M parameters): 0.2 ms,
# overhead-bound (above). smollm2-135m: 18 ms a token with OMP_WAIT_POLICY=PASSIVE at load 5 on the
# 2 cores, tiny 0.3-0.8 ms at the same moment; the 40% of the CPU it got makes ~7 ms idle.
PRIOR_S_PER_TOKEN = 1.7e-4
PRIOR_S_PER_TOKEN_PER_PARAM = 5e-11
PRIOR_PROMPT_TOKENS = 128  # an unmeasured environment's prompt (reverse-text's is 122)
# Loading smollm2-135m and wrapping it in LoRA took 7.2 s at load 5 (~3 s idle): 2.5e-8 s a parameter.
LOAD_S_PER_PARAM = 2.5e-8
# An eval more than this many times slower than the prior for its model's size is taken to say how
# busy the machine was, not how fast it is: on these 2 shared cores, with other jobs running, the
# tiny model's evals took 1-11 ms a token (OpenMP threads busy-waiting starve the eval's small
# batches: with OMP_WAIT_POLICY=PASSIVE the same evals took 0.3-0.8 ms) while the training runs
# beside them slowed 2-3x, not 10-50x. Faster than the prior is always believed (a faster machine, a GPU).
PRIOR_BAND = 4.0
# A busy machine: a CPU-bound run gets its share of the cores, so it takes (other tasks + its own
# load) / cores times as long once that exceeds 1 (`slowdown`). Records keep the other tasks' load
# they ran beside (store.timings.machine_load) and an estimate scales each measurement from it to
# the load now. OWN_LOAD: what a run adds itself (the README's training run used 36 CPU-s in 41 s
# with 2 torch threads; its eval 8.7 CPU-s in 13 s). The calibration above ran beside at most one
# other busy task (load averages 2.0-2.4 with the run's own): no slowdown on 2 cores. Checked on
# the README pair at load averages of 5-6 with tasks runnable throughout: runs took 86-164 s
# (median ~100) where idle ones took 44 s; the rule gives x2.5-3.
OWN_LOAD = 1.0
