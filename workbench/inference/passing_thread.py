"""Torch work in a thread that ends with it, so that no OpenMP thread team outlives the work.

GNU OpenMP (torch's CPU threads) keeps a team of threads for every thread that has run a parallel
op, for as long as that thread lives; with more of its threads than cores it stops spinning
between parallel regions, so each parallel op of every team waits on a wake-up. A `LocalClient`
decodes in its own thread: a team left in the caller's thread by loading (an adapter merged, a
dtype converted) or by training throttles every decode step. Measured on 2 cores, 2 threads: a
98k-element add in the decode thread 6 us alone, 67 us beside such a team; SmolLM2 decoding
~400 -> ~290 tokens/s; `eval run -m <SFT checkpoint>` (64 rollouts) 5.7 s -> 4.2 s with the load
moved into a passing thread. The converse holds too: torch work beside the decode thread's idle
team is slowed, so a colocated trainer's step runs on the decode thread itself
(`LocalClient.run_between_batches`: forward/backward 2.1 s -> 1.5 s, SmolLM2 RL batch 16).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


def in_passing_thread(work: Callable[[], T], *, device: str = "cpu") -> T:
    """`work()`, run in a new thread that ends when it returns (its OpenMP team ends with it);
    its result or exception comes back to the caller. With `device` an accelerator ("cuda",
    "cuda:1"), `work()` runs here: CUDA's current device and stream are per thread (a new thread
    would start on device 0), and the teams only matter for CPU work.

    The thread is a daemon and the wait can be interrupted: a second Ctrl-C during a training step
    stops at once, as it did with the step in the caller's thread (an executor would make the
    exit wait for the step)."""
    if device != "cpu":
        return work()
    outcome: Future[T] = Future()
    threading.Thread(target=settle, args=(work, outcome), name="torch-work", daemon=True).start()
    return outcome.result()


def settle(work: Callable[[], T], outcome: Future[T]) -> None:
    """Run `work()` here and put its result, or its exception, in `outcome` for a waiting caller
    (whose `outcome.result()` returns it, or raises it)."""
    try:
        outcome.set_result(work())
    except BaseException as exc:  # handed to the caller, raised there
        outcome.set_exception(exc)
