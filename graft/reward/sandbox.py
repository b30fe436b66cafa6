"""Run untrusted, model-written Python against unit tests, outside the trainer's process and environment.

``parse_tests`` turns a row's tests into :class:`TestCase` s; ``run_tests`` runs a program against them in
a sandbox and returns a :class:`SandboxResult`; ``isolation()`` names the mechanism in use.

How a run goes
--------------
A fresh interpreter (``python -I -S -B``: no site-packages, no user site, no ``PYTHON*`` variables) runs
:mod:`graft.reward.sandbox_harness` with an environment of only ``PATH``, ``HOME``, ``LANG``, in its own session
(a signal to graft's process group never reaches it), under rlimits (address space ``memory_mb``, CPU time, file
size, open files, core 0, processes, POSIX message queues 0), with stdin from /dev/null and stdout/stderr captured
by this process up to ``max_output_bytes`` each (more than that kills the run: status and failure
``"output_limit"``). Its first process, the *warden*, never runs the program; it forks the *template*, which drops
privileges, installs a seccomp filter (no SysV IPC, message queues, keyrings, ptrace, namespaces, mounts, or
changing another process's scheduling or limits; x86-64 and aarch64) and imports the program.

**Test calls share nothing.** After the import the template seals what the calls could share (kills every other
process of the sandbox, refuses a program that left a thread running or changed fds 0-2, closes the program's
fds, makes shared memory mappings private, becomes non-dumpable, blocks signals, records the writable folders);
then every call runs in a child forked from it, and after each the template kills what the call left, reaps it
and puts the writable folders back as the import left them. The calls come in an order drawn afresh from the OS's
randomness at every run (this process shuffles them and maps the results back), so nothing in the sandbox knows
the order of a row's tests either. A program that tampers with the template at import is in the same interpreter
and could undo the seal; it then still sees the calls in a random order, and the monitor flags the tampering.

**Expected values never enter the sandbox.** For a split test (``assert CALL == LITERAL``) only ``CALL`` goes in;
each child reports ``repr()`` of the value and THIS process parses it with ``ast.literal_eval`` and compares it
with the expected literal strictly (:func:`same`: the same type at every depth, ``True != 1``, ``92.0 != 92``;
floats with ``math.isclose(rel_tol=1e-9, abs_tol=1e-12)``; a repr that is not a literal is a wrong answer). So
patching ``assert``/``==``/builtins, returning an object with a forged ``__eq__``, printing fake results, writing to
other fds, or exiting early (missing results fail: ``"missing_result"``) cannot earn a pass for a value the program
does not compute. Timeouts: the template stops a call after ``test_timeout_s`` (failure ``"timeout"``, the other
calls still run); this process stops the run ``test_timeout_s`` + ``CALL_SLACK_S`` after the last reported result
(or after the start, for the import) and after ``timeout_s`` in all (status ``"timeout"``).

**Stop signals** (SIGTERM, SIGINT, SIGHUP). A cluster that stops a job signals every process of its cgroup, the
sandbox's too. The sandbox is launched with them blocked and all its processes ignore them (whatever the calling
process does with them: a grader worker ignores them, a process grading in-process handles them), so they change
nothing for a program that leaves them alone. A program may handle them or restore their default itself; a stop
signal that reaches the sandbox's first process, or kills one of the program's, marks the result ``interrupted``
(:attr:`SandboxResult.interrupted`): the code reward then answers status ``interrupted`` and the grader grades the
program again, once (:mod:`graft.reward.grader`), so that an interrupted program is never scored.

**Extra tests** (``run_tests(..., extra=...)``: a detector's held-out tests) run after every test, only when enough
tests passed, and are reported apart; the program cannot tell them from the tests.

**Code tests** (``TestCase(code=...)``: unsplittable test code such as HumanEval's ``check(candidate)``)
run inside the sandbox, in a call's child, and the harness reports pass/fail: a program can forge that verdict by
tampering with the harness (it shares the interpreter). graft's built-in code task uses split tests only; use code
tests for evaluation of trusted models, not as an RL reward.

Isolation
---------
``bwrap`` (bubblewrap, when installed and its self-test passes; detected once per process): new PID,
network, IPC, UTS, cgroup (and, when not root, user) namespaces; a root file system of only /usr,
/bin, /lib*, /sbin and the interpreter's prefix, all read-only, with every third-party package folder (graft
among them, where installed) covered by an empty tmpfs; a fresh ``/proc``, a read-only minimal ``/dev``, and a
64 MiB tmpfs ``/tmp`` as the working folder. The warden is the PID namespace's init (``--as-pid-1``): when it ends,
the kernel kills and reaps every process in it, and bwrap reaps the warden. When graft runs as root, the template
drops to a dedicated uid (61000 + a random slot, locked per run), so RLIMIT_NPROC counts the sandbox alone, no host
file is writable and no host process can be signalled. No network, no writes outside the tmpfs, no view of the
host's processes, their environments or memory, nor of graft's code, the run folder or its config.

``rlimits+setuid`` (no usable bwrap, graft runs as root): the warden enters new mount, network, IPC
and UTS namespaces (``isolation()`` then says ``+namespaces``), covers /tmp, /var/tmp, /run/lock and
/dev/shm with private tmpfs, hides a non-public folder holding the interpreter (e.g. /root) behind a
tmpfs with only the interpreter bound back read-only; it keeps root (a child subreaper the sandbox uid cannot
signal), the template drops to a dedicated uid as above; every process of that uid is killed at the end. It does
NOT isolate: reading the host's file system (whatever is world-readable: graft's code, a world-readable run
folder), writing to world-writable places other than those four folders (and world-writable UNIX sockets; those
places are also a channel between calls), the list of host processes and their command lines (/proc is the
host's; environments and memory of other uids stay unreadable). Where the kernel refuses the namespaces (no
CAP_SYS_ADMIN, e.g. a default Docker container) it does not isolate the network nor /tmp either, and an
interpreter the sandbox uid cannot read makes it unusable.

``rlimits`` (no usable bwrap, not root): rlimits, the seccomp filter, a scrubbed environment, a temporary working
folder and, at the end, killing the process group and every process still carrying the run's marker variable. It
does NOT isolate anything else: the program runs as graft's own user, so it can read the environment and memory of
graft's processes (``/proc/<pid>/environ``: tracker keys; ``/proc/<pid>/mem`` where ptrace rules allow it: the
expected values), signal or kill them, read and write every file the user can, use the network, and survive a
call or the final kill by leaving its process group and dropping its marker.

The code domain refuses both weaker mechanisms unless ``reward.allow_weak_sandbox`` is set
(:func:`graft.reward.code.check_isolation`). Memory is limited per process (RLIMIT_AS): a run can hold up to
``MAX_PROCESSES`` x ``memory_mb`` plus its tmpfs.

``none: ...``: no mechanism passed its self-test (e.g. root without namespaces and an interpreter the
sandbox uid cannot read); every run returns status ``"error"`` rather than run code as root.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import math
import os
import pwd
import secrets
import selectors
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from graft.reward.asserts import TestCase as TestCase, exception_kind, one_line, outcome, parse_tests as parse_tests

MAX_PROCESSES = 16
"""RLIMIT_NPROC inside the sandbox (processes and threads of the sandbox uid)."""
MAX_OPEN_FILES = 64
MAX_FILE_BYTES = 64 << 20
TMPFS_BYTES = 64 << 20
UID_BASE, UID_SPAN = 61000, 4000
"""Dedicated sandbox uids (when root): one per concurrent run, locked by a file in a root-only folder."""
KILL_WAIT_S = 1.0
SELF_TEST_TIMEOUT_S = 10.0
MECHANISMS = ("bwrap", "rlimits+setuid", "rlimits")
STATUSES = ("ok", "timeout", "output_limit", "error", "no_program")
_MARKER = "GRAFT_SANDBOX_RUN"


@dataclass
class SandboxResult:
    passed: int
    total: int
    status: str
    """"ok" (every test ran; passed may be < total), "timeout", "output_limit" (the run stopped before every test
    had run), "error" (sandbox/infra: failure is None then), "no_program"."""
    failure: str | None
    """Kind of the first failing test (in the order given, whatever order they ran in): "wrong_answer",
    "exception:<TypeName>", "syntax", "timeout", "memory", "output_limit", "missing_result"; None when all passed
    (or status is "error"/"no_program")."""
    seconds: float
    stdout: str = ""
    stderr: str = ""
    """The program's output, each cut at max_output_bytes; for status "error", what went wrong."""
    extra_passed: int = 0
    extra_total: int = 0
    extra_failure: str | None = None
    """The ``extra`` tests (:func:`run_tests`): how many passed, of how many, and the kind of the first that failed
    ("not_run" when they were skipped: fewer than ``extra_after`` tests passed)."""
    interrupted: bool = False
    """A stop signal from outside (SIGTERM, SIGINT, SIGHUP: a cluster stopping the job) reached the sandbox while it
    ran, or killed one of its processes: the result may not be the program's own. Grade it again."""


