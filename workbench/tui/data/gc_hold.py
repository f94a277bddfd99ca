"""Keeping an open Rollouts screen's objects out of the cyclic collector's full passes (issue 32).

The Rollouts screen holds a freeze while it is open (`hold_gc_freeze` on its first load,
`release_gc_freeze` when it unmounts); the numbers that justify it are in `hold_gc_freeze`.
"""

from __future__ import annotations

import gc

_freeze_holders = 0  # open Rollouts screens that keep the objects of their opening frozen
_frozen_before = False  # whether something else (start-up's release) had frozen objects first


def hold_gc_freeze() -> None:
    """Take what is alive now (modules, the app, this screen's index and table rows: about
    90,000 objects that live at least as long as the screen) out of the cyclic collector's
    full passes.

    Drawing frames allocates, so Python runs a full collection every few dozen cursor steps,
    and walking those objects takes 20-50 ms on a slow machine: a frame over 100 ms every so
    often. Frozen objects are still freed by reference counting; only cycles among them wait
    for `release_gc_freeze`. Kept for a user-visible need (issue 32; benchmarks/tui_open_run.py,
    10,000 rollouts, two runs each on 2 shared, loaded cores): opening 0.58 s with the freeze,
    1.02-1.11 s without (target 0.5 s); single steps p95 83-135 ms with, 147-203 ms without."""
    global _freeze_holders, _frozen_before
    if _freeze_holders == 0:
        _frozen_before = gc.get_freeze_count() > 0
    gc.collect(1)  # the young garbage (cheap): not frozen along with the rest
    gc.freeze()
    _freeze_holders += 1


def release_gc_freeze() -> None:
    """The last Rollouts screen closed: the collector sees its objects again. gc can only unfreeze
    everything, so a freeze made before the screens opened (start-up's, workbench/startup.py) is
    made again over what is still alive once the screens' garbage is collected."""
    global _freeze_holders
    _freeze_holders -= 1
    if _freeze_holders == 0:
        gc.unfreeze()
        if _frozen_before:
            gc.collect()
            gc.freeze()
