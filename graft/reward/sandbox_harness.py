"""The harness that runs INSIDE the sandboxed interpreter (see :mod:`graft.reward.sandbox`).

Started as ``python -I -S -B -X utf8 -c <this file's source> JOB_FD``: stdlib only, nothing from graft.
It reads the job (JSON: the program, the test calls or test code in the order to run them, the limits, the uid
to drop to, the result fd) from the memfd ``JOB_FD``. Three kinds of process run this code:

- the **warden** (the first process; PID 1 of the sandbox's PID namespace under bubblewrap): never runs the
  program. When asked (the rlimits fallback run as root) it enters new mount/network/IPC/UTS namespaces, mounts
  private size-limited tmpfs over the world-writable folders and, when the interpreter lives under a folder the
  sandbox uid cannot enter, re-binds it read-only at its own path. It becomes a child subreaper, forks the
  template, and once the template has ended kills whatever is left and reaps every process until none is left,
  so that no process of the sandbox is ever handed to the host's init.
- the **template**: drops to the sandbox uid (no supplementary groups, no capabilities, no_new_privs,
  parent-death SIGKILL), sets the rlimits, installs a seccomp filter (no SysV IPC, POSIX message queues,
  keyrings, ptrace, namespaces, mounts, or changing another process's scheduling or limits), closes every fd
  but 0/1/2 and the result fd, enters its working folder, then loads the program. After the import it seals
  what the calls could share: it kills every other process of the sandbox, refuses a program that left a
  thread running or changed fds 0-2 or the result fd, turns shared memory mappings into private copies,
  becomes non-dumpable, blocks signals, and records the state of the writable folders.
- one **child per call**, forked from the template: it evaluates its one call and reports. After it ends the
  template kills every process it left, reaps them, and puts the writable folders back as they were after the
  import (only when something changed). So no call sees a state another call has touched.

Reports, one JSON line each on the result fd (never stdout): ``["R"]`` ready, then ``["S", kind]`` (the
program does not compile) or ``["X", kind]`` (it raised at import, or left something shared: ``ThreadAtImport``,
``FdsChangedAtImport``, ``SharedMemoryAtImport``) or ``["P"]`` (it loaded), then per call ``["V", i,
repr(value)]`` / ``["T", i]`` (test code ran through) / ``["E", i, exception type]`` / ``["O", i]`` (the call
ran past ``call_timeout_s``), then ``["D"]``. ``["F", message]``: the sandbox itself is unusable (the parent
reports "error"). ``["I"]``, at any time: a stop signal from outside reached the sandbox (see below).

**Stop signals** (SIGTERM, SIGINT, SIGHUP; a cluster stopping a job sends SIGTERM to every process of its cgroup,
the sandbox's included): the sandbox starts with them blocked (the parent blocks them around the launch) and every
process of it ignores them from the first line on, as graft's workers do, whatever the process that graded it
does with them. The program may undo that for its own processes; so the warden reports ``["I"]`` when one reaches
it (a handler: the stop reached the sandbox while it ran), when the template dies of one, and the template when a
call's child does. The parent then grades the program again (an interrupted program is never scored).

The program runs in the template and in the children, so it can forge or suppress these lines; the parent
therefore compares the reported reprs with the expected values itself (they never come in here), counts a
missing line as a failure, and has shuffled the calls before they come in here.
"""

import ctypes
import json
import os
import resource
import select
import signal
import stat
import struct
import sys
import time

_dumps = json.dumps
_write = os.write
_repr = repr
_exit = os._exit

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWNET = 0x20000, 0x4000000, 0x8000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 32, 4096, 16384, 1 << 18
MS_RDONLY = 1
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 36, 38
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/run/lock", "/dev/shm")
"""Covered by a private tmpfs in the fallback's mount namespace."""

