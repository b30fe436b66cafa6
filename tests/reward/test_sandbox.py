"""The sandbox for model-written code (graft.reward.sandbox): honest programs are graded right, hostile
ones earn nothing, end in time and leave the host untouched.

Every sandbox test runs once per mechanism this machine offers ("bwrap"; "rlimits+setuid" when root):
the other is skipped with the reason. The attacks that would hurt the host if the sandbox were broken
(killing processes, fork bombs) first check that the program really runs as an unprivileged uid.
"""
from __future__ import annotations

import ast
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from textwrap import dedent

import pytest

from graft.reward import asserts, sandbox
from graft.reward.sandbox import SandboxResult, TestCase, parse_tests, run_tests

SLACK_S = 2.0  # run_tests returns within timeout_s + this
HARNESS_MARK = b"The harness that runs INSIDE the sandboxed interpreter"
DOUBLE = "def f(x):\n    return 2 * x\n"


@pytest.fixture(params=["bwrap", "rlimits+setuid"])
def mech(request, monkeypatch):
    ok, why = sandbox._probe(request.param)
    if not ok:
        pytest.skip(f"{request.param} is not usable here: {why}")
    monkeypatch.setattr(sandbox, "_FORCE", request.param)
    return request.param


@pytest.fixture
def unprivileged(mech):
    """For attacks that would hurt the host if the program ran as root."""
    r = run_tests("import os\n", [TestCase("os.getuid() != 0 and os.geteuid() != 0", True)])
    assert r.passed == 1, f"the sandbox program runs as root ({mech}): refusing the attack tests {r}"
    return mech


def timed_run(program: str, tests: list[TestCase], **kw) -> SandboxResult:
    t0 = time.monotonic()
    r = run_tests(program, tests, **kw)
    elapsed = time.monotonic() - t0
    assert elapsed < kw.get("timeout_s", 10.0) + SLACK_S, f"took {elapsed:.1f} s: {r}"
    assert r.status in sandbox.STATUSES
    return r


