"""The inside of the sandbox: started by `sandbox.py` as `python -I -S sandbox_child.py CONFIG`.

Standard library only and imports nothing from workbench, so it starts fast and works after
privileges are dropped. Process tree (each level only when the OS allows it):

    launcher  (enters new network / mount / pid namespaces, or a user namespace when not root)
      init    (pid 1 of the new pid namespace: when it exits, the kernel kills every process left)
        worker  (hides private dirs, fresh /proc, rlimits, drops root to nobody, runs the code)

Every step records what took effect in a JSON line on the report fd, so the parent knows — and
can tell the user — which isolation was active. The supervisor (init, or the launcher when there
is no pid namespace) adds the worker's exit status and CPU time. Stdin carries the code.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import stat
import sys
import traceback

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH, PR_SET_PDEATHSIG = 4096, 16384, 1 << 18, 2, 1
SETUP_FAILED = 125  # exit code of a worker whose setup failed before the code ran

LINUX = sys.platform.startswith("linux")  # namespaces and prctl are Linux-only; elsewhere: rlimits only
_libc = ctypes.CDLL(None, use_errno=True)
if LINUX:
    _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def enter_namespaces(is_root: bool) -> int:
    """unshare() the launcher into new namespaces; returns the CLONE_* flags that took effect (0: none).
    Root gets network + mount + pid namespaces directly; others need a user namespace for them."""
    if not LINUX:
        return 0
    uid, gid = os.getuid(), os.getgid()
    full = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID
    attempts = ([full] if is_root else []) + [full | CLONE_NEWUSER, CLONE_NEWNET | CLONE_NEWUSER]
    for flags in attempts:
        if _libc.unshare(flags) != 0:
            continue
        if flags & CLONE_NEWUSER:  # map our own ids so file ownership and getuid() look unchanged
            for name, value in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as handle:
                    handle.write(value)
        return flags
    return 0


def _tasks_of(uid: int) -> int:
    """Tasks (threads count: RLIMIT_NPROC counts them) whose real uid is `uid`, from /proc."""
    total = 0
    if not os.path.isdir("/proc"):
        return total
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1").strip() or 1)
    return total


def _outermost(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in paths))


def _traversable_by_others(path: str) -> bool:
    try:
        return bool(os.stat(path).st_mode & stat.S_IXOTH)
    except OSError:
        return False


def hide_private_dirs(keep: list[str], writable: str) -> str:
    """In our own mount namespace: an empty tmpfs over the home directory and over any directory
    that hides the interpreter from other users (e.g. /root), binding back `keep` (read-only)
    and `writable`. Returns a description of what is hidden."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates to the host
    keep_set = {os.path.realpath(p) for p in keep if os.path.isdir(p)} | {os.path.realpath(writable)}
    hidden: set[str] = set()
    try:
        import pwd

        home = os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir)
        if home != "/" and os.path.isdir(home):
            hidden.add(home)
    except (KeyError, ImportError):
        pass
    for path in keep_set:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts)):
            ancestor = "/" + "/".join(parts[:depth])
            if not _traversable_by_others(ancestor):
                hidden.add(ancestor)
                break
    hidden = {h for h in hidden if not any(h == k or h.startswith(k + "/") for k in keep_set)}
    for top in _outermost(hidden):
        inner = _outermost({k for k in keep_set if k.startswith(top + "/")})
        fds = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in inner]
        try:
            _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
            try:
                for path, fd in fds:
                    os.makedirs(path, mode=0o755, exist_ok=True)
                    _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
                    if path != os.path.realpath(writable):
                        _remount_read_only(path)
            except OSError:
                _libc.umount2(top.encode(), MNT_DETACH)  # never leave the interpreter unreachable
                raise
        finally:
            for _, fd in fds:
                os.close(fd)
    return ("hidden: " + ", ".join(_outermost(hidden))) if hidden else "nothing to hide"


def _remount_read_only(path: str) -> None:
    for extra in (0, MS_NOEXEC):  # a user namespace must keep locked flags such as noexec
        if _libc.mount(None, path.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | extra, None) == 0:
            return


def set_limits(cfg: dict, nproc: int | None) -> None:
    cpu = int(cfg["cpu_time_s"])
    memory = int(cfg["memory_mb"]) * 1024 * 1024
    limits = [(resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_AS, memory, memory),
              (resource.RLIMIT_FSIZE, int(cfg["max_file_mb"]) * 1024 * 1024, None),
              (resource.RLIMIT_NOFILE, int(cfg["max_open_files"]), None), (resource.RLIMIT_CORE, 0, 0)]
    if nproc is not None:
        limits.append((resource.RLIMIT_NPROC, nproc, nproc))
    for which, soft, hard in limits:
        resource.setrlimit(which, (soft, soft if hard is None else hard))


def _interpreter_accessible(paths: list[str], uid: int) -> bool:
    """Whether `uid` can traverse to and read `paths` (mode bits only; enough for a decision)."""
    for path in paths:
        parts = os.path.realpath(path).strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            try:
                st = os.stat("/" + "/".join(parts[:depth]))
            except OSError:
                return False
            if st.st_uid != uid and not st.st_mode & stat.S_IXOTH:
                return False
    return True


def _block_python_sockets() -> None:
    """Fallback when no network namespace is available: refuse socket connects at the Python level.
    Code that uses `_socket` or ctypes directly can get around it — reported as such."""
    import socket

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise PermissionError("network access is disabled in this sandbox")

    for name in ("connect", "connect_ex", "sendto", "bind"):
        setattr(socket.socket, name, refuse)


