"""A command's start-up without the garbage collector's tax.

Importing torch and transformers (verifiers and datasets too, for a verifiers environment)
creates about half a million long-lived objects. The cyclic collector, triggered by allocation
counts, runs a full collection over the growing heap every time it grows by a quarter: 7-9 of
them in one `workbench serve`/`train`/`eval run` start, 1-2.5 s of CPU out of a 5-7 s start
(measured on 2 cores: `import torch, transformers` 4.8 s with the collector on, 3.9 s off). None
of what they scan is garbage. Still worth it with children started as fresh interpreters
(issue 32, 2 shared cores, OMP_NUM_THREADS=1, median of 5): `workbench eval run reverse-text -m
tiny -n 8` takes 4.4 CPU-s with the hold and 6.0 without (7 full collections, 0.95 s of them
inside the collector); `workbench --help` imports no torch and is 0.25 s either way.

`hold()`, called at CLI entry, turns the collector off. `release()`, called where a command's
start-up ends and its long-running part begins (the engine's first rollout, the trainer's first
step, a server bound to its port, the TUI mounted), freezes what exists (`gc.freeze`: imported
modules and loaded models stay out of every later collection, so those are cheaper too) and turns
the collector back on. A command with no such point gets it back `FALLBACK_S` after start, so a
long job never runs without it. Only a process whose CLI entry called `hold` is affected:
`release` does nothing in library use (tests, notebooks, the TUI's in-process screens).
"""

from __future__ import annotations

import gc
import os
import threading
import warnings

FALLBACK_S = 30.0  # a missed release point costs at most this long without cycle collection

_held = False
_lock = threading.Lock()
_fallback: threading.Timer | None = None  # the pending FALLBACK_S release (tests join it)


def hold() -> None:
    """Turn the cyclic collector off until `release` (or `FALLBACK_S` seconds)."""
    global _held, _fallback
    with _lock:
        if _held or not gc.isenabled():
            return
        gc.disable()
        _held = True
        _fallback = threading.Timer(FALLBACK_S, release)
        _fallback.daemon = True  # never keeps a finished command alive
        _fallback.start()


def release() -> None:
    """Start-up is over: freeze the objects made so far and turn the collector back on."""
    global _held
    with _lock:
        if not _held:
            return
        _held = False
        gc.freeze()
        gc.enable()
        if _fallback is not None and _fallback is not threading.current_thread():
            _fallback.cancel()


def quiet_libraries() -> None:
    """Our own progress bars and messages only: no library download bars or advisory warnings.
    Before the libraries are imported: transformers reads its verbosity when it is."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' weight-loading/saving bars
    os.environ.setdefault("WANDB_SILENT", "true")
    # Libraries' deprecation notices about their own internals, not ours to act on (a FutureWarning
    # that points at workbench code, or at any other module, still shows).
    libraries = r"(transformers|torch|peft|accelerate|datasets|huggingface_hub|trl|dspy|litellm|verifiers)"
    warnings.filterwarnings("ignore", category=FutureWarning, module=libraries + r"(\.|$)")