def sandbox_pids() -> list[int]:
    """Live processes of the sandbox: a dedicated uid, or the harness's command line."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                status = f.read(1024)  # State and Uid come first
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read(512)  # python -I -S -B -X utf8 -c <the harness's docstring first>
        except OSError:
            continue
        uid = int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))
        zombie = re.search(r"^State:\s+Z", status, re.M)
        in_range = sandbox.UID_BASE <= uid < sandbox.UID_BASE + sandbox.UID_SPAN
        if not zombie and (in_range or HARNESS_MARK in cmdline):
            out.append(int(name))
    return out


def assert_no_survivors() -> None:
    deadline = time.monotonic() + 1.0
    while sandbox_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sandbox_pids(), f"sandbox processes survived: {sandbox_pids()}"


@pytest.fixture
def world_writable_dir():
    """A host folder anyone may write to (a setuid-only sandbox could write and delete here)."""
    folder = Path(tempfile.mkdtemp(prefix="graft_escape_dir_"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------------------------------ parse_tests

def test_parse_tests_splits_assert_forms():
    tests = parse_tests(["assert f(3, 'ab') == 'ababab'", "assert [1, 2] == g(x=1)", "assert is_ok(2)",
                         "assert not is_ok(-1)", "assert f(1) == -2.5, 'message'",
                         "assert f(1) == 1\nassert f(2) == {'a': (1, None)}"])
    assert tests == [TestCase("f(3, 'ab')", "ababab"), TestCase("g(x=1)", [1, 2]), TestCase("is_ok(2)", True),
                     TestCase("is_ok(-1)", False), TestCase("f(1)", -2.5), TestCase("f(1)", 1),
                     TestCase("f(2)", {"a": (1, None)})]


def test_parse_tests_keeps_unsplittable_code_and_calls_check():
    humaneval = "METADATA = {}\n\ndef check(candidate):\n    assert candidate(1) == 2\n"
    [t] = parse_tests(humaneval, entry_point="double")
    assert t.call == "" and t.code == humaneval + "\n\ncheck(double)\n"
    [t] = parse_tests("import math\nassert f(1) == math.pi")
    assert t.code == "import math\nassert f(1) == math.pi"
    assert parse_tests("assert f(1) == float('inf')")[0] == TestCase("f(1) == float('inf')", True)


@pytest.mark.parametrize("bad", ["assert f(1) ==", "", [], ["assert f(1) == 1", 3], "def check(c):\n    pass\n"])
def test_parse_tests_refuses_unparsable_tests_in_one_line(bad):
    with pytest.raises(ValueError) as e:
        parse_tests(bad)
    assert "\n" not in str(e.value)


def test_testcase_needs_a_call_or_code():
    with pytest.raises(ValueError):
        TestCase()
    with pytest.raises(ValueError):
        TestCase("f(1)", 1, code="assert True")


# ------------------------------------------------------------------------------------------ honest programs

def test_isolation_uses_bwrap_when_it_works():
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed here")
    ok, why = sandbox._probe("bwrap")
    if not ok:
        assert not sandbox.isolation().startswith("bwrap")
        pytest.skip(f"bwrap is installed but unusable here: {why}")
    assert sandbox.isolation() == "bwrap"


def test_correct_program_passes_all(mech):
    r = timed_run(DOUBLE + "def g(s):\n    return [s, s.upper(), {s: None}]\n",
                  [TestCase("f(3)", 6), TestCase("f('ab')", "abab"), TestCase("g('x')", ["x", "X", {"x": None}])])
    assert (r.passed, r.total, r.status, r.failure) == (3, 3, "ok", None)


def test_wrong_answer_and_partial_count(mech):
    program = "def f(x):\n    return 2 * x if x < 3 else 0\n"
    r = timed_run(program, [TestCase("f(1)", 2), TestCase("f(2)", 4), TestCase("f(5)", 10), TestCase("f(6)", 12)])
    assert (r.passed, r.total, r.status, r.failure) == (2, 4, "ok", "wrong_answer")
    r = timed_run(DOUBLE, [TestCase("f(1)", (2,)), TestCase("f([1])", (1, 1)), TestCase("f(True)", True)])
    assert r.passed == 0 and r.failure == "wrong_answer"  # list != tuple, 2 != True, as in Python


def test_exception_kind_and_syntax_error(mech):
    r = timed_run(DOUBLE, [TestCase("f(None)", 0), TestCase("f(2)", 4)])
    assert (r.passed, r.status, r.failure) == (1, "ok", "exception:TypeError")
    r = timed_run("def f(x):\n    return x +\n", [TestCase("f(1)", 1)])
    assert (r.passed, r.status, r.failure) == (0, "ok", "syntax")
    r = timed_run("raise KeyError(1)\n", [TestCase("f(1)", 1)])
    assert (r.passed, r.failure) == (0, "exception:KeyError")
    r = run_tests("   \n", [TestCase("f(1)", 1)])
    assert (r.passed, r.status) == (0, "no_program")


def test_float_tolerance(mech):
    program = "def f(x):\n    return x / 3 * 3\ndef g():\n    return [0.1 + 0.2, {'a': 1e-13}]\n"
    r = timed_run(program, [TestCase("f(0.7)", 0.7), TestCase("g()", [0.3, {"a": 0.0}]), TestCase("f(1.0)", 1.001)])
    assert (r.passed, r.failure) == (2, "wrong_answer")


def test_humaneval_check_code_test(mech):
    check = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-1) == -2\n"
    [t] = parse_tests(check, entry_point="f")
    assert timed_run(DOUBLE, [t]).passed == 1
    r = timed_run("def f(x):\n    return x * x\n", [t])
    assert (r.passed, r.failure) == (0, "wrong_answer")


def test_program_may_use_its_own_folder_and_stdlib(mech):
    program = ("import collections, json, math, re\nopen('notes.txt', 'w').write('hi')\n"
               "def f():\n    return open('notes.txt').read() + str(math.isqrt(16))\n")
    r = timed_run(program, [TestCase("f()", "hi4")])
    assert r.passed == 1, r


def test_per_test_and_whole_run_timeouts_keep_the_other_passes(mech):
    # a call past test_timeout_s is stopped by the harness, and the other calls still run
    program = "import time\ndef f(x):\n    time.sleep(x)\n    return 1\n"
    r = timed_run(program, [TestCase("f(0)", 1), TestCase("f(60)", 1), TestCase("f(0)", 1)],
                  timeout_s=5.0, test_timeout_s=0.5)
    assert (r.passed, r.status, r.failure) == (2, "ok", "timeout")
    assert r.seconds < 3.0
    r = timed_run(program, [TestCase("f(0.2)", 1)] * 20, timeout_s=1.0, test_timeout_s=0.5)
    assert 0 < r.passed < 20 and (r.status, r.failure) == ("timeout", "timeout")


# ------------------------------------------------------------------------------------------ stop signals

SIG_STATE = dedent("""\
    def sig_state(where):
        fields = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
        print(where, int(fields["SigIgn"], 16), int(fields["SigBlk"], 16), flush=True)
        return 1
    sig_state("import")
