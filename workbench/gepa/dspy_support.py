"""DSPy, imported lazily and kept quiet.

`import_dspy()` is the one place DSPy is imported: a missing extra is one line, DSPy's disk and
memory caches are off (a cached answer is not a new rollout, and nothing is written to ~), and
litellm — never used on our path, but imported by some of DSPy's modules — reads its bundled
cost map instead of fetching one (offline that is seconds of retries and warnings).

`quiet_dspy(log)`: DSPy's optimizers print, log to stderr and draw tqdm bars; a service must not
write to the terminal (the CLI's progress bar owns it), so all of it goes to run.log.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

from workbench.errors import UserError

DSPY_VERSION = "3.4.1"  # the version the `dspy` extra pins; the optimizers' internals used here are its
INSTALL = 'pip install -e ".[dspy]"'


def import_dspy(optimizer: str) -> ModuleType:
    """The dspy module, configured; UserError naming the extra when it is not installed."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import dspy
    except ImportError as exc:
        raise UserError(f"--optimizer {optimizer} needs DSPy, which is not installed: {INSTALL}") from exc
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    return dspy


class _LineWriter(io.TextIOBase):
    """A text stream that hands each complete line to `emit` (for print() inside DSPy)."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self._partial = ""

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                self.emit(line)
        return len(text)

    def flush(self) -> None:
        if self._partial.strip():
            self.emit(self._partial)
        self._partial = ""


class _EmitHandler(logging.Handler):
    def __init__(self, emit: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self.emit_line = emit

    def emit(self, record: logging.LogRecord) -> None:
        self.emit_line(f"{record.levelname.lower()}: {record.getMessage()}")


# DSPy's modules that draw tqdm bars on our path (evaluation, bootstrapping demos); each holds the
# tqdm module as its global `tqdm`. tests/test_gepa_dspy.py fails loudly if one stops doing so.
TQDM_MODULES = ("dspy.utils.parallelizer", "dspy.evaluate.evaluate", "dspy.teleprompt.bootstrap")


@contextlib.contextmanager
def quiet_dspy(emit: Callable[[str], None]) -> Iterator[None]:
    """Inside: DSPy's prints and log records go to `emit` (one line each); DSPy's tqdm bars draw
    nothing. stderr itself is left alone: the CLI's progress bar writes there. DSPy's optimizers
    ask for bars (display_progress=True) with no switch to turn them off, so the `tqdm` name in
    DSPy's own modules is pointed at a silent tqdm for the call: other libraries' bars, tqdm
    itself and other threads are untouched."""
    import importlib

    logger = logging.getLogger("dspy")
    handler = _EmitHandler(emit)
    saved_handlers, saved_propagate = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [handler], False
    writer = _LineWriter(emit)
    try:
        with contextlib.ExitStack() as stack:
            silent = _silent_tqdm_module()
            for name in TQDM_MODULES:
                stack.enter_context(swapped_global(importlib.import_module(name), "tqdm", silent))
            stack.enter_context(contextlib.redirect_stdout(writer))
            yield
    finally:
        writer.flush()
        logger.handlers, logger.propagate = saved_handlers, saved_propagate


def _silent_tqdm_module() -> SimpleNamespace:
    """Stands in for the tqdm module where DSPy uses `tqdm.tqdm`: a tqdm that never draws."""
    import tqdm

    class SilentTqdm(tqdm.tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "disable": True})  # DSPy passes disable=False itself

    return SimpleNamespace(tqdm=SilentTqdm)


@contextlib.contextmanager
def swapped_global(module: ModuleType, name: str, value: object) -> Iterator[None]:
    """`module.<name>` is `value` inside; a module without that global is a loud AttributeError."""
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)