def _isolate_filesystem(flags: int, keep: list[str], workdir: str) -> str:
    """Private mounts with private dirs hidden, and a fresh /proc inside a pid namespace."""
    if not flags & CLONE_NEWNS:
        return "shared (no mount namespace)"
    try:
        label = "private mounts; " + hide_private_dirs(keep, workdir)
    except OSError as exc:
        label = f"not hidden ({exc})"
    if flags & CLONE_NEWPID:
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            label += "; fresh /proc (other processes invisible)"
        except OSError:
            label += "; host /proc"
    return label


def _process_limit(cfg: dict, flags: int, drop: bool, baseline: int) -> tuple[int | None, str]:
    """RLIMIT_NPROC counts every task of the real uid (in its user namespace), and root is exempt:
    the limit is `max_processes` on top of what that uid already runs."""
    wanted = int(cfg["max_processes"])
    if drop:
        return wanted + baseline, f"RLIMIT_NPROC {wanted} (+{baseline} already running as uid {cfg['sandbox_uid']})"
    if os.getuid() == 0:  # root, even mapped into a user namespace, ignores RLIMIT_NPROC
        return None, "not enforced (root, and the interpreter is not readable by an unprivileged user)"
    if flags & CLONE_NEWUSER:
        overhead = 2 if flags & CLONE_NEWPID else 1  # the launcher (and init) count in the namespace too
        return wanted + overhead, f"RLIMIT_NPROC {wanted} (counted per sandbox: own user namespace)"
    return wanted + baseline, f"RLIMIT_NPROC {wanted} (+{baseline} of your user's processes: shared count)"


def worker(cfg: dict, flags: int, report_fd: int) -> None:
    """Set up isolation, then run the code from stdin. Never returns."""
    status = SETUP_FAILED
    try:
        source = sys.stdin.buffer.read().decode("utf-8", errors="replace")
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        workdir, keep, target = cfg["workdir"], cfg["keep_paths"], int(cfg["sandbox_uid"])
        is_root = os.geteuid() == 0 and not flags & CLONE_NEWUSER
        baseline = _tasks_of(target if is_root else os.getuid())  # on the host's /proc, before a fresh one
        iso = {"pid_namespace": "yes: leftover processes are killed with the sandbox" if flags & CLONE_NEWPID else "no",
               "network": "none (own network namespace)" if flags & CLONE_NEWNET else "python-level guard only (bypassable)",
               "filesystem": _isolate_filesystem(flags, keep, workdir)}
        drop = is_root and _interpreter_accessible(keep, target)
        nproc, iso["process_limit"] = _process_limit(cfg, flags, drop, baseline)
        set_limits(cfg, nproc)
        if drop:
            os.chown(workdir, target, target)
            os.setgroups([])
            os.setgid(target)  # as root, these set the real, effective and saved ids
            os.setuid(target)
            iso["user"] = f"uid {target} (dropped from root)"
        else:
            iso["user"] = f"unchanged (uid {os.getuid()})" + (", own user namespace" if flags & CLONE_NEWUSER else "")
        if LINUX:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid, which clears it
        os.chdir(workdir)
        if not flags & CLONE_NEWNET:
            _block_python_sockets()
        sys.path[:0] = [workdir]
        sys.path.extend(cfg["site_paths"])
        os.write(report_fd, (json.dumps({"isolation": iso}) + "\n").encode())
        os.close(report_fd)  # the code cannot forge the report
        status = _run_code(source)
    except BaseException:  # a setup failure is reported as the run's error, never hidden
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _run_code(source: str) -> int:
    """Execute the user's code as `__main__`; returns its exit status. Tracebacks omit our frames."""
    import linecache

    sys.argv = ["main.py"]
    linecache.cache["main.py"] = (len(source), None, source.splitlines(True), "main.py")  # source lines in tracebacks
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(source, "main.py", "exec"), namespace)
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:  # noqa: BLE001 - the code's own error is its output
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        return 1


def _kill_child_on_sigterm() -> list[int]:
    """The parent stops a run with SIGTERM; we answer by SIGKILLing our child and reaping it, so
    nothing is orphaned. Installed before fork (no window); the child restores the default."""
    child: list[int] = []

    def kill_child(*_: object) -> None:
        try:
            if child:
                os.kill(child[0], signal.SIGKILL)
        except OSError:
            pass  # already gone

    signal.signal(signal.SIGTERM, kill_child)
    return child


def _fork_child() -> tuple[int, list[int]]:
    child = _kill_child_on_sigterm()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    else:
        child.append(pid)
    return pid, child


def supervise(cfg: dict, flags: int, report_fd: int) -> None:
    """Fork the worker, wait for it, report its status and CPU time. Never returns."""
    pid, _ = _fork_child()
    if pid == 0:
        worker(cfg, flags, report_fd)
    _, status, usage = os.wait4(pid, 0)
    result = {"exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
              "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
              "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)}
    os.write(report_fd, (json.dumps(result) + "\n").encode())
    os._exit(0)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    report_fd = int(cfg["report_fd"])
    flags = enter_namespaces(os.geteuid() == 0)
    if flags & CLONE_NEWPID:
        pid, _ = _fork_child()  # the first child is pid 1 of the new namespace
        if pid:
            os.waitpid(pid, 0)
            os._exit(0)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # if the launcher is killed, the namespace goes too
    supervise(cfg, flags, report_fd)


if __name__ == "__main__":
    main()