""")
STOP_BITS = (1 << (1 - 1)) | (1 << (2 - 1)) | (1 << (15 - 1))   # SIGHUP, SIGINT, SIGTERM in /proc's masks


@pytest.mark.parametrize("caller", ["handles", "default"])
def test_the_program_ignores_the_stop_signals_whatever_the_caller_does(mech, caller):
    """A cluster's stop reaches the sandbox's processes too: they ignore it, as graft's workers do, also when the
    grading process handles the signals (grading in-process: a handler is reset to the default action by exec)."""
    from graft.signals import StopSignal

    with StopSignal() if caller == "handles" else open(os.devnull):
        r = run_tests(SIG_STATE, [TestCase("sig_state('call')", 1)])
    assert (r.status, r.passed) == ("ok", 1), r
    states = [line.split() for line in r.stdout.splitlines()]
    assert [w for w, _, _ in states] == ["import", "call"]
    for _, ignored, blocked in states:
        assert int(ignored) & STOP_BITS == STOP_BITS and int(blocked) & STOP_BITS == 0


@pytest.mark.parametrize("program, passed, interrupted", [
    ("import os, signal\nsignal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
     "def f(x):\n    os.kill(os.getpid(), signal.SIGTERM)\n", 0, True),
    ("import os, signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\nos.kill(os.getpid(), signal.SIGINT)\n", 0, True),
    ("import os, signal\ndef f(x):\n    os.kill(os.getpid(), signal.SIGTERM)\n    return 2 * x\n", 1, False),
    ("import os, signal\ndef f(x):\n    os.kill(os.getpid(), signal.SIGKILL)\n", 0, False),
], ids=["call killed by SIGTERM", "import killed by SIGINT", "SIGTERM ignored", "killed by SIGKILL"])
def test_a_program_killed_by_a_stop_signal_is_reported_interrupted(mech, program, passed, interrupted):
    """A stop signal that kills one of the program's processes (it restored the default action) marks the result:
    the grader grades it again rather than score it. A program that leaves the signals alone ignores them; any
    other end is the program's own."""
    r = run_tests(program, [TestCase("f(1)", 2)])
    assert (r.passed, r.interrupted) == (passed, interrupted), r
    assert r.failure == (None if passed else "missing_result"), r


def test_a_stop_signal_that_reaches_the_warden_marks_the_result_interrupted(monkeypatch):
    """A cluster's stop reaches every process of the sandbox; one that a program handles itself changes nothing
    visible, so the warden (PID 1 under bwrap, which gets only the signals it handles) reports that a stop reached the
    sandbox while it ran. Here SIGHUP to the warden alone, while the program's call sleeps: its result is right, and
    still marked."""
    if not sandbox._probe("bwrap")[0]:
        pytest.skip(f"bwrap is not usable here: {sandbox._probe('bwrap')[1]}")
    monkeypatch.setattr(sandbox, "_FORCE", "bwrap")
    sent = []

    def signal_the_warden():   # once it has forked the template (its handler is in place by then)
        deadline = time.monotonic() + 30
        while not sent and time.monotonic() < deadline:
            for warden in [w for bw in sandbox._children(os.getpid()) for w in sandbox._children(bw)]:
                if sandbox._children(warden):
                    os.kill(warden, signal.SIGHUP)
                    sent.append(warden)
            time.sleep(0.002)

    thread = threading.Thread(target=signal_the_warden)
    thread.start()
    r = run_tests("import time\ndef f(x):\n    time.sleep(0.5)\n    return 2 * x\n", [TestCase("f(1)", 2)])
    thread.join()
    assert sent and r.interrupted and (r.status, r.passed) == ("ok", 1), r
    assert not run_tests(DOUBLE, [TestCase("f(1)", 2)]).interrupted


