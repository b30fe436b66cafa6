"""The harness that runs INSIDE the sandboxed interpreter (see :mod:`graft.reward.sandbox`).

Started as ``python -I -S -B -X utf8 -c <this file's source> JOB_FD``: stdlib only, nothing from graft.
It reads the job (JSON: the program, the test calls or test code, the limits, the uid to drop to,
the result fd) from the memfd ``JOB_FD``, then, while still trusted:

1. when asked (the rlimits fallback run as root): enters new mount/network/IPC/UTS namespaces, mounts
   private size-limited tmpfs over the world-writable folders and, when the interpreter lives under a
   folder the sandbox uid cannot enter, re-binds it read-only at its own path;
2. when given a uid: drops to it (no supplementary groups, no capabilities, no_new_privs, parent-death
   SIGKILL);
3. sets the rlimits, closes every fd but 0/1/2 and the result fd, enters its working folder;

and reports, one JSON line each on the result fd (never stdout): ``["R"]`` ready, then ``["S", kind]``
(the program does not compile) or ``["X", kind]`` (it raised at import) or ``["P"]`` (it loaded), then per
test ``["V", i, repr(value)]`` / ``["T", i]`` (test code ran through) / ``["E", i, exception type]``,
then ``["D"]``. ``["F", message]``: the sandbox itself is unusable (the parent reports "error").

The program runs in this same interpreter, so it can forge or suppress these lines; the parent therefore
compares the reported reprs with the expected values itself (they never come in here) and counts a
missing line as a failure.
"""

import ctypes
import json
import os
import resource
import signal
import sys

_dumps = json.dumps
_write = os.write
_repr = repr
_exit = os._exit

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWNET = 0x20000, 0x4000000, 0x8000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 32, 4096, 16384, 1 << 18
MS_RDONLY = 1
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/run/lock", "/dev/shm")
"""Covered by a private tmpfs in the fallback's mount namespace."""

_result_fd = -1
_max_line = 1 << 20


def report(*fields) -> None:
    data = (_dumps(list(fields), ensure_ascii=True) + "\n").encode("ascii")
    if len(data) > _max_line and fields[0] == "V":
        data = (_dumps(["E", fields[1], "ResultTooLarge"]) + "\n").encode("ascii")
    try:
        while data:
            data = data[_write(_result_fd, data) :]
    except OSError:  # the program closed or broke the result fd: nothing more can be reported
        _exit(0)


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


def enter_namespaces(tmpfs_bytes: int) -> bool:
    """Private mount + network (+ IPC, UTS) namespaces; False when the kernel refuses (no CAP_SYS_ADMIN)."""
    libc = ctypes.CDLL(None, use_errno=True)
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


def drop_privileges(uid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getegid() != uid:
        raise OSError("the uid did not change")
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def set_limits(limits: dict) -> None:
    for name, value in limits.items():
        which = getattr(resource, name)
        hard = resource.getrlimit(which)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def setup(job: dict) -> None:
    """Everything before the program runs; raises OSError when the sandbox cannot be built."""
    global _result_fd, _max_line
    _result_fd, _max_line = job["result_fd"], job["max_line"]
    os.umask(0o022)
    workdir = job["workdir"]
    if job["unshare"] and enter_namespaces(job["tmpfs_bytes"]):
        workdir = "/tmp"
    if job["uid"] is not None:
        drop_privileges(job["uid"])
    stdlib = os.path.dirname(os.__file__)
    if not os.access(stdlib, os.R_OK | os.X_OK):
        raise OSError(f"the sandbox cannot read the interpreter's stdlib {stdlib}")
    set_limits(job["limits"])
    os.closerange(3, _result_fd)
    os.closerange(_result_fd + 1, 1 << 16)
    os.chdir(workdir)


def flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - the program may have replaced or closed them
            pass


def run_tests(program: str, tests: list) -> None:
    try:
        code = compile(program, "<program>", "exec")
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes
        report("S", type(e).__name__)
        return
    namespace = {"__name__": "__program__"}
    try:
        exec(code, namespace)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - anything the program raises is its failure
        report("X", type(e).__name__)
        return
    report("P")
    for i, (kind, source) in enumerate(tests):
        message: tuple[object, ...]
        try:
            if kind == "call":
                message = ("V", i, _repr(eval(compile(source, "<test>", "eval"), namespace)))
            else:
                exec(compile(source, "<test>", "exec"), namespace)
                message = ("T", i)
        except SystemExit:
            raise
        except BaseException as e:  # noqa: BLE001
            message = ("E", i, type(e).__name__)
        flush()  # what the test printed reaches the parent before its result
        report(*message)


def main(argv: list[str]) -> None:
    job_fd = int(argv[0])
    chunks = []
    while chunk := os.read(job_fd, 1 << 20):
        chunks.append(chunk)
    os.close(job_fd)
    job = json.loads(b"".join(chunks))
    try:
        setup(job)
    except Exception as e:  # noqa: BLE001 - the sandbox cannot be built: the program must not run
        report("F", f"{type(e).__name__}: {e}")
        _exit(0)
    report("R")
    run_tests(job["program"], job["tests"])
    report("D")
    _exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
