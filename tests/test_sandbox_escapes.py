"""Escapes from the python tool's sandbox through the filesystem, each tried by real code in the real
sandbox: reading the workspace's .env and other runs' results.jsonl, leaving files in /tmp, /dev/shm
(and the other world-writable dirs) or SysV shared memory after the call, filling the private /tmp
past its cap, seeing the host's /tmp. Alongside: escapes blocked before (setuid, writing to the
workspace) stay blocked; loops, memory, forks, network and environment secrets are covered in
test_math_python.py. Tests that need a mount namespace skip where the machine has none."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import site
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.envs.sandbox import SandboxLimits, SandboxResult, run_python
from workbench.envs.sandbox_child import SCRATCH_DIRS

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox's isolation is Linux-only"),
]

LIMITS = SandboxLimits(timeout_s=20, cpu_time_s=5, memory_mb=256, tmp_mb=8)
KEY = "sk-test-workspace-" + secrets.token_hex(8)  # the .env's fake API key
ROLLOUT = "rollout-secret-" + secrets.token_hex(8)  # what another run saved in its results.jsonl


async def run(code: str) -> tuple[SandboxResult, str]:
    result = await run_python(code, LIMITS)
    return result, result.stdout + result.stderr


@pytest.fixture(scope="module")
async def isolation() -> dict[str, str]:
    return (await run_python("pass", LIMITS)).isolation


@pytest.fixture
def mount_namespace(isolation: dict[str, str]) -> dict[str, str]:
    if isolation["filesystem"].startswith("shared"):
        pytest.skip("no mount namespace on this machine: /tmp and the workspace are shared (and reported so)")
    return isolation


def readable_by_others(path: Path) -> bool:
    """Whether any uid (nobody, the sandbox's) could read `path` by its mode bits alone, i.e. only the
    sandbox's mounts stand between the code and the file."""
    ancestors_ok = all(os.stat(p).st_mode & stat.S_IXOTH for p in path.parents)
    return ancestors_ok and bool(path.stat().st_mode & stat.S_IROTH)


def outside_tmp_and_home() -> Path:
    """A writable place like a real project folder: not under a dir the sandbox covers anyway."""
    home = os.path.realpath(os.path.expanduser("~"))
    for base in ("/srv", "/mnt", "/opt", "/var/lib"):
        real = os.path.realpath(base)
        if os.path.isdir(real) and os.access(real, os.W_OK) and not real.startswith(home + "/"):
            return Path(real)
    pytest.skip("no writable folder outside /tmp and the home directory (needs root)")


@pytest.fixture(
    params=[("outside-tmp", "cwd"), ("outside-tmp", "WORKBENCH_WORKSPACE"), ("in-tmp", "cwd")],
    ids=lambda p: f"{p[0]}-named-by-{p[1]}",
)
def leaky_workspace(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """A workspace as users leave it: folders 0755, a .env 0644 with a key, another run's results.jsonl
    0644; named as the current directory or by $WORKBENCH_WORKSPACE, as when a run starts a sandbox."""
    where, named_by = request.param
    root = Path(
        tempfile.mkdtemp(
            prefix="workbench-ws-", dir=outside_tmp_and_home() if where == "outside-tmp" else "/tmp"
        )
    )
    try:
        root.chmod(0o755)
        (root / ".env").write_text(f"OPENAI_API_KEY={KEY}\n")
        run_dir = root / "environments" / "math_python" / "outputs" / "evals" / "math-python--m" / "abc123"
        run_dir.mkdir(parents=True, mode=0o755)
        (run_dir / "results.jsonl").write_text(
            json.dumps({"completion": [{"role": "tool", "content": ROLLOUT}]}) + "\n"
        )
        for path in [root / ".env", run_dir / "results.jsonl"]:
            path.chmod(0o644)
            assert readable_by_others(path)  # without the sandbox's mounts, the code could read it
        if named_by == "cwd":
            monkeypatch.delenv("WORKBENCH_WORKSPACE", raising=False)
            monkeypatch.chdir(root)
        else:
            monkeypatch.setenv("WORKBENCH_WORKSPACE", str(root))
            monkeypatch.chdir(tmp_path)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def try_read(*paths: str) -> str:
    """Code that prints each file's content, or how reading it was blocked."""
    return (
        f"for path in {list(paths)!r}:\n"
        "    try:\n        print(path, 'READ:', open(path).read())\n"
        "    except OSError as exc:\n        print(path, 'blocked:', type(exc).__name__)\n"
    )


# ----- the workspace is hidden ------------------------------------------------------------------
async def test_workspace_dotenv_is_not_readable(mount_namespace, leaky_workspace: Path):
    result, output = await run(
        try_read(str(leaky_workspace / ".env"), ".env", "../.env")
        + f"import os\nprint('listing:', os.path.isdir({str(leaky_workspace)!r}) "
        f"and os.listdir({str(leaky_workspace)!r}))"
    )
    assert result.ok, result.describe()
    assert KEY not in output
    assert f"{leaky_workspace / '.env'} blocked: FileNotFoundError" in output
    assert "listing: False" in output or "listing: []" in output  # an empty tmpfs, or not there at all
    assert str(leaky_workspace) in result.isolation["workspace"] or "/tmp" in result.isolation["tmp"]


async def test_other_runs_results_are_not_readable(mount_namespace, leaky_workspace: Path):
    code = (
        f"import os\nfound = []\nfor top, _, files in os.walk({str(leaky_workspace)!r}):\n"
        "    found += [os.path.join(top, f) for f in files]\nprint('found:', found)\n"
        + try_read(*[str(p) for p in leaky_workspace.rglob("results.jsonl")])
    )
    result, output = await run(code)
    assert result.ok, result.describe()
    assert ROLLOUT not in output and KEY not in output
    assert "found: []" in output and "results.jsonl blocked: FileNotFoundError" in output


async def test_workspace_writes_are_blocked(leaky_workspace: Path):
    """Blocked before (the code runs as nobody), and now also by the empty tmpfs over the workspace:
    nothing the code does reaches the host's files."""
    code = (
        f"import os\nws = {str(leaky_workspace)!r}\n"
        "for action in ('overwrite', 'create', 'remove'):\n    try:\n"
        "        if action == 'overwrite':\n            open(os.path.join(ws, '.env'), 'w').write('X=1')\n"
        "        elif action == 'create':\n            open(os.path.join(ws, 'planted.py'), 'w').write('x')\n"
        "        else:\n            os.remove(os.path.join(ws, '.env'))\n"
        "        print(action, 'done inside')\n"
        "    except OSError as exc:\n        print(action, 'blocked:', type(exc).__name__)\n"
    )
    result, output = await run(code)
    assert result.ok, result.describe()
    assert output.count("blocked:") + output.count("done inside") == 3  # each tried (inside: an empty tmpfs)
    assert (leaky_workspace / ".env").read_text() == f"OPENAI_API_KEY={KEY}\n"
    assert sorted(p.name for p in leaky_workspace.iterdir()) == [".env", "environments"]


# ----- /tmp, /dev/shm and friends are private, capped and gone after the call --------------------
async def test_files_in_tmp_and_shm_do_not_outlive_the_call(mount_namespace):
    name = f"wb-escape-{secrets.token_hex(6)}"
    dirs = [d for d in SCRATCH_DIRS if os.path.isdir(d)]
    code = (
        f"import os\nfor d in {dirs!r}:\n    path = os.path.join(d, {name!r})\n"
        "    with open(path, 'wb') as handle:\n        handle.write(b'x' * 1_000_000)\n"
        "    print(d, 'kept for the call:', os.path.getsize(path))\n"
    )
    result, output = await run(code)
    assert result.ok, result.describe()
    assert output.count("kept for the call: 1000000") == len(dirs)  # the writes worked inside
    assert not [d for d in dirs if (Path(d) / name).exists()]  # ... and none reached the host
    again, output = await run(
        f"import os\nprint([d for d in {dirs!r} if os.path.exists(os.path.join(d, {name!r}))])"
    )
    assert again.ok and output.strip() == "[]"  # nor the next call


async def test_sysv_shared_memory_does_not_outlive_the_call(isolation):
    if not isolation["ipc"].startswith("own"):
        pytest.skip("no IPC namespace on this machine (reported so)")
    key = int.from_bytes(secrets.token_bytes(3), "big") | 0x5B000000
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"shmid = libc.shmget({key}, 1 << 20, 0o1666)\nprint('created' if shmid >= 0 else 'refused', ctypes.get_errno())\n"
    )
    result, output = await run(code)
    assert result.ok and "created" in output, output
    host_keys = [
        int(line.split()[0])
        for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
        if line.strip()
    ]
    assert key not in host_keys


async def test_tmp_is_size_capped(mount_namespace):
    code = (
        "import errno, os\nwritten = 0\ntry:\n    with open('/tmp/fill', 'wb') as handle:\n"
        "        for _ in range(64):\n            handle.write(b'x' * (1 << 20))\n            handle.flush()\n"
        "            written += 1\nexcept OSError as exc:\n    print('full after', written, 'MB:', errno.errorcode[exc.errno])\n"
        "for path in ('/dev/shm/more', 'more'):  # /dev/shm and the working dir share the cap\n"
        "    try:\n        with open(path, 'wb') as handle:\n            handle.write(b'x' * (1 << 20))\n"
        "        print(path, 'written')\n    except OSError as exc:\n        print(path, 'refused:', errno.errorcode[exc.errno])\n"
    )
    result, output = await run(code)
    assert result.ok, result.describe()
    assert "ENOSPC" in output and int(output.split("full after")[1].split()[0]) <= LIMITS.tmp_mb
    assert "/dev/shm/more refused: ENOSPC" in output and "more refused: ENOSPC" in output
    assert f"{LIMITS.tmp_mb} MB tmpfs" in result.isolation["tmp"]


async def test_host_tmp_and_shm_are_invisible(mount_namespace):
    markers = []
    try:
        for d in ("/tmp", "/dev/shm"):
            fd, path = tempfile.mkstemp(prefix="wb-host-marker-", dir=d)
            os.write(fd, KEY.encode())
            os.close(fd)
            os.chmod(path, 0o644)
            markers.append(path)
        # /proc/1/cwd/..: the sandbox's init started in the host's working dir, under the host's /tmp
        escapes = [
            *markers,
            *(f"/proc/1/cwd/../{os.path.basename(m)}" for m in markers if m.startswith("/tmp/")),
        ]
        ways = interpreter_ways_in_tmp()
        below_tmp = sorted(d for d in ways if d != "/tmp")
        code = (
            try_read(*escapes)
            + "import os\nprint('tmp:', sorted(os.listdir('/tmp')), 'cwd:', os.path.basename(os.getcwd()))\n"
            "print('shm:', os.listdir('/dev/shm'))\n"
            f"print('ways in:', {{d: sorted(os.listdir(d)) for d in {below_tmp!r}}})\n"
        )
        result, output = await run(code)
    finally:
        for path in markers:
            os.unlink(path)
    assert result.ok, result.describe()
    assert (
        KEY not in output
        and output.count("blocked: FileNotFoundError") == 2
        and output.count("blocked:") == 3
    )
    cwd = output.split("cwd: ")[1].split()[0]
    # Its own /tmp holds nothing but its working dir, and the way to the interpreter where that lies
    # under /tmp (bound back read-only): the host's files and the project's other files stay unseen.
    assert f"tmp: {sorted({cwd} | ways.get('/tmp', set()))!r}" in output
    assert f"ways in: { {d: sorted(ways[d]) for d in below_tmp}!r}" in output
    assert "shm: []" in output


def interpreter_ways_in_tmp() -> dict[str, set[str]]:
    """Where the interpreter lies under /tmp (a virtual environment in a project cloned there): each
    directory from /tmp down to it, with its entries on the way. The sandbox binds the interpreter's
    outermost paths (sys.prefix, site-packages) back into its private /tmp, and nothing else."""
    tmp = Path(os.path.realpath("/tmp"))
    named = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages()}
    kept = {Path(os.path.realpath(p)) for p in named if os.path.isdir(p)}
    under = {p for p in kept if p != tmp and p.is_relative_to(tmp)}
    outermost = {p for p in under if not any(p != q and p.is_relative_to(q) for q in under)}
    ways: dict[str, set[str]] = {}
    for path in outermost:
        for step in [path, *path.parents]:
            if step == tmp:
                break
            ways.setdefault(str(Path("/tmp") / step.parent.relative_to(tmp)), set()).add(step.name)
    return ways


