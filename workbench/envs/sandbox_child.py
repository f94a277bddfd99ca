"""The inside of the sandbox: started by `sandbox.py` as `python -I -S sandbox_child.py CONFIG`.

Standard library only and imports nothing from workbench, so it starts fast and works after
privileges are dropped. Process tree (each level only when the OS allows it):

    launcher  (enters new network / mount / pid / IPC namespaces, or a user namespace when not root)
      init    (pid 1 of the new pid namespace: when it exits, the kernel kills every process left)
        worker  (private /tmp, workspace and home hidden, fresh /proc, rlimits, drops root to nobody
                 and every capability, runs the code)

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
CLONE_NEWIPC = 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH, PR_SET_PDEATHSIG = 4096, 16384, 1 << 18, 2, 1
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, CAP_LAST = 24, 38, 63
SETUP_FAILED = 125  # exit code of a worker whose setup failed before the code ran
# World-writable on most hosts: a file left there would outlive the call (and fill the host's disk or
# memory), and other users' files there would be readable. Each gets a view of one private tmpfs.
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# Never covered, even when named as the workspace: the interpreter needs the system they hold.
SYSTEM_DIRS = (
    "/bin",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/proc",
    "/sbin",
    "/sys",
    "/usr/bin",
    "/usr/lib",
    "/usr/lib64",
    "/usr/local/bin",
    "/usr/local/lib",
    "/usr/share",
)

LINUX = sys.platform.startswith("linux")  # namespaces and prctl are Linux-only; elsewhere: rlimits only
_libc = ctypes.CDLL(None, use_errno=True)
if LINUX:
    _libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    ]
    _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def enter_namespaces(is_root: bool) -> int:
    """unshare() the launcher into new namespaces; returns the CLONE_* flags that took effect (0: none).
    Root gets network + mount + pid namespaces directly; others need a user namespace for them."""
    if not LINUX:
        return 0
    uid, gid = os.getuid(), os.getgid()
    # IPC: SysV shared memory and POSIX message queues the code creates die with the namespace.
    full = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC
    attempts = ([full] if is_root else []) + [
        full | CLONE_NEWUSER,
        CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUSER,
    ]
    for flags in attempts:
        if _libc.unshare(flags) != 0:
            continue
        if flags & CLONE_NEWUSER:  # map our own ids so file ownership and getuid() look unchanged
            for name, value in (
                ("setgroups", "deny"),
                ("uid_map", f"{uid} {uid} 1"),
                ("gid_map", f"{gid} {gid} 1"),
            ):
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


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _outermost(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if not any(p != q and _within(p, q) for q in paths))


def _traversable_by_others(path: str) -> bool:
    try:
        return bool(os.stat(path).st_mode & stat.S_IXOTH)
    except OSError:
        return False


def _private_dirs(keep_set: set[str], hide: list[str]) -> tuple[set[str], list[str]]:
    """(dirs to cover with an empty tmpfs, requested dirs left visible and why): the workspace and
    home directory, and any directory that hides the interpreter from other users (e.g. /root)."""
    wanted = {os.path.realpath(p) for p in hide if os.path.isdir(p)}
    try:
        import pwd

        wanted.add(os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir))
    except (KeyError, ImportError):
        pass
    for path in keep_set:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts)):
            ancestor = "/" + "/".join(parts[:depth])
            if not _traversable_by_others(ancestor):
                wanted.add(ancestor)
                break
    hidden, visible = set(), []
    for path in sorted(p for p in wanted - {"/"} if os.path.isdir(p)):
        if any(_within(path, k) for k in keep_set):
            visible.append(f"{path} (holds the interpreter)")
        elif any(_within(path, d) or _within(d, path) for d in SYSTEM_DIRS) or any(
            _within(d, path) and d != path for d in SCRATCH_DIRS
        ):  # e.g. /var: would need its /var/tmp
            visible.append(f"{path} (a system directory)")
        else:
            hidden.add(path)
    return hidden, visible


def _stage_scratch(workdir: str, scratch: list[str], tmp_mb: int) -> dict[str, int]:
    """One size-capped tmpfs, mounted for now over the (empty) host working dir, with a directory per
    scratch dir and one for the working dir (the host dir's content copied in). Returns O_PATH fds of
    those directories by path; binding them is what makes them visible, and the staging mount ends
    up covered, so the tmpfs's root is never reachable. One tmpfs: one cap for everything written."""
    src = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)  # the host dir, still readable once covered
    fds: dict[str, int] = {}
    try:
        # nr_inodes: empty files cost kernel memory that the size cap does not count
        _mount(
            "tmpfs",
            workdir,
            "tmpfs",
            MS_NOSUID | MS_NODEV,
            f"mode=0700,size={tmp_mb}m,nr_inodes={tmp_mb * 256}",
        )
        try:
            for path in [*scratch, workdir]:
                sub = os.path.join(workdir, path.strip("/").replace("/", "-") if path != workdir else "work")
                os.mkdir(sub)
                os.chmod(sub, 0o700 if path == workdir else 0o1777)  # sticky: like the host's /tmp
                fds[path] = os.open(sub, os.O_PATH | os.O_DIRECTORY)
            if os.listdir(src):  # what the parent prepared for the code
                import shutil

                shutil.copytree(
                    f"/proc/self/fd/{src}", os.path.join(workdir, "work"), symlinks=True, dirs_exist_ok=True
                )
        except OSError:
            for fd in fds.values():
                os.close(fd)
            _libc.umount2(workdir.encode(), MNT_DETACH)
            raise
    finally:
        os.close(src)
    return fds


