"""Shared fixtures: an isolated workspace per test and the tiny model built once per session."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"  # what tests read beside the code: exact copies, never ../shared

# A suite started in the background by a script (`pytest ... &`, no job control) has SIGINT ignored,
# as POSIX says, and every child it starts inherits that: a test that Ctrl-Cs a run would then wait
# for ever. Tests send SIGINT on purpose, so it must reach their children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Under pytest-xdist (`-n 2`, the default in pyproject's addopts) the workers split the cores: a
# worker's torch, and every process its tests start (servers, ranks), would otherwise each use
# all of them, and threads spinning on cores another worker holds slow everything several-fold.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` (pyproject's addopts): one worker more than the cores this process may use. A
    worker spends about a quarter of its time waiting with its core idle (children importing,
    servers answering), and the extra worker fills it: measured on 2 cores, 457 s with 3 workers
    against 515 s with 2. `--maxprocesses` still caps it; PYTEST_XDIST_AUTO_NUM_WORKERS overrides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + 1


# Tests that run `python -m workbench ...` must run this checkout, not whichever workbench is
# pip-installed (an editable install of another worktree would otherwise be tested).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

# Most CLI commands run in this process (tests/cli.py): the libraries get the defaults a
# `workbench` process gives them (quiet transformers, no tqdm bars) before anything imports them.
from workbench.startup import quiet_libraries  # noqa: E402

quiet_libraries()


@pytest.fixture
def young_heap() -> Iterator[None]:
    """`gc.collect()` inside the test scans only the objects the test made: everything older is
    frozen (`gc.freeze`) for its duration. A worker that has run a few hundred tests tracks
    millions of objects (torch, transformers, textual), and a full collection of those costs
    about half a second; a test that collects once per group would spend most of its time there."""
    import gc

    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.fixture
def echo():
    """An echo backend that records its calls (tests/servers.py)."""
    from tests.servers import EchoBackend

    return EchoBackend("echo-model")


@pytest.fixture
def url(echo):
    """Base URL of `echo` served over real HTTP on 127.0.0.1 (no /v1)."""
    from tests.servers import make_app, serve_in_thread

    with serve_in_thread(make_app(echo)) as base_url:
        yield base_url


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty workspace folder, current directory and $WORKBENCH_WORKSPACE."""
    monkeypatch.setenv("WORKBENCH_WORKSPACE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The default tiny model, built exactly as `workbench setup` does, once per session.

    Reuses the repo's outputs/models/tiny when its build fingerprint is current (a stale or
    half-built model is rebuilt), so local runs don't pay the build twice.
    """
    from workbench.bootstrap import build_tiny

    path, _ = build_tiny(REPO)
    return path


@pytest.fixture(scope="session")
def tiny_qwen_model() -> Path:
    """The tiny-qwen test model (Qwen3 architecture, Qwen's real vocabulary), built exactly as
    `workbench setup --model tiny-qwen` does, once per session; reused from the repo's
    outputs/models/tiny-qwen while its build fingerprint is current."""
    from workbench.bootstrap import build_tiny_qwen

    path, _ = build_tiny_qwen(REPO)
    return path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Build the embedded models before the first test when any test needs them: a build is minutes
    of CPU, and inside the first test's setup it counted against that test's timeout (on a loaded
    machine it ran past it, and every test using the model errored with the cached timeout)."""
    from workbench.bootstrap import build_tiny, build_tiny_qwen

    builds = [
        (name, build)
        for name, build in (("tiny", build_tiny), ("tiny-qwen", build_tiny_qwen))
        if any(name.replace("-", "_") + "_model" in getattr(item, "fixturenames", ()) for item in items)
    ]
    # xdist workers collect at once: one builds each model, the others find it current. Odd
    # workers take the models in the other order, so the two builds (each on one core) run side
    # by side instead of one after the other: on a fresh clone, 68 s + 38 s became about 68 s.
    if int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 2:
        builds.reverse()
    for name, build in builds:
        with _build_lock(name):
            build(REPO)


# A worker that has run a few hundred tests tracks about a million objects (torch, transformers,
# textual, verifiers, dspy), and Python's full collections, each a walk over all of them (0.3 s),
# come every few tests: measured 25-50 s per worker over a suite. Every `_FREEZE_EVERY` tests the
# garbage is collected once and what survives (modules, session fixtures) frozen out of later
# full passes. Only the test process is affected, never what the tests start.
_FREEZE_EVERY = 20
_tests_since_freeze = 0


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    global _tests_since_freeze
    import gc

    _tests_since_freeze += 1
    if _tests_since_freeze >= _FREEZE_EVERY:
        _tests_since_freeze = 0
        gc.collect()
        gc.freeze()


@contextlib.contextmanager
def _build_lock(model: str) -> Iterator[None]:
    """Held while building one embedded model (an advisory lock on a file beside it)."""
    lock = REPO / "outputs" / "models" / f".test-build-{model}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture
def tiny_workspace(workspace: Path, tiny_model: Path) -> Path:
    """An empty workspace whose outputs/models/tiny points at the session's tiny model."""
    return _with_model(workspace, "tiny", tiny_model)


@pytest.fixture
def tiny_qwen_workspace(workspace: Path, tiny_qwen_model: Path) -> Path:
    """An empty workspace whose outputs/models/tiny-qwen points at the session's tiny-qwen model."""
    return _with_model(workspace, "tiny-qwen", tiny_qwen_model)


def _with_model(workspace: Path, name: str, model: Path) -> Path:
    target = workspace / "outputs" / "models" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(model, target_is_directory=True)
    return workspace