# ---------------------------------------------------------------------------------------------- running


def run_tests(
    program: str,
    tests: list[TestCase],
    *,
    extra: list[TestCase] | tuple[TestCase, ...] = (),
    extra_after: int | None = None,
    timeout_s: float = 10.0,
    test_timeout_s: float = 3.0,
    memory_mb: int = 512,
    max_output_bytes: int = 1 << 20,
) -> SandboxResult:
    """Run ``program`` against ``tests`` in the sandbox (see the module docstring): every test in a process of its
    own, forked after the import, in an order drawn afresh. ``extra`` tests (a detector's held-out tests) run after
    all of ``tests``, only when at least ``extra_after`` of them passed (default: all), and are reported apart
    (``SandboxResult.extra_*``); the program cannot tell them from the others. Never raises for anything the
    program does; returns within about ``timeout_s`` + 2 s (the first call in a process also runs the mechanism's
    self-test: ~0.1 s, at most SELF_TEST_TIMEOUT_S). Thread- and worker-safe."""
    t0 = time.monotonic()
    tests, extra = list(tests), list(extra)
    if not isinstance(program, str) or not program.strip():
        return SandboxResult(0, len(tests), "no_program", None, 0.0, extra_total=len(extra), extra_failure="not_run")
    mechanism = _mechanism()
    if mechanism not in MECHANISMS:
        return SandboxResult(
            0, len(tests), "error", None, time.monotonic() - t0, stderr=f"no usable sandbox: {isolation()}",
            extra_total=len(extra), extra_failure="not_run",
        )  # fmt: skip
    plan = _Plan.draw(tests, extra, len(tests) if extra_after is None else extra_after)
    try:
        return _run(mechanism, program, plan, _Options(timeout_s, test_timeout_s, memory_mb, max_output_bytes), t0)
    except Exception as e:  # noqa: BLE001 - infrastructure trouble is reported, never raised
        return SandboxResult(
            0, len(tests), "error", None, time.monotonic() - t0, stderr=f"sandbox error: {type(e).__name__}: {e}",
            extra_total=len(extra), extra_failure="not_run",
        )  # fmt: skip