REAP_WAIT_S = 0.05
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""The signals that stop graft (graft.signals.STOP_SIGNALS; not imported: nothing from graft runs here)."""

_result_fd = -1
_max_line = 1 << 20


def _prctl(libc, option: int, *args: int) -> int:
    values = [ctypes.c_ulong(a) for a in args] + [ctypes.c_ulong(0)] * (4 - len(args))
    return libc.prctl(ctypes.c_int(option), *values)


def report(*fields) -> None:
    data = (_dumps(list(fields), ensure_ascii=True) + "\n").encode("ascii")
    if len(data) > _max_line and fields[0] == "V":
        data = (_dumps(["E", fields[1], "ResultTooLarge"]) + "\n").encode("ascii")
    try:
        while data:
            data = data[_write(_result_fd, data) :]
    except OSError:  # the program closed or broke the result fd: nothing more can be reported
        _exit(0)


# ---------------------------------------------------------------------------------------------- seccomp

_ARCHES = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_DENIED = {
    # SysV IPC (shmget, semget, msgget), mq_open, add_key, request_key, keyctl, ptrace, process_vm_readv/writev,
    # kcmp, pidfd_getfd, process_madvise, setpriority, sched_setparam/setscheduler/setaffinity/setattr, ioprio_set,
    # unshare, setns, mount, umount2, pivot_root, chroot, bpf, perf_event_open, userfaultfd, io_uring_setup,
    # open_tree, move_mount, fsopen
    "x86_64": (29, 64, 68, 240, 248, 249, 250, 101, 310, 311, 312, 438, 440, 141, 142, 144, 203, 314, 251, 272, 308,
               165, 166, 155, 161, 321, 298, 323, 425, 428, 429, 430),
    "aarch64": (194, 190, 186, 180, 217, 218, 219, 117, 270, 271, 272, 438, 440, 140, 118, 119, 122, 274, 30, 97, 268,
                40, 39, 41, 51, 280, 241, 282, 425, 428, 429, 430),
}  # fmt: skip
_SELF_ONLY = {"x86_64": (302, 160), "aarch64": (261, 164)}
"""prlimit64 and setrlimit: allowed on the calling process only (pid argument 0)."""
_CLONE, _CLONE3 = {"x86_64": 56, "aarch64": 220}, 435
_CLONE_NAMESPACES = 0x7E020080
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME."""
_EPERM, _ENOSYS = 1, 38
_ALLOW, _ERRNO, _KILL = 0x7FFF0000, 0x00050000, 0x80000000


def _seccomp_program(arch: str) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) BPF instructions: the syscalls of ``_DENIED`` fail with EPERM, clone with a
    namespace flag with EPERM, clone3 with ENOSYS (so the C library falls back to clone), another architecture's
    calling convention (and x32) kills the process; everything else is allowed."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    denied, self_only = _DENIED[arch], _SELF_ONLY[arch]
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, _ARCHES[arch]), (ret, 0, 0, _KILL), (ld, 0, 0, 0)]
    prog.append((jge, 0, 1, 0x40000000))
    prog.append((ret, 0, 0, _KILL))
    for nr in denied:
        prog.append((jeq, 0, 1, nr))
        prog.append((ret, 0, 0, _ERRNO | _EPERM))
    prog += [(jeq, 0, 1, _CLONE3), (ret, 0, 0, _ERRNO | _ENOSYS)]
    prog += [(jeq, 0, 3, _CLONE[arch]), (ld, 0, 0, 16), (jset, 0, 1, _CLONE_NAMESPACES), (ret, 0, 0, _ERRNO | _EPERM)]
    for nr in self_only:  # A holds the syscall number unless the clone branch above reloaded it (then it returned)
        prog += [(ld, 0, 0, 0), (jeq, 0, 3, nr), (ld, 0, 0, 16), (jeq, 1, 0, 0), (ret, 0, 0, _ERRNO | _EPERM)]
    prog.append((ret, 0, 0, _ALLOW))
    return prog