# ----- privileges --------------------------------------------------------------------------------
async def test_setuid_is_blocked(isolation):
    """Setting uid 0 fails, no capability is held (none to unmount the covers with) and no_new_privs
    stops a setuid binary from granting any."""
    code = (
        "import os\ntry:\n    os.setuid(0)\n    print('uid now', os.getuid())\nexcept OSError as exc:\n"
        "    print('setuid blocked:', type(exc).__name__)\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "print({k: status[k].strip() for k in ('CapEff', 'CapPrm', 'CapBnd', 'NoNewPrivs')})\n"
    )
    result, output = await run(code)
    assert result.ok, result.describe()
    if "dropped from root" in isolation["user"]:
        assert "setuid blocked: PermissionError" in output
    zero = "0" * 16
    assert f"'CapEff': '{zero}', 'CapPrm': '{zero}', 'CapBnd': '{zero}', 'NoNewPrivs': '1'" in output
    assert isolation["capabilities"].startswith("none")


async def test_report_names_the_filesystem_protections(isolation):
    for key in ("filesystem", "workspace", "tmp", "ipc", "capabilities"):
        assert isolation[key], key
    if isolation["filesystem"].startswith("shared"):
        assert isolation["tmp"].startswith("the host's") and isolation["workspace"].startswith("visible")
    else:
        assert (
            isolation["tmp"].startswith("private: ")
            and "/tmp" in isolation["tmp"]
            and "/dev/shm" in isolation["tmp"]
        )
        assert "filesystem_errors" not in isolation