@dataclass(frozen=True)
class _Options:
    timeout_s: float
    test_timeout_s: float
    memory_mb: int
    max_output_bytes: int


@dataclass(frozen=True)
class _Plan:
    """The calls in the order they run: ``tests`` shuffled, then ``extra`` shuffled (``calls[i]`` is
    ``(is_extra, index into its list)``), drawn from the OS's randomness for every run."""

    tests: list[TestCase]
    extra: list[TestCase]
    extra_after: int
    calls: list[tuple[bool, int]]

    @classmethod
    def draw(cls, tests: list[TestCase], extra: list[TestCase], extra_after: int) -> "_Plan":
        rng = secrets.SystemRandom()
        order = [(False, j) for j in rng.sample(range(len(tests)), len(tests))]
        order += [(True, j) for j in rng.sample(range(len(extra)), len(extra))]
        return cls(tests, extra, extra_after, order)

    def case(self, i: int) -> TestCase:
        is_extra, j = self.calls[i]
        return self.extra[j] if is_extra else self.tests[j]


def _run(mechanism: str, program: str, plan: _Plan, opts: _Options, t0: float) -> SandboxResult:
    root = os.geteuid() == 0
    lease = _lease_uid() if root and mechanism != "rlimits" else None  # "rlimits" as root: tests only
    uid = lease[0] if lease else None
    marker = secrets.token_hex(16) if mechanism == "rlimits" else None
    workdir = None
    try:
        workdir = None if mechanism == "bwrap" else tempfile.mkdtemp(prefix="graft-sandbox-")
        if uid is not None and mechanism != "bwrap":
            _kill_uid(uid, surely=False)  # leftovers of a run whose parent died (bwrap: none outlive its PID namespace)
            if workdir:
                os.chown(workdir, uid, uid)
        job = _job(mechanism, program, plan, opts, uid=uid, workdir=workdir or "/tmp")
        watcher = _Watcher(plan, opts, t0)
        proc, fds = _launch(mechanism, job, workdir, marker)
        try:
            watcher.watch(proc, *fds)
        finally:
            _stop(proc, mechanism, uid, marker)
            watcher.late(fds[0])
            for fd in fds:
                os.close(fd)
    finally:
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        if lease:
            os.close(lease[1])
    return watcher.result(time.monotonic() - t0)