def test_callable_from_threads_and_a_forkserver_worker():
    out = []
    threads = [threading.Thread(target=lambda x=x: out.append(run_tests(DOUBLE, [TestCase(f"f({x})", 2 * x)])))
               for x in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert [r.passed for r in out] == [1, 1, 1]
    with multiprocessing.get_context("forkserver").Pool(1) as pool:
        r = pool.apply(run_tests, (DOUBLE, [TestCase("f(4)", 8)]))
    assert r.passed == 1, r


# ------------------------------------------------------------------------------------------ hostile programs

@pytest.mark.parametrize("program", [
    "while True:\n    pass\n",
    "def f(x):\n    while True:\n        pass\n",
    dedent("""\
        import signal, time
        for s in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT, signal.SIGXCPU):
            signal.signal(s, signal.SIG_IGN)
        signal.setitimer(signal.ITIMER_REAL, 0)
        def f(x):
            while True:
                try:
                    time.sleep(100)
                except BaseException:
                    pass
    """),
], ids=["at import", "in the call", "ignoring signals"])
def test_infinite_loops_are_killed(mech, program):
    r = timed_run(program, [TestCase("f(1)", 2)], timeout_s=1.0, test_timeout_s=0.5)
    # a call is stopped by the harness (status ok: every test ran), the import by the whole run's clock
    assert (r.passed, r.failure) == (0, "timeout") and r.status == ("timeout" if "while" in program[:5] else "ok")
    assert_no_survivors()


def test_fork_bomb_is_contained_and_killed(unprivileged):
    program = dedent("""\
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """)
    r = timed_run(program, [TestCase("f(1)", 2)], timeout_s=1.0)
    assert r.passed == 0 and r.status == "timeout"
    assert_no_survivors()


ESCAPE = dedent("""\
    import os, time
    def f(x):
        r, w = os.pipe()
        if os.fork() == 0:
            os.setsid()  # out of the sandbox's session and process group
            if os.fork() == 0:
                os.write(w, b'x')
                time.sleep(120)
            os._exit(0)
        os.read(r, 1)  # the grandchild is up before the result is reported
        return 2 * x
""")


def test_children_that_escape_the_process_group_are_killed(unprivileged):
    r = timed_run(ESCAPE, [TestCase("f(1)", 2)])
    assert r.passed == 1, r
    assert_no_survivors()


@pytest.mark.parametrize("program", [
    "x = ' ' * 10**10\ndef f(x):\n    return 2\n",
    "def f(x):\n    keep = []\n    while True:\n        keep.append([0] * 10**6)\n",
    "def f(x):\n    keep = []\n    while True:\n        keep.append(bytearray(10**7))\n",
], ids=["huge string", "growing list", "growing bytearrays"])
def test_memory_bombs_fail_with_memory(mech, program):
    r = timed_run(program, [TestCase("f(1)", 2)], timeout_s=5.0, memory_mb=256)
    assert (r.passed, r.status, r.failure) == (0, "ok", "memory")


@pytest.mark.parametrize("program", [
    "for _ in range(1000):\n    print('x' * 10**6)\n",
    "import os\ndef f(x):\n    while True:\n        os.write(2, b'y' * 65536)\n",
    "print('x' * 10**9)\n",  # cannot even be built under 256 MB: a memory failure
], ids=["stdout", "stderr", "one print"])
def test_huge_output_is_cut_and_stops_the_run(mech, program):
    r = timed_run(program, [TestCase("f(1)", 2)], timeout_s=5.0, memory_mb=256, max_output_bytes=1 << 16)
    assert r.passed == 0 and r.failure in ("output_limit", "memory")
    assert r.status == ("output_limit" if r.failure == "output_limit" else "ok")
    assert len(r.stdout) <= 1 << 16 and len(r.stderr) <= 1 << 16


def test_writes_outside_its_folder_do_not_reach_the_host(mech, tmp_path, world_writable_dir):
    name = f"graft_escape_{uuid.uuid4().hex}"
    targets = [tmp_path / "escape.txt", world_writable_dir / "escape.txt", Path("/tmp") / name,
               Path("/var/tmp") / name, Path("/dev/shm") / name, Path.cwd() / name]
    program = dedent("""\
        def attack(paths):
            out = []
            for p in paths:
                try:
                    open(p, 'w').write('x')
                    out.append('wrote')
                except OSError as e:
                    out.append(type(e).__name__)
            return out
    """)
    r = timed_run(program, [TestCase(f"attack({[str(p) for p in targets]!r})", None)])
    assert r.status == "ok"
    assert [p for p in targets if p.exists()] == []


def test_deleting_host_files_fails(mech, tmp_path, world_writable_dir):
    sentinels = [tmp_path / "sentinel", world_writable_dir / "sentinel"]
    for s in sentinels:
        s.write_text("keep")
        s.chmod(0o666)
    program = dedent("""\
        import os, shutil
        def attack(paths):
            for p in paths:
                for op in (os.remove, os.rmdir, shutil.rmtree, lambda p: open(p, 'w').write('gone'),
                           lambda p: shutil.rmtree(os.path.dirname(p))):
                    try:
                        op(p)
                    except OSError:
                        pass
    """)
    r = timed_run(program, [TestCase(f"attack({[str(s) for s in sentinels]!r})", None)])
    assert r.status == "ok"
    assert [s.read_text() for s in sentinels] == ["keep", "keep"]


def test_the_parents_environment_is_unreadable(mech, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret-123")
    # /proc/<pid>/environ shows a process's initial environment: give one process the key from its start
    victim = subprocess.Popen(["sleep", "60"], env={**os.environ, "WANDB_API_KEY": "secret-123"})
    program = dedent("""\
        import os
        def leak(pids):
            found = [repr(dict(os.environ))]
            for pid in list(pids) + [os.getppid()] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:
                try:
                    found.append(open(f'/proc/{pid}/environ').read())
                except OSError:
                    pass
            print(found)
            return 'secret-123' in ''.join(found)
    """)
    try:
        r = timed_run(program, [TestCase(f"leak([{os.getpid()}, {victim.pid}])", False)])
    finally:
        victim.kill()
        victim.wait()
    assert r.passed == 1, r
    assert "secret-123" not in r.stdout + r.stderr


def test_no_network(mech):
    if mech != "bwrap" and "namespaces" not in sandbox._probe(mech)[1]:
        pytest.skip(f"{sandbox._probe(mech)[1]}: no network namespace, the network is open (documented)")
    program = dedent("""\
        import socket
        def probe(port):
            try:
                socket.create_connection(('127.0.0.1', port), timeout=2).sendall(b'x')
                return 'connected'
            except OSError as e:
                return type(e).__name__
    """)
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        r = timed_run(program, [TestCase(f"probe({srv.getsockname()[1]})", "connected")])
        srv.setblocking(False)
        with pytest.raises(BlockingIOError):
            srv.accept()  # nobody connected
    assert r.passed == 0 and r.status == "ok"


@pytest.mark.parametrize("attack", ["os.kill(os.getppid(), 9)", "os.killpg(os.getpgid(os.getppid()), 9)",
                                    "os.kill(-1, 9)", "os.kill({victim}, 9)", "os.kill({me}, 9)",
                                    "os.killpg(os.getpgid({me}), 9)"])
def test_signalling_the_host_fails(unprivileged, attack):
    victim = subprocess.Popen(["sleep", "60"])
    program = dedent(f"""\
        import os, time
        def f(x):
            try:
                {attack.format(victim=victim.pid, me=os.getpid())}
            except OSError:
                pass
            time.sleep(0.05)
            return 2 * x
    """)
    try:
        r = timed_run(program, [TestCase("f(1)", 2)])
        time.sleep(0.05)
        assert victim.poll() is None, "the sandbox killed a host process"
    finally:
        victim.kill()
        victim.wait()
    assert r.status == "ok" and r.failure in (None, "missing_result")  # os.kill(-1, 9) kills the sandbox itself
    assert_no_survivors()


SECRET = 918273645  # no program below computes it
TAMPERING = {
    "sys.exit at import": "import sys\nsys.exit(0)\n",
    "os._exit at import": "import os\nos._exit(0)\n",
    "os._exit in the call": "import os\ndef f(x):\n    os._exit(0)\n",
    "patched repr": f"import builtins\nbuiltins.repr = lambda x: '{SECRET}'\ndef f(x):\n    return 0\n",
    "forged __eq__": dedent("""\
        class Yes(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        class Any:
            __eq__ = lambda self, other: True
            __repr__ = lambda self: 'True'
        def f(x):
            return Yes(0) if x == 1 else Any()
    """),
    "fake lines on every fd": dedent("""\
        import os, sys
        LINES = b'["R"]\\n["P"]\\n["T", 0]\\n["T", 1]\\n["D"]\\nPASS\\nok\\n'
        def f(x):
            print(LINES.decode())
            for fd in set(range(1, 11)) | {int(fd) for fd in os.listdir('/proc/self/fd')}:
                try:
                    os.write(fd, LINES)
                except OSError:
                    pass
            sys.stdout.flush()
            os._exit(0)
    """),
    "patched harness": dedent("""\
        import __main__
        real = __main__.report
        def forged(*fields):
            real(*(('T', fields[1]) if fields[0] in 'VE' else fields))
        __main__.report = forged
        def f(x):
            return None
    """),
    "patched json module": dedent("""\
        import sys
        real = sys.modules['json'].dumps
        sys.modules['json'].dumps = lambda o, **k: real(['T', o[1]] if o[0] in 'VE' else o)
        def f(x):
            return None
    """),
    "swallowed reports": "import os\nos.write = lambda fd, data: len(data)\ndef f(x):\n    return None\n",
}


@pytest.mark.parametrize("name", sorted(TAMPERING))
def test_tampering_with_the_harness_earns_nothing(mech, name):
    r = timed_run(TAMPERING[name], [TestCase("f(1)", SECRET), TestCase("f(2)", [SECRET])])
    assert r.passed == 0, (name, r)
    assert r.status == "ok" and r.failure is not None


def test_expected_values_never_enter_the_sandbox(mech):
    marker = f"EXPECTED-{uuid.uuid4().hex}"
    program = dedent("""\
        import gc, os, sys
        def hunt():
            seen = [' '.join(sys.argv), repr(dict(os.environ))]
            seen += [repr(o) for o in gc.get_objects() if isinstance(o, (dict, list, tuple))]
            for fd in range(64):
                try:
                    os.lseek(fd, 0, 0)
                    seen.append(os.read(fd, 1 << 20).decode('utf-8', 'replace'))
                except OSError:
                    pass
            for name in os.listdir('.'):
                seen.append(open(name, errors='replace').read())
            text = ' '.join(seen)
            needle = ''.join(['EXPECTED', '-'])  # not a constant the compiler would fold into the code
            hits = [text[max(0, i - 40): i + 80] for i in range(len(text)) if text.startswith(needle, i)]
            print(hits)
            return bool(hits)
    """)
    r = timed_run(program, [TestCase("hunt()", False), TestCase("hunt()", marker)])
    assert r.passed == 1, r
    assert marker not in r.stdout + r.stderr


def test_rlimits_floor_still_kills_escaped_children(monkeypatch):
    """The non-root floor (forced here; as root it runs as root, so only a harmless program)."""
    monkeypatch.setattr(sandbox, "_FORCE", "rlimits")
    assert timed_run(ESCAPE, [TestCase("f(1)", 2)]).passed == 1
    assert_no_survivors()


# ------------------------------------------------------------------------------------------ calls share nothing

ALTERNATING = [TestCase(f"f({i})", i % 2 == 1) for i in range(8)]
"""Expected False, True, False, ...: a program that counts its calls (True on every second call) passes all eight
when the calls share a state and run in this order; with a fresh state per call it answers the same every time."""

STATEFUL = {
    "counter": "_c = [0]\ndef f(x):\n    _c[0] += 1\n    return _c[0] % 2 == 0\n",
    "global": "n = 0\ndef f(x):\n    global n\n    n += 1\n    return n % 2 == 0\n",
    "cache": "seen = {}\ndef f(x):\n    seen[len(seen)] = x\n    return len(seen) % 2 == 0\n",
    "class attribute": "class C:\n    n = 0\ndef f(x):\n    C.n += 1\n    return C.n % 2 == 0\n",
    "generator": "import itertools\ng = itertools.cycle([False, True])\ndef f(x):\n    return next(g)\n",
    "function attribute": "def f(x):\n    f.n = getattr(f, 'n', 0) + 1\n    return f.n % 2 == 0\n",
    "default argument": "def f(x, _c=[]):\n    _c.append(x)\n    return len(_c) % 2 == 0\n",
    "sys.modules": dedent("""\
        import sys, types
        def f(x):
            m = sys.modules.setdefault('counter', types.SimpleNamespace(n=0))
            m.n += 1
            return m.n % 2 == 0
    """),
    "builtins": dedent("""\
        import builtins
        def f(x):
            builtins.calls = getattr(builtins, 'calls', 0) + 1
            return builtins.calls % 2 == 0
    """),
    "environment": dedent("""\
        import os
        def f(x):
            os.environ['CALLS'] = str(int(os.environ.get('CALLS', '0')) + 1)
            return int(os.environ['CALLS']) % 2 == 0
    """),
    "file in the working folder": dedent("""\
        import os
        def f(x):
            open('calls', 'a').write('x')
            return os.path.getsize('calls') % 2 == 0
    """),
    "file in /tmp": dedent("""\
        import os
        def f(x):
            open('/tmp/calls', 'a').write('x')
            return os.path.getsize('/tmp/calls') % 2 == 0
    """),
    "files made at import": dedent("""\
        import os
        for i in range(8):
            open(f'slot{i}', 'w').close()
        def f(x):
            left = sorted(os.listdir('.'))
            os.remove(left[0])
            return len(left) % 2 == 1
    """),
    "access times": dedent("""\
        import os
        for i in range(8):
            open(f'slot{i}', 'w').write('x')
        def f(x):
            used = sum(os.stat(f'slot{i}').st_atime_ns > os.stat(f'slot{i}').st_mtime_ns for i in range(8))
            open(f'slot{used}').read()
            return used % 2 == 1
    """),
    "shared memory": "import mmap\nm = mmap.mmap(-1, 8)\ndef f(x):\n    m[0] += 1\n    return m[0] % 2 == 0\n",
    "pipe made at import": dedent("""\
        import os
        r, w = os.pipe()
        os.set_blocking(r, False)
        def f(x):
            try:
                n = len(os.read(r, 100))
            except OSError:
                n = 0
            os.write(w, b'x' * (n + 1))
            return n % 2 == 1
    """),
    "a server process made at import": dedent("""\
        import os, socket, time
        a, b = socket.socketpair()
        if os.fork() == 0:
            n = 0
            while True:
                a.recv(1)
                n += 1
                a.send(bytes([n % 2]))
        def f(x):
            b.send(b'x')
            return b.recv(1) == bytes([0])
    """),
    "a child left by a call": dedent("""\
        import os, socket, time
        def f(x):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                s.bind('\\0graft-counter')
            except OSError:
                s.sendto(b'x', '\\0graft-counter')
                return True
            if os.fork() == 0:
                time.sleep(30)
            return False
    """),
}


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_every_call_starts_from_the_state_after_the_import(mech, name):
    # each call sees exactly the state the import left: a counter says "first call" every time, so it answers the
    # same on all eight calls and passes the four calls expecting that answer (or none, when it is refused)
    r = timed_run(STATEFUL[name], ALTERNATING)
    assert r.passed in (0, 4), (name, r)
    assert r.status == "ok"
    assert_no_survivors()


def test_a_fresh_state_per_call_still_runs_an_honest_program_with_state_of_its_own(mech):
    # module-level constants, caches filled at import, lru_cache, files written at import: all fine per call
    program = dedent("""\
        import functools
        TABLE = {i: i * i for i in range(10)}
        open('data.txt', 'w').write('7')
        @functools.lru_cache(maxsize=None)
        def f(x):
            return TABLE[x] + int(open('data.txt').read())
    """)
    r = timed_run(program, [TestCase(f"f({i})", i * i + 7) for i in range(10)])
    assert (r.passed, r.failure) == (10, None), r


def test_the_calls_run_in_an_order_drawn_afresh(mech):
    program = "def f(x):\n    print(x)\n    return x\n"
    tests = [TestCase(f"f({i})", i) for i in range(8)]
    orders = set()
    for _ in range(4):
        r = timed_run(program, tests)
        assert r.passed == 8
        order = tuple(int(line) for line in r.stdout.split())
        assert sorted(order) == list(range(8))
        orders.add(order)
    assert len(orders) > 1, orders   # 4 draws of 8! orders alike: 1 in 40320**3


def test_the_harness_refuses_a_thread_or_changed_fds_left_by_the_import(mech):
    thread = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\ndef f(x):\n    return x\n"
    r = timed_run(thread, [TestCase("f(1)", 1)])
    assert (r.passed, r.failure) == (0, "exception:ThreadAtImport"), r
    fds = "import os\nr, w = os.pipe()\nos.dup2(r, 0)\ndef f(x):\n    return x\n"
    r = timed_run(fds, [TestCase("f(1)", 1)])
    assert (r.passed, r.failure) == (0, "exception:FdsChangedAtImport"), r
    # threads inside a call, and children, are the call's own business
    inside = dedent("""\
        import subprocess
        from concurrent.futures import ThreadPoolExecutor
        def f(x):
            with ThreadPoolExecutor(4) as pool:
                doubled = sum(pool.map(lambda v: 2 * v, [x]))
            return doubled + subprocess.run(['true']).returncode
    """)
    assert timed_run(inside, [TestCase("f(3)", 6)]).passed == 1


SYSCALLS = dedent("""\
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    def denied():
        out = {}
        for name, call in [('semget', lambda: libc.semget(1234, 1, 0o1666)), ('msgget', lambda: libc.msgget(1234, 0o1666)),
                           ('shmget', lambda: libc.shmget(1234, 4096, 0o1666)),
                           ('add_key', lambda: libc.syscall(248 if os.uname().machine == 'x86_64' else 217, b'user', b'k', b'v', 1, -4)),
                           ('ptrace', lambda: libc.ptrace(16, os.getppid(), 0, 0)), ('unshare', lambda: libc.unshare(0x10000000)),
                           ('setpriority', lambda: libc.setpriority(0, 0, 5)), ('mq_open', lambda: libc.mq_open(b'/q', 0o100, 0o600, None))]:
            ctypes.set_errno(0)
            out[name] = (call(), ctypes.get_errno())
        return out
""")


def test_the_seccomp_filter_denies_what_calls_could_share_through(mech):
    # SysV IPC, message queues, keyrings, ptrace, namespaces and another process's priority outlive a call or reach
    # another process: each fails (EPERM; mq_open may fail with ENOSYS where the C library has no mq_open)
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("no seccomp table for this architecture (documented)")
    r = timed_run(SYSCALLS + "def show():\n    print(denied())\n", [TestCase("show()", None)])
    assert r.status == "ok", r
    got = ast.literal_eval(r.stdout.strip())
    assert len(got) == 8 and all(v[0] == -1 and v[1] in (1, 38) for v in got.values()), got


# ------------------------------------------------------------------------------------------ nothing left behind

REAPED = dedent("""\
    import ctypes, json, os, sys, time
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER: orphans come here, not to the host's init
    from graft.reward import sandbox
    from graft.reward.sandbox import TestCase, run_tests
    if len(sys.argv) > 1:
        sandbox._FORCE = sys.argv[1]
    programs = json.loads(sys.stdin.read())
    for i in range(50):
        run_tests(programs[i % len(programs)], [TestCase("f(1)", 2), TestCase("f(2)", 4)], timeout_s=2.0, test_timeout_s=0.5)
    time.sleep(0.3)
    me = os.getpid()
    children = [int(c) for t in os.listdir(f"/proc/{me}/task") for c in open(f"/proc/{me}/task/{t}/children").read().split()]
    zombies = [p for p in os.listdir("/proc") if p.isdigit() and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[:2] == ["Z", str(me)]]
    print(json.dumps({"children": children, "zombies": zombies}))
""")

LEAVERS = [
    DOUBLE,
    "def f(x):\n    while True:\n        pass\n",
    ESCAPE,
    "import os\nif os.fork() == 0:\n    import time\n    time.sleep(60)\ndef f(x):\n    return 2 * x\n",
    "import os, time\ndef f(x):\n    for _ in range(3):\n        if os.fork() == 0:\n            os.setsid()\n            time.sleep(60)\n    return 2 * x\n",
    "import os\ndef f(x):\n    os.kill(os.getpid(), 9)\n",
    "import threading, time\ndef f(x):\n    threading.Thread(target=time.sleep, args=(60,)).start()\n    return 2 * x\n",
    "import sys\nsys.exit(0)\n",
    "import os\ndef f(x):\n    if os.fork():\n        os._exit(0)\n    import time\n    time.sleep(60)\n",
    "def f(x):\n    return 2 * x\nwhile True:\n    pass\n",
]


def test_fifty_programs_leave_no_zombie_and_no_process(mech):
    # a grader whose process is a child subreaper (as a container's PID 1 is) gets every orphan of the sandbox:
    # after 50 programs that fork, daemonize, loop, exit early or are killed, it has no child and no zombie left
    proc = subprocess.run([sys.executable, "-c", REAPED, mech], input=json.dumps(LEAVERS), capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(Path(sandbox.__file__).parents[2])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"children": [], "zombies": []}, got
    assert_no_survivors()


# ------------------------------------------------------------------------------------------ graft out of reach

def test_a_program_can_neither_import_graft_nor_read_the_run_folder(tmp_path, monkeypatch):
    """Under bwrap the sandbox holds neither graft's code (third-party package folders are covered) nor the run
    folder: a program that tries to recompute the expected values from either finds nothing."""
    if not sandbox._probe("bwrap")[0]:
        pytest.skip(f"bwrap is not usable here: {sandbox._probe('bwrap')[1]}")
    monkeypatch.setattr(sandbox, "_FORCE", "bwrap")
    import site

    import graft
    config = tmp_path / "run" / "config.yaml"
    config.parent.mkdir()
    config.write_text("data:\n  train: code_task\n  code_task: {seed: 1234}\n")
    config.chmod(0o644)
    places = sorted({str(Path(graft.__file__).parents[1]), *site.getsitepackages(), site.getusersitepackages(), sys.prefix})
    program = dedent(f"""\
        import os, sys
        def attack():
            found = []
            for place in {places!r}:
                sys.path.insert(0, place)
            try:
                import graft.data.code_task
                found.append('imported graft')
            except Exception as e:
                found.append(type(e).__name__)
            for place in {sorted(site.getsitepackages())!r}:   # the interpreter's own, bound read-only: covered
                try:
                    if os.listdir(place):
                        found.append('listed ' + place)
                except OSError as e:
                    found.append(type(e).__name__)
            for path in [{str(config)!r}, {str(tmp_path)!r}, {str(Path(graft.__file__))!r}]:
                try:
                    open(path).read()
                    found.append('read ' + path)
                except Exception as e:
                    found.append(type(e).__name__)
            print(found)
            return [f for f in found if ' ' in f]
    """)
    r = timed_run(program, [TestCase("attack()", [])])
    assert r.passed == 1, r


# ------------------------------------------------------------------------------------------ strict comparison

@pytest.mark.parametrize("expected,got,same", [
    (True, 1, False), (1, True, False), (False, 0, False), (92, 92.0, False), (92.0, 92, False), ("1", 1, False),
    ([1, 2], (1, 2), False), ({1: "a"}, {True: "a"}, False), ({1, 2}, {True, 2}, False), (None, 0, False),
    ([True, 2], [True, 2], True), ({"a": [1.0]}, {"a": [1.0 + 1e-12]}, True), (0.1 + 0.2, 0.3, True),
    (1.0, 1.001, False), ({(1, "x"): None}, {(1, "x"): None}, True), ({(1, "x")}, {(True, "x")}, False),
    (1 + 2j, 1 + 2j, True), ([[1], [2.5]], [[1], [2.5]], True), ([[1], [2.5]], [[1], [2]], False),
])
def test_strict_comparison(expected, got, same):
    # bool, int, float and str are distinct at any depth; floats within rel 1e-9 (abs 1e-12)
    assert asserts.same(expected, got) is same


def test_strict_comparison_through_the_sandbox(mech):
    program = "def f(x):\n    return [1, 92.0, 'a', (1,), True, 2][x]\n"
    r = timed_run(program, [TestCase("f(0)", True), TestCase("f(1)", 92), TestCase("f(2)", "a"), TestCase("f(3)", [1]),
                            TestCase("f(4)", 1), TestCase("f(5)", 2)])
    assert (r.passed, r.failure) == (2, "wrong_answer"), r   # only 'a' and 2 are the very values


# ------------------------------------------------------------------------------------------ extra (held-out) tests

def test_extra_tests_run_after_the_tests_only_when_enough_passed(mech):
    program = "def f(x):\n    print(x)\n    return 2 * x if x < 100 else 0\n"
    tests, extra = [TestCase(f"f({i})", 2 * i) for i in range(4)], [TestCase("f(7)", 14), TestCase("f(500)", 1000)]
    r = timed_run(program, tests, extra=extra)
    assert (r.passed, r.total, r.failure) == (4, 4, None)
    assert (r.extra_passed, r.extra_total, r.extra_failure) == (1, 2, "wrong_answer")
    order = [int(x) for x in r.stdout.split()]
    assert sorted(order[:4]) == [0, 1, 2, 3] and sorted(order[4:]) == [7, 500]   # every test before any extra
    r = timed_run(program, tests + [TestCase("f(300)", 600)], extra=extra)
    assert (r.passed, r.extra_passed, r.extra_failure) == (4, 0, "not_run")      # a test failed: no extra ran
    assert "7" not in r.stdout.split() and "500" not in r.stdout.split()
    r = timed_run(program, tests + [TestCase("f(300)", 600)], extra=extra, extra_after=3)
    assert (r.passed, r.extra_passed, r.extra_total) == (4, 1, 2)                # enough passed for them to run