def install_seccomp(libc) -> bool:
    """Install :func:`_seccomp_program` (after no_new_privs); False on an architecture it has no table for."""
    arch = os.uname().machine
    if arch not in _ARCHES:
        return False
    prog = _seccomp_program(arch)
    code = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    _prctl(libc, PR_SET_NO_NEW_PRIVS, 1)
    if _prctl(libc, PR_SET_SECCOMP, 2, ctypes.addressof(fbuf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp: {os.strerror(err)}")
    return True


# ---------------------------------------------------------------------------------------------- warden


def _mount(libc, source, target, fstype, flags, data) -> None:
    def enc(s):
        return None if s is None else s.encode()

    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _blocked_ancestor(path: str) -> str | None:
    """The outermost folder above ``path`` that others cannot enter, or None."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        folder = "/" + "/".join(parts[:i])
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


def enter_namespaces(libc, tmpfs_bytes: int) -> bool:
    """Private mount + network (+ IPC, UTS) namespaces; False when the kernel refuses (no CAP_SYS_ADMIN)."""
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) != 0:
        return False
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE, None)
    pythons = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)})
    held = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in pythons]
    for folder in WORLD_WRITABLE:
        if os.path.isdir(folder) and not os.path.islink(folder):
            _mount(libc, "tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_bytes},mode=1777")
    for path, fd in held:
        blocked = _blocked_ancestor(path)
        if blocked:  # e.g. /root/.pyenv/...: hide the folder, put only the interpreter back, read-only
            _mount(libc, "tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            os.makedirs(path, 0o755, exist_ok=True)
            _mount(libc, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
            _mount(libc, None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
        os.close(fd)
    return True


def kill_others(job: dict, group: int = 0) -> None:
    """SIGKILL every process of the sandbox but the caller: ``kill(-1)`` where that reaches the sandbox alone (in
    its own PID namespace, or as its dedicated uid; the root warden of ``rlimits+setuid`` forks a helper that
    becomes the uid first), else the process group ``group`` (the ``rlimits`` floor)."""
    if job["pidns"] or (job["uid"] is not None and os.getuid() == job["uid"]):
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
    elif job["uid"] is not None and os.getuid() == 0:
        pid = os.fork()
        if pid == 0:
            try:
                os.setresgid(job["uid"], job["uid"], job["uid"])
                os.setresuid(job["uid"], job["uid"], job["uid"])
                os.kill(-1, signal.SIGKILL)
            finally:
                _exit(0)
        os.waitpid(pid, 0)
    elif group > 0:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass


def reap(job: dict) -> None:
    """Reap children (and the orphans handed to us as a subreaper) until none is left. Where :func:`kill_others`
    reaches every process that is certain; the ``rlimits`` floor waits at most ``REAP_WAIT_S`` for them."""
    deadline = None if job["pidns"] or job["uid"] is not None else time.monotonic() + REAP_WAIT_S
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if deadline is None else os.WNOHANG)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if pid == 0:
            if deadline is not None and time.monotonic() >= deadline:
                return
            time.sleep(0.001)


def ignore_stop_signals() -> None:
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def _interrupted(signum, frame) -> None:
    report("I")


def _died_of_a_stop(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) in STOP_SIGNALS


def warden(job: dict, libc) -> None:
    """The first process: namespaces (when asked), then the template; afterwards kill and reap everything. A stop
    signal that reaches it, or kills the template, is reported (``["I"]``)."""
    workdir = job["workdir"]
    if job["unshare"] and enter_namespaces(libc, job["tmpfs_bytes"]):
        workdir = "/tmp"
    roots = list(job["roots"]) or [workdir]
    if workdir == "/tmp" and job["unshare"]:
        roots = [r for r in WORLD_WRITABLE if os.path.isdir(r) and not os.path.islink(r)]
    _prctl(libc, PR_SET_CHILD_SUBREAPER, 1)
    _prctl(libc, PR_SET_PDEATHSIG, signal.SIGKILL)
    for s in STOP_SIGNALS:  # handled, not ignored: under bwrap it is PID 1, which gets only the signals it handles
        signal.signal(s, _interrupted)
    pid = os.fork()
    if pid == 0:
        try:
            ignore_stop_signals()
            template(job, libc, workdir, roots)
        finally:
            _exit(0)
    try:
        if _died_of_a_stop(os.waitpid(pid, 0)[1]):
            report("I")
    except ChildProcessError:
        pass
    kill_others(job, pid)
    reap(job)


# ---------------------------------------------------------------------------------------------- template


def drop_privileges(libc, uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getegid() != uid:
        raise OSError("the uid did not change")
    _prctl(libc, PR_SET_NO_NEW_PRIVS, 1)
    _prctl(libc, PR_SET_PDEATHSIG, signal.SIGKILL)


def set_limits(limits: dict) -> None:
    for name, value in limits.items():
        which = getattr(resource, name)
        hard = resource.getrlimit(which)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def setup(job: dict, libc, workdir: str) -> None:
    """Everything before the program runs; raises OSError when the sandbox cannot be built."""
    os.umask(0o022)
    os.setpgid(0, 0)
    _prctl(libc, PR_SET_CHILD_SUBREAPER, 1)
    if job["uid"] is not None:
        drop_privileges(libc, job["uid"])
    stdlib = os.path.dirname(os.__file__)
    if not os.access(stdlib, os.R_OK | os.X_OK):
        raise OSError(f"the sandbox cannot read the interpreter's stdlib {stdlib}")
    set_limits(job["limits"])
    os.closerange(3, _result_fd)
    os.closerange(_result_fd + 1, 1 << 16)
    os.chdir(workdir)
    if job["seccomp"]:
        install_seccomp(libc)


def _state(root: str) -> list:
    """Every entry under ``root`` with the stat fields a process can change (ctime: any change at all; atime:
    a read), in walk order. Reading a file or folder once first settles its access time (relatime)."""
    out: list[tuple] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(folder, name)
            st = os.lstat(path)
            out.append((path, st.st_ino, st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_atime_ns))
    st = os.lstat(root)
    out.append((root, st.st_ino, st.st_mode, st.st_mtime_ns, st.st_ctime_ns))
    return out


def _contents(root: str) -> list:
    """What it takes to rebuild ``root``'s entries: (path, kind, mode, data or link target), parents first."""
    out: list[tuple] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                out.append((path, "d", stat.S_IMODE(st.st_mode), None))
            elif stat.S_ISLNK(st.st_mode):
                out.append((path, "l", 0, os.readlink(path)))
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    out.append((path, "f", stat.S_IMODE(st.st_mode), f.read()))
    return out


def _clear(root: str) -> None:
    for folder, dirs, files in os.walk(root, topdown=False):
        for name in files:
            os.unlink(os.path.join(folder, name))
        for name in dirs:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                os.unlink(path)
            else:
                os.chmod(path, 0o700)
                os.rmdir(path)


def _rebuild(root: str, contents: list) -> None:
    """Put ``root`` back to ``contents`` (folders are made writable while filling them, then given their mode)."""
    _clear(root)
    for path, kind, mode, data in contents:
        if kind == "d":
            os.mkdir(path, 0o700)
        elif kind == "l":
            os.symlink(data, path)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(fd, "wb") as f:
                f.write(data)
            os.chmod(path, mode)
    for path, kind, mode, _ in reversed(contents):
        if kind == "d":
            os.chmod(path, mode)


class Folders:
    """The writable folders as the import left them; :meth:`restore` puts them back after a call changed them."""

    def __init__(self, roots: list[str]) -> None:
        self.roots = [r for r in roots if os.path.isdir(r) and not os.path.islink(r)]
        self.contents = {r: _contents(r) for r in self.roots}
        for r in self.roots:  # settle access times, so that a later read does not show as a change
            os.listdir(r)
        self.states = {r: _state(r) for r in self.roots}

    def restore(self) -> None:
        for r in self.roots:
            if _state(r) != self.states[r]:
                _rebuild(r, self.contents[r])
                self.states[r] = _state(r)


def _fd_ids(fds) -> list:
    out: list[tuple[int, int] | None] = []
    for fd in fds:
        try:
            st = os.fstat(fd)
            out.append((st.st_dev, st.st_ino))
        except OSError:
            out.append(None)
    return out


def _privatize_shared_memory() -> None:
    """Replace every shared mapping (``mmap.mmap(-1, n)``, a mapped file) by a private copy: a call's writes to it
    then stay in that call's process. Raises MemoryError when a copy cannot be made."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    with open("/proc/self/maps") as f:
        lines = f.read().splitlines()
    for line in lines:
        span, perms = line.split()[:2]
        if perms[3] != "s":
            continue
        start, end = (int(x, 16) for x in span.split("-"))
        prot = (1 if perms[0] == "r" else 0) | (2 if perms[1] == "w" else 0) | (4 if perms[2] == "x" else 0)
        if not prot & 1:
            libc.mprotect(start, end - start, prot | 1)
        data = ctypes.string_at(start, end - start)
        got = libc.mmap(start, end - start, 3, 0x32, -1, 0)  # RW, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED
        if got != start:
            raise MemoryError("a shared mapping could not be made private")
        ctypes.memmove(start, data, end - start)
        libc.mprotect(start, end - start, prot)


def seal(job: dict, libc, ids: list) -> str | None:
    """After the import: nothing made by the program may be shared by the calls. None, or why the program fails."""
    kill_others(job)
    reap(job)
    if len(os.listdir("/proc/self/task")) > 1:
        return "ThreadAtImport"
    if _fd_ids((0, 1, 2, _result_fd)) != ids:
        return "FdsChangedAtImport"
    os.closerange(3, _result_fd)
    os.closerange(_result_fd + 1, 1 << 16)
    sys.settrace(None)
    sys.setprofile(None)
    try:
        _privatize_shared_memory()
    except (MemoryError, OSError, ValueError):
        return "SharedMemoryAtImport"
    _prctl(libc, PR_SET_DUMPABLE, 0)
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    return None


def flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - the program may have replaced or closed them
            pass


def load(program: str) -> dict | None:
    """Run the program (its import); its namespace, or None once its failure is reported."""
    try:
        code = compile(program, "<program>", "exec")
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes
        report("S", type(e).__name__)
        return None
    namespace = {"__name__": "__program__"}
    try:
        exec(code, namespace)
    except BaseException as e:  # noqa: BLE001 - anything the program raises (SystemExit too) is its failure
        report("X", type(e).__name__)
        return None
    return namespace


def call(i: int, kind: str, source: str, namespace: dict, mask) -> None:
    """In the child: evaluate call ``i`` and report it."""
    os.setpgid(0, 0)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    message: tuple[object, ...]
    try:
        if kind == "call":
            message = ("V", i, _repr(eval(compile(source, "<test>", "eval"), namespace)))
        else:
            exec(compile(source, "<test>", "exec"), namespace)
            message = ("T", i)
    except BaseException as e:  # noqa: BLE001
        message = ("E", i, type(e).__name__)
    flush()  # what the test printed reaches the parent before its result
    report(*message)


def wait_child(pid: int, timeout_s: float) -> bool:
    """Whether child ``pid`` ended within ``timeout_s`` (it is not reaped)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): poll
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            time.sleep(0.001)
        return False
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def run_call(i: int, kind: str, source: str, namespace: dict, job: dict, mask) -> None:
    """One call in a fresh child; then kill what it left and reap it. ``["O", i]`` when it runs out of time."""
    pid = os.fork()
    if pid == 0:
        try:
            call(i, kind, source, namespace, mask)
        finally:
            _exit(0)
    if not wait_child(pid, job["call_timeout_s"]):
        report("O", i)
    else:
        ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if ended is not None and ended.si_code in (os.CLD_KILLED, os.CLD_DUMPED) and ended.si_status in STOP_SIGNALS:
            report("I")
    kill_others(job, pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    reap(job)


def template(job: dict, libc, workdir: str, roots: list[str]) -> None:
    """The sandbox uid's first process: set up, load the program, seal, then every call in a child of its own."""
    try:
        setup(job, libc, workdir)
    except Exception as e:  # noqa: BLE001 - the sandbox cannot be built: the program must not run
        report("F", f"{type(e).__name__}: {e}")
        return
    report("R")
    ids = _fd_ids((0, 1, 2, _result_fd))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    namespace = load(job["program"])
    if namespace is None:
        return
    flush()
    why = seal(job, libc, ids)
    if why is not None:
        report("X", why)
        return
    report("P")
    folders = Folders(roots)
    for i, (kind, source) in enumerate(job["calls"]):
        run_call(i, kind, source, namespace, job, mask)
        folders.restore()
    report("D")


def main(argv: list[str]) -> None:
    global _result_fd, _max_line
    ignore_stop_signals()  # blocked until now (the parent launched the sandbox with them blocked)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    job_fd = int(argv[0])
    chunks = []
    while chunk := os.read(job_fd, 1 << 20):
        chunks.append(chunk)
    os.close(job_fd)
    job = json.loads(b"".join(chunks))
    _result_fd, _max_line = job["result_fd"], job["max_line"]
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        warden(job, libc)
    except Exception as e:  # noqa: BLE001 - the sandbox cannot be built: the program must not run
        report("F", f"{type(e).__name__}: {e}")
    _exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