def _job(mechanism: str, program: str, plan: _Plan, opts: _Options, *, uid: int | None, workdir: str) -> dict:
    limits = {
        "RLIMIT_AS": opts.memory_mb << 20,
        "RLIMIT_CPU": math.ceil(opts.timeout_s) + 1,
        "RLIMIT_FSIZE": MAX_FILE_BYTES,
        "RLIMIT_NOFILE": MAX_OPEN_FILES,
        "RLIMIT_CORE": 0,
        "RLIMIT_NPROC": MAX_PROCESSES,
        "RLIMIT_MSGQUEUE": 0,
    }
    calls = [plan.case(i) for i in range(len(plan.calls))]
    return {
        "program": program,
        "uid": uid,
        "pidns": mechanism == "bwrap",
        "unshare": mechanism == "rlimits+setuid",
        "seccomp": True,
        "workdir": workdir,
        "roots": ["/tmp"] if mechanism == "bwrap" else [workdir],
        "limits": limits,
        "tmpfs_bytes": TMPFS_BYTES,
        "max_line": opts.max_output_bytes,
        "call_timeout_s": opts.test_timeout_s,
        "calls": [["code", t.code] if t.code is not None else ["call", t.call] for t in calls],
    }


@functools.cache
def _harness_source() -> str:
    return Path(__file__).with_name("sandbox_harness.py").read_text()


def _python() -> str:
    return os.path.realpath(sys.executable)


def _hidden_paths() -> list[str]:
    """Folders of third-party packages (graft among them when it is installed there): covered by an empty,
    read-only tmpfs in the bwrap sandbox, whose interpreter prefix and /usr are otherwise bound whole."""
    paths = set(site.getsitepackages()) | {site.getusersitepackages()}
    paths.add(str(Path(__file__).resolve().parents[2]))  # the folder graft is imported from
    return sorted(os.path.realpath(p) for p in paths if os.path.isdir(p))