def _cover(top: str, source: int | None, keep_fds: list[tuple[str, int]]) -> None:
    """Mount over `top` an empty tmpfs (`source` None) or a bind of the directory open as `source`,
    then bind back, read-only, the kept paths inside it. Undone if anything fails."""
    if source is None:
        _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    else:
        _mount(f"/proc/self/fd/{source}", top, None, MS_BIND)
    try:
        for path, fd in keep_fds:
            os.makedirs(path, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            _remount_read_only(path)
    except OSError:
        _libc.umount2(top.encode(), MNT_DETACH)  # never leave the interpreter unreachable
        raise


def isolate_paths(keep: list[str], hide: list[str], workdir: str, tmp_mb: int) -> dict[str, str]:
    """In our own mount namespace (nothing propagates to the host): /tmp, /var/tmp, /dev/shm,
    /run/lock and the working dir become views of one fresh tmpfs of `tmp_mb` MB, gone with the
    namespace; an empty tmpfs covers the workspace and home dirs (`_private_dirs`); the interpreter
    (`keep`) is bound back read-only wherever it lies under a covered dir. Returns report entries."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates to the host
    keep_set = {os.path.realpath(p) for p in keep if os.path.isdir(p)}
    scratch = _outermost({os.path.realpath(d) for d in SCRATCH_DIRS if os.path.isdir(d)})
    hidden, visible = _private_dirs(keep_set, hide)
    failed: dict[str, str] = {}
    try:
        sources = _stage_scratch(workdir, scratch, tmp_mb)
    except OSError as exc:
        sources, failed["private tmpfs"] = {}, exc.strerror or str(exc)
    covered_scratch = [d for d in scratch if d in sources]
    tops = sorted(
        set(covered_scratch)
        | {h for h in _outermost(hidden) if not any(_within(h, d) for d in covered_scratch)}
    )
    # Opened before anything is mounted over them: afterwards they may be out of reach.
    keep_fds = {
        top: [
            (k, os.open(k, os.O_PATH | os.O_DIRECTORY))
            for k in _outermost({k for k in keep_set if _within(k, top)})
        ]
        for top in tops
    }
    try:
        for top in tops:
            try:
                _cover(top, sources.get(top), keep_fds[top])
            except OSError as exc:
                failed[top] = exc.strerror or str(exc)
        if workdir in sources:  # after the covers: the working dir may lie under one of them
            os.makedirs(workdir, mode=0o700, exist_ok=True)
            _mount(f"/proc/self/fd/{sources[workdir]}", workdir, None, MS_BIND)
    finally:
        for fd in [fd for fds in keep_fds.values() for _, fd in fds] + list(sources.values()):
            os.close(fd)
    covered = [t for t in tops if t not in failed]
    shown = [h for h in _outermost(hidden) if any(_within(h, t) for t in covered)]
    report = {
        "workspace": ("hidden: " + ", ".join(shown) if shown else "nothing hidden")
        + ("; left visible: " + ", ".join(visible) if visible else ""),
        "tmp": (
            f"private: {', '.join(d for d in covered_scratch if d in covered)} and the working dir "
            f"share one {tmp_mb} MB tmpfs, gone after the call"
            if sources
            else "the host's (no private tmpfs); HOME and TMPDIR point at the working dir"
        ),
    }
    if failed:
        report["filesystem_errors"] = "not covered: " + ", ".join(f"{k} ({v})" for k, v in failed.items())
    return report


def _remount_read_only(path: str) -> None:
    for extra in (0, MS_NOEXEC):  # a user namespace must keep locked flags such as noexec
        if (
            _libc.mount(
                None,
                path.encode(),
                None,
                MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | extra,
                None,
            )
            == 0
        ):
            return


def set_limits(cfg: dict, nproc: int | None) -> None:
    cpu = int(cfg["cpu_time_s"])
    memory = int(cfg["memory_mb"]) * 1024 * 1024
    limits = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, memory, memory),
        (resource.RLIMIT_FSIZE, int(cfg["max_file_mb"]) * 1024 * 1024, None),
        (resource.RLIMIT_NOFILE, int(cfg["max_open_files"]), None),
        (resource.RLIMIT_CORE, 0, 0),
    ]
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


def _isolate_filesystem(flags: int, cfg: dict) -> dict[str, str]:
    """Private mounts (`isolate_paths`), and a fresh /proc inside a pid namespace."""
    if not flags & CLONE_NEWNS:
        return {
            "filesystem": "shared (no mount namespace)",
            "workspace": "visible (no mount namespace): readable wherever file permissions allow",
            "tmp": "the host's (no mount namespace): HOME and TMPDIR point at the working dir, "
            "but files written to /tmp or /dev/shm outlive the call",
        }
    try:
        report = {
            "filesystem": "private mounts",
            **isolate_paths(cfg["keep_paths"], cfg.get("hide_paths", []), cfg["workdir"], int(cfg["tmp_mb"])),
        }
    except OSError as exc:  # reported, like every layer that did not take effect
        report = {
            "filesystem": f"private mounts, not isolated ({exc})",
            "workspace": "visible (setup failed)",
            "tmp": "the host's, or none if the working dir could not be mounted (setup failed)",
        }
    if flags & CLONE_NEWPID:
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            report["filesystem"] += "; fresh /proc (other processes invisible)"
        except OSError:
            report["filesystem"] += "; host /proc"
    return report


def drop_capability_bounding_set() -> None:
    """Nothing a later exec could gain. Before setuid: changing the set needs CAP_SETPCAP."""
    if LINUX:
        for cap in range(CAP_LAST + 1):
            if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                break  # EINVAL: past the kernel's last capability; EPERM: not ours to change


def drop_capabilities() -> str:
    """No capability left and none to gain. Matters where the code keeps its uid (root, or any uid in
    a user namespace, where it holds every capability of that namespace and could unmount what hides
    the workspace); no_new_privs also stops setuid binaries from granting anything to anyone."""
    if not LINUX:
        return "unchanged (not Linux)"
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    _check(
        _libc.capset(header, (ctypes.c_uint32 * 6)()), "capset"
    )  # effective, permitted, inheritable: empty
    return "none (all dropped; no_new_privs: setuid binaries gain nothing)"


def _process_limit(cfg: dict, flags: int, drop: bool, baseline: int) -> tuple[int | None, str]:
    """RLIMIT_NPROC counts every task of the real uid (in its user namespace), and root is exempt:
    the limit is `max_processes` on top of what that uid already runs."""
    wanted = int(cfg["max_processes"])
    if drop:
        return (
            wanted + baseline,
            f"RLIMIT_NPROC {wanted} (+{baseline} already running as uid {cfg['sandbox_uid']})",
        )
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
        iso = {
            "pid_namespace": "yes: leftover processes are killed with the sandbox"
            if flags & CLONE_NEWPID
            else "no",
            "network": "none (own network namespace)"
            if flags & CLONE_NEWNET
            else "python-level guard only (bypassable)",
            "ipc": "own IPC namespace (SysV shared memory and message queues die with it)"
            if flags & CLONE_NEWIPC
            else "the host's (SysV shared memory could outlive the call)",
            **_isolate_filesystem(flags, cfg),
        }
        drop = is_root and _interpreter_accessible(keep, target)
        nproc, iso["process_limit"] = _process_limit(cfg, flags, drop, baseline)
        set_limits(cfg, nproc)
        drop_capability_bounding_set()
        if drop:
            os.chown(workdir, target, target)
            os.setgroups([])
            os.setgid(target)  # as root, these set the real, effective and saved ids
            os.setuid(target)
            iso["user"] = f"uid {target} (dropped from root)"
        else:
            iso["user"] = f"unchanged (uid {os.getuid()})" + (
                ", own user namespace" if flags & CLONE_NEWUSER else ""
            )
        iso["capabilities"] = drop_capabilities()  # after setgroups/setgid/setuid, which need them
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
    linecache.cache["main.py"] = (
        len(source),
        None,
        source.splitlines(True),
        "main.py",
    )  # source lines in tracebacks
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(source, "main.py", "exec"), namespace)  # running it is the point
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:  # the code's own error is its output
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
    result = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
    }
    os.write(report_fd, (json.dumps(result) + "\n").encode())
    os._exit(0)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    report_fd = int(cfg["report_fd"])
    flags = enter_namespaces(os.geteuid() == 0)
    # Our cwd is the host's working dir, which the private mounts cover; /proc/1/cwd/.. would lead
    # from it to the host's /tmp. "/" is the same for init and the code.
    os.chdir("/")
    if flags & CLONE_NEWPID:
        pid, _ = _fork_child()  # the first child is pid 1 of the new namespace
        if pid:
            os.waitpid(pid, 0)
            os._exit(0)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # if the launcher is killed, the namespace goes too
    supervise(cfg, flags, report_fd)


if __name__ == "__main__":
    main()