def _bwrap_argv(root: bool) -> list[str]:
    """bubblewrap's arguments: every namespace, a read-only system + interpreter (without third-party packages),
    fresh /proc, a read-only /dev, a private /tmp; the harness is PID 1 of the sandbox (and reaps it)."""
    argv = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--new-session", "--as-pid-1", "--unshare-pid"]
    argv += ["--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not root:  # as root bwrap needs no user namespace, and the harness drops to the sandbox uid
        argv.append("--unshare-user")
    bound: list[str] = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
            bound.append(top)
    made: set[str] = set()
    for path in sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}):
        if any(path == b or path.startswith(b + "/") for b in bound):
            continue
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):  # parent folders open to the sandbox uid, whatever the host's modes
            folder = "/" + "/".join(parts[:i])
            if folder not in made:
                argv += ["--perms", "0755", "--dir", folder]
                made.add(folder)
        argv += ["--ro-bind", path, path]
        bound.append(path)
    for path in _hidden_paths():
        if any(path == b or path.startswith(b + "/") for b in bound):
            argv += ["--perms", "0555", "--tmpfs", path, "--remount-ro", path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    return argv + ["--size", str(TMPFS_BYTES), "--perms", "1777", "--tmpfs", "/tmp", "--chdir", "/tmp"]


def _launch(mechanism: str, job: dict, workdir: str | None, marker: str | None):
    """Start the sandbox; returns (process, (result fd, stdout fd, stderr fd)) - read ends, ours to close."""
    result_r, result_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    job_fd = os.memfd_create("graft-sandbox-job")
    try:
        job["result_fd"] = result_w
        data = json.dumps(job).encode()
        while data:
            data = data[os.write(job_fd, data) :]
        os.lseek(job_fd, 0, os.SEEK_SET)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir or "/tmp", "LANG": "C.UTF-8"}
        if marker:
            env[_MARKER] = marker
        argv = [_python(), "-I", "-S", "-B", "-X", "utf8", "-c", _harness_source(), str(job_fd)]
        if mechanism == "bwrap":
            argv = _bwrap_argv(os.geteuid() == 0) + argv
        with _stop_signals_blocked():  # bwrap and the harness start with them blocked; the harness ignores them
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                env=env,
                cwd="/",
                pass_fds=(job_fd, result_w),
                start_new_session=True,
                close_fds=True,
            )
    except BaseException:
        for fd in (result_r, out_r, err_r):
            os.close(fd)
        raise
    finally:
        for fd in (result_w, out_w, err_w, job_fd):
            os.close(fd)
    return proc, (result_r, out_r, err_r)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""The signals that stop graft (:data:`graft.signals.STOP_SIGNALS`; this module imports nothing of graft's)."""


@contextlib.contextmanager
def _stop_signals_blocked():
    """The stop signals blocked in this thread while inside: a process started inside inherits the block."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


CALL_SLACK_S = 1.0
"""The harness stops a call after ``test_timeout_s`` itself; this process gives it this much longer (since the
last reported result) before it stops the whole run."""


class _Watcher:
    """Reads the sandbox's result lines and output, enforces the timeouts and the output limit, and ends the run
    when the tests are all in and the extra tests are not wanted."""

    def __init__(self, plan: _Plan, opts: _Options, t0: float) -> None:
        self.plan, self.opts, self.t0 = plan, opts, t0
        self.n = len(plan.calls)
        self.last: float | None = None  # when the harness last reported (None: not started yet)
        self.ready = self.loaded = self.finished = False
        self.fatal: str | None = None
        self.program_failure: str | None = None
        self.stop: str | None = None  # "timeout" | "output_limit"
        self.interrupted = False
        self.outcomes: dict[int, tuple[str, object]] = {}
        self.pending = bytearray()
        self.output = {"stdout": bytearray(), "stderr": bytearray()}

    def watch(self, proc: subprocess.Popen, result_fd: int, out_fd: int, err_fd: int) -> None:
        names = {result_fd: "result", out_fd: "stdout", err_fd: "stderr"}
        with selectors.DefaultSelector() as sel:
            for fd in names:
                os.set_blocking(fd, False)
                sel.register(fd, selectors.EVENT_READ)
            while not self.finished and self.stop is None and self.fatal is None:
                now = time.monotonic()
                deadline = self.t0 + self.opts.timeout_s
                if self.last is not None:
                    deadline = min(deadline, self.last + self.opts.test_timeout_s + CALL_SLACK_S)
                if now >= deadline:
                    self.stop = "timeout"
                    break
                exited = _exited(proc)
                ready = sel.select(0 if exited else min(deadline - now, 0.1)) if sel.get_map() else []
                if not ready and not sel.get_map() and not exited:
                    time.sleep(min(deadline - now, 0.02))
                for key, _ in ready:
                    self._read(sel, key.fd, names[key.fd])
                if exited and not ready:
                    break
            self._drain(sel, names)

    def _drain(self, sel: selectors.BaseSelector, names: dict[int, str]) -> None:
        """What the program printed before the end that is still in the pipes (bounded: it may still write)."""
        for fd, name in names.items():
            for _ in range(self.opts.max_output_bytes // (1 << 16) + 2):
                if name == "result" or fd not in sel.get_map() or self.stop == "output_limit" or not self._read(sel, fd, name):
                    break

    def _read(self, sel: selectors.BaseSelector, fd: int, name: str) -> bool:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return False
        if not data:
            sel.unregister(fd)
            return False
        limit = self.opts.max_output_bytes
        if name == "result":
            self.pending += data
            *lines, rest = self.pending.split(b"\n")
            self.pending = bytearray(rest)
            for line in lines:
                self._handle(line)
            if len(self.pending) > limit + 4096:
                self.stop = "output_limit"
            return True
        buf = self.output[name]
        room = limit - len(buf)
        buf += data[: max(0, room)]
        if len(data) > room:  # the excess is dropped, and the run stopped
            self.stop = "output_limit"
        return True

    def _handle(self, line: bytes | bytearray) -> None:
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            return
        if not isinstance(msg, list) or not msg or not isinstance(msg[0], str):
            return
        tag, now = msg[0], time.monotonic()
        if tag == "I":
            self.interrupted = True
        elif not self.ready:  # before "R" only the trusted harness writes
            if tag == "R":
                self.ready, self.last = True, now
            elif tag == "F":
                self.fatal = " ".join(map(str, msg[1:])) or "unknown"
        elif tag in ("S", "X") and not self.loaded and self.program_failure is None:
            self.program_failure = "syntax" if tag == "S" else exception_kind(msg[1] if len(msg) > 1 else None, False)
            self.finished = True
        elif tag == "P" and not self.loaded:
            self.loaded, self.last = True, now
        elif tag in ("V", "T", "E", "O") and self.loaded and len(msg) >= 2 and type(msg[1]) is int:
            self._record(msg[1], tag, msg[2] if len(msg) > 2 else None, now)
        elif tag == "D":
            self.finished = True

    def late(self, result_fd: int) -> None:
        """After the sandbox ended (every writer of the result pipe is gone): whether the warden reported a stop
        signal after the run was over for this process (read at most what the pipe holds: it has no writer left)."""
        pending = bytes(self.pending)
        os.set_blocking(result_fd, False)
        for _ in range(self.opts.max_output_bytes // (1 << 16) + 2):
            try:
                data = os.read(result_fd, 1 << 16)
            except OSError:  # BlockingIOError: a writer is still alive (it could not be killed); nothing more now
                break
            if not data:
                break
            pending += data
        self.interrupted |= b'\n["I"]\n' in b"\n" + pending

    def _record(self, i: int, tag: str, payload: object, now: float) -> None:
        """The first report of call ``i`` counts; the run ends when every call is in, or when the tests are in and
        too few passed for the extra tests to be wanted."""
        if not 0 <= i < self.n or i in self.outcomes:
            return
        self.outcomes[i] = (tag, payload)
        self.last = now
        n_tests = len(self.plan.tests)
        if len(self.outcomes) >= self.n:
            self.finished = True
        elif self.plan.extra and all(i in self.outcomes for i in range(n_tests)):
            passed = sum(self._kind(i) is None for i in range(n_tests))
            self.finished = passed < self.plan.extra_after

    def _kind(self, i: int, missing: str = "missing_result") -> str | None:
        return outcome(self.plan.case(i), *self.outcomes[i]) if i in self.outcomes else missing

    def result(self, seconds: float) -> SandboxResult:
        out = {k: v.decode("utf-8", "replace") for k, v in self.output.items()}
        plan, n_tests = self.plan, len(self.plan.tests)
        if not self.ready:
            why = self.fatal or ("timed out starting" if self.stop else "ended before starting")
            return SandboxResult(
                0, n_tests, "error", None, seconds, out["stdout"], f"sandbox did not start: {why}\n{out['stderr']}",
                extra_total=len(plan.extra), extra_failure="not_run", interrupted=self.interrupted,
            )  # fmt: skip
        missing = self.program_failure or self.stop or "missing_result"
        kinds: dict[tuple[bool, int], str | None] = {call: self._kind(i, missing) for i, call in enumerate(plan.calls)}
        tests = [kinds[(False, j)] for j in range(n_tests)]
        extra = [kinds[(True, j)] for j in range(len(plan.extra))]
        all_in = self.program_failure is not None or all(i in self.outcomes for i in range(n_tests))
        ran_extra = tests.count(None) >= plan.extra_after and self.program_failure is None
        return SandboxResult(
            tests.count(None), n_tests, "ok" if all_in else (self.stop or "ok"), next((k for k in tests if k), None),
            seconds, out["stdout"], out["stderr"], extra.count(None) if ran_extra else 0, len(plan.extra),
            next((k for k in extra if k), None) if ran_extra else "not_run", self.interrupted,
        )  # fmt: skip


def _exited(proc: subprocess.Popen) -> bool:
    """Whether the sandbox's first process ended, without reaping it (its pid stays ours to kill)."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


# ---------------------------------------------------------------------------------------------- cleanup


def _stop(proc: subprocess.Popen, mechanism: str, uid: int | None, marker: str | None) -> None:
    """End the sandbox and reap everything it started. A run that ended by itself has done so already: the
    harness's warden killed and reaped every process before it exited. Otherwise the sandbox's processes are
    killed while the warden lives, so that it (a child subreaper, under bwrap the PID namespace's init) reaps
    them: under bwrap the warden itself (its PID namespace dies with it and the kernel reaps the rest; bwrap
    reaps the warden and exits), under a dedicated uid every process of that uid (not the root warden), in the
    ``rlimits`` floor the processes carrying the run's marker but the warden. Then the warden is waited for (and
    killed with its process group if it does not end within ``KILL_WAIT_S``) and reaped."""
    if not _exited(proc):
        if mechanism == "bwrap":
            for pid in _children(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        elif uid is not None:
            _kill_uid(uid)
        elif marker is not None:
            _kill_marked(marker, spare=proc.pid)
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
    if uid is not None and mechanism != "bwrap":
        _kill_uid(uid)
    if marker is not None:
        _kill_marked(marker)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _pids(match) -> list[int]:
    """Live (non-zombie) processes for which ``match(pid)`` is true."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if match(int(name)):
                    out.append(int(name))
            except OSError:  # gone meanwhile, or not ours to read
                pass
    return out


def _has_uid(uid: int):
    def match(pid: int) -> bool:
        with open(f"/proc/{pid}/status", "rb") as f:
            head = f.read(1024)  # Name, Umask, State, ..., Uid come first
        at = head.find(b"\nUid:")
        return at >= 0 and int(head[at + 5 :].split(None, 1)[0]) == uid and b"\nState:\tZ" not in head

    return match


def _kill_uid(uid: int, *, surely: bool = True) -> None:
    """SIGKILL every process of the sandbox uid: ``kill -9 -1`` run AS that uid kills all of them at once
    (a fork cannot race it, unlike a scan of /proc), then anything a scan still finds, one by one.
    ``surely=False``: only when a scan finds some (before a run: leftovers of a parent that died)."""
    if surely or _pids(_has_uid(uid)):
        subprocess.run(
            ["/bin/sh", "-c", "kill -9 -1"],
            user=uid,
            group=uid,
            extra_groups=[],
            env={},
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=5,
            check=False,
        )
    _kill_matching(_has_uid(uid))


def _kill_marked(marker: str, spare: int | None = None) -> None:
    """The non-root fallback: SIGKILL our uid's processes whose initial environment holds the run's marker (but
    ``spare``)."""
    needle = f"{_MARKER}={marker}".encode()
    me = os.getpid()

    def match(pid: int) -> bool:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return pid not in (me, spare) and needle in f.read().split(b"\0")

    _kill_matching(match)


def _kill_matching(match) -> None:
    """SIGKILL every process ``match`` selects, again until a scan finds none (a fork may land between scans)."""
    for attempt in range(1, 10):
        pids = _pids(match)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01 * attempt)


def _lease_uid() -> tuple[int, int]:
    """A sandbox uid no other run uses: (uid, fd holding its lock; close it to release)."""
    folder = os.path.join(tempfile.gettempdir(), "graft-sandbox-uids")
    os.makedirs(folder, 0o700, exist_ok=True)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise OSError(f"{folder} must be a folder only this user can access")
    for _ in range(64):
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        try:
            pwd.getpwuid(uid)
            continue  # a real account: never use it
        except KeyError:
            pass
        fd = os.open(os.path.join(folder, str(uid)), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return uid, fd
    raise OSError("no free sandbox uid")


# ---------------------------------------------------------------------------------------------- detection

_FORCE: str | None = None
"""Tests only: use this mechanism instead of the detected one."""
_detected: dict[str, tuple[bool, str]] = {}
_detect_lock = threading.Lock()


def _probe(mechanism: str) -> tuple[bool, str]:
    """(usable, phrase or reason) for one mechanism; its self-test runs once per process."""
    with _detect_lock:
        if mechanism not in _detected:
            _detected[mechanism] = _self_test(mechanism)
        return _detected[mechanism]


def _self_test(mechanism: str) -> tuple[bool, str]:
    if mechanism == "bwrap" and not shutil.which("bwrap"):
        return False, "bwrap is not installed"
    if mechanism == "rlimits+setuid" and os.geteuid() != 0:
        return False, "needs root"
    program = "import socket\ndef f(x):\n    return x + 1\n"
    probe = [TestCase("f(1)", 2), TestCase("socket.create_connection(('127.0.0.1', 9), timeout=1) and 0", 0)]
    opts = _Options(SELF_TEST_TIMEOUT_S, SELF_TEST_TIMEOUT_S, 256, 1 << 16)
    try:
        r = _run(mechanism, program, _Plan(probe, [], len(probe), [(False, 0), (False, 1)]), opts, time.monotonic())
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {e}"
    if r.status != "ok" or r.passed < 1:  # the first test must pass; the second only probes the network
        return False, f"self-test: {r.status} {r.failure} {one_line(r.stderr, 200)}"
    no_network = r.failure == "exception:OSError"  # ENETUNREACH: no interface (a new network namespace)
    if mechanism == "rlimits+setuid" and no_network:
        return True, "rlimits+setuid+namespaces"
    return True, mechanism


def _mechanism() -> str:
    if _FORCE is not None:
        return _FORCE if _probe(_FORCE)[0] else f"none: {_probe(_FORCE)[1]}"
    for mechanism in ("bwrap", "rlimits+setuid" if os.geteuid() == 0 else "rlimits"):
        if _probe(mechanism)[0]:
            return mechanism
    return "none"


def problem(mechanism: str) -> str:
    """Why ``mechanism`` is not usable here, as a phrase ("bwrap is not installed"); "" when it is."""
    ok, why = _probe(mechanism)
    if ok:
        return ""
    return why if why.endswith(("not installed", "needs root")) else f"{mechanism} fails its self-test here ({why})"


def isolation() -> str:
    """The sandbox mechanism in use: "bwrap", "rlimits+setuid+namespaces", "rlimits+setuid", "rlimits",
    or "none: <why>" (then every run returns status "error")."""
    mechanism = _mechanism()
    if mechanism in MECHANISMS:
        return _probe(mechanism)[1]
    if mechanism != "none":
        return mechanism
    reasons = [f"{m}: {_probe(m)[1]}" for m in ("bwrap", "rlimits+setuid" if os.geteuid() == 0 else "rlimits")]
    return "none: " + "; ".join(reasons)
