"""graft's stop protocol (graft/signals.py): the process doing the work handles SIGTERM, SIGINT and SIGHUP alike,
worker processes ignore them from birth and are stopped by their parent, a command run for a plan gets each signal
once and stops when its parent dies. Small processes only (no model): a few seconds in all."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from graft.reward.grader import mp_context
from graft.signals import STOP_SIGNALS, StopSignal, as_worker, ignore_stop_signals, start_worker, stopping

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_each_stop_signal_asks_for_a_stop_and_the_handlers_go_back(sig, capsys):
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    assert stopping() is None
    with StopSignal() as stop:
        os.kill(os.getpid(), sig)
        assert stop.requested == signal.Signals(sig).name and stopping() == stop.requested
    assert stopping() is None
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before
    assert f"{signal.Signals(sig).name}: finishing the step in progress, then stopping" in capsys.readouterr().err


def test_a_sighup_ignored_at_start_stays_ignored():
    """nohup's convention: the run goes on when the terminal closes."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with StopSignal() as stop:
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            assert stop.requested is None
    finally:
        signal.signal(signal.SIGHUP, previous)


def _ignoring_child(conn) -> None:
    ignore_stop_signals()
    conn.send([signal.getsignal(s) == signal.SIG_IGN for s in STOP_SIGNALS])
    conn.recv()   # until the parent says stop


def test_a_worker_ignores_the_stop_signals_and_its_parent_stops_it():
    ctx = mp_context(None)
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_ignoring_child, args=(child,), daemon=True)
    start_worker(proc)
    assert parent.recv() == [True, True, True]
    for s in STOP_SIGNALS:   # as a group signal reaches it
        os.kill(proc.pid, s)
    time.sleep(0.3)
    assert proc.is_alive()
    parent.send(None)
    proc.join(5)
    assert proc.exitcode == 0


def _blocked_at_birth(conn) -> None:
    conn.send(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def test_a_worker_is_born_with_the_stop_signals_blocked():
    """Before its entry point ignores them, a signal could kill it mid start-up (what a stop during a worker's
    restart did): it starts with them blocked, the forkserver too (the resource tracker is started first, since
    starting it unblocks SIGINT and SIGTERM)."""
    ctx = mp_context(None)
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_blocked_at_birth, args=(child,), daemon=True)
    start_worker(proc)
    assert set(STOP_SIGNALS) <= parent.recv()
    proc.join(5)
    assert set(STOP_SIGNALS).isdisjoint(signal.pthread_sigmask(signal.SIG_BLOCK, []))   # this thread: unblocked again


HELPERS = """
import sys
sys.path.insert(0, {repo!r})
from multiprocessing import forkserver, resource_tracker
from graft.reward.grader import mp_context
from graft.signals import start_worker
from tests.test_signals import _blocked_at_birth
if __name__ == "__main__":
    ctx = mp_context(None)
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_blocked_at_birth, args=(child,), daemon=True)
    start_worker(p)
    parent.recv()
    for pid in (resource_tracker._resource_tracker._pid, forkserver._forkserver._forkserver_pid):
        fields = dict(line.split(":", 1) for line in open(f"/proc/{{pid}}/status").read().splitlines() if ":" in line)
        print(int(fields["SigBlk"], 16) | int(fields["SigIgn"], 16))
"""


def test_multiprocessing_helpers_started_for_a_worker_survive_a_group_signal(tmp_path):
    """The resource tracker and the forkserver that the first worker start brings up are children of graft's
    process, in its group: started with the stop signals blocked (or ignoring them), a group signal ends neither
    (in a fresh process: in this one they may have been started before)."""
    script = tmp_path / "helpers.py"
    script.write_text(HELPERS.format(repo=str(REPO)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    for mask in map(int, out.stdout.split()):
        assert all(mask >> (s - 1) & 1 for s in STOP_SIGNALS), bin(mask)


OTHERS = """
import multiprocessing, os, sys, threading, time
sys.path.insert(0, {repo!r})
from graft.reward.grader import mp_context
from graft.signals import start_worker
from tests.test_signals import _blocked_at_birth
if __name__ == "__main__":
    ctx = mp_context(None)
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_blocked_at_birth, args=(child,), daemon=True)
    start_worker(p)                     # graft's worker brings the forkserver up, with the stop signals blocked
    print(sorted(parent.recv()))
    p.join()
    other = ctx.Process(target=_blocked_at_birth, args=(child,), daemon=True)
    other.start()                       # forked by the same forkserver for someone else
    print(sorted(other.join() or parent.recv()))
    pool = multiprocessing.get_context("forkserver").Pool(1)
    pool.apply_async(time.sleep, (1.0,))
    time.sleep(0.3)                     # its worker is busy: terminate() has to end it with SIGTERM
    stopper = threading.Thread(target=pool.terminate, daemon=True)
    stopper.start()
    stopper.join(20)
    print("hangs" if stopper.is_alive() else "ends", flush=True)
    os._exit(0)                         # not multiprocessing's exit handler: it would wait for a worker that hangs
"""


def test_processes_the_forkserver_starts_for_others_can_be_terminated(tmp_path):
    """The forkserver graft starts keeps the stop signals blocked and every process it forks inherits that mask. graft's
    workers keep it until they ignore the signals; any other process (a user's forkserver Pool, in the same process
    as graft) gets them unblocked as it starts, so Pool.terminate() ends a busy worker instead of waiting for it for
    ever (its SIGTERM stayed pending: a hang seen in tests/reward/test_sandbox.py under load)."""
    script = tmp_path / "others.py"
    script.write_text(OTHERS.format(repo=str(REPO)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    worker, other, pool = out.stdout.splitlines()
    assert worker == str(sorted(STOP_SIGNALS)) and other == "[]"
    assert pool == "ends"


CHILD = """
import os, signal, sys, time
got = []
def handle(signum, frame):
    got.append(signal.Signals(signum).name)
    with open({log!r}, "a") as f:
        f.write(got[-1] + "\\n")
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, handle)
open({ready!r}, "w").close()
while not got:
    time.sleep(0.02)
time.sleep(0.5)   # a second signal would arrive meanwhile
sys.exit(75)
"""

PARENT = """
import sys
sys.path.insert(0, {repo!r})
from graft.signals import StopSignal, run_command
with StopSignal("the current run") as stop:
    rc = run_command([sys.executable, {child!r}])
print(rc, stop.requested)
"""


def _parent(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "signals.log"
    (tmp_path / "child.py").write_text(CHILD.format(log=str(log), ready=str(tmp_path / "ready")))
    (tmp_path / "parent.py").write_text(PARENT.format(repo=str(REPO), child=str(tmp_path / "child.py")))
    proc = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    t0 = time.time()
    while not (tmp_path / "ready").exists():
        assert proc.poll() is None and time.time() - t0 < 30, proc.stderr.read()
        time.sleep(0.02)
    return proc, log


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_command_run_for_a_plan_gets_a_group_signal_once(tmp_path, sig):
    """`graft experiment run`'s `graft train` runs in a session of its own: a signal to the plan's process group
    reaches it once, forwarded (twice would stop it at once, without a checkpoint)."""
    proc, log = _parent(tmp_path)
    os.killpg(proc.pid, sig)
    out, err = proc.communicate(timeout=30)
    assert out.split() == ["75", signal.Signals(sig).name], err
    assert log.read_text().split() == [signal.Signals(sig).name]


def test_a_command_run_for_a_plan_stops_when_its_parent_is_killed(tmp_path):
    """Killing `graft experiment run` (SIGKILL: no handler runs) no longer leaves its `graft train` running as an
    orphan: the child gets SIGTERM and stops at its next safe point."""
    proc, log = _parent(tmp_path)
    proc.kill()
    proc.wait(10)
    t0 = time.time()
    while not log.exists() and time.time() - t0 < 10:
        time.sleep(0.05)
    assert log.read_text().split() == ["SIGTERM"]


def test_workers_left_running_are_killed_at_exit(tmp_path):
    """A worker ignores SIGTERM, so multiprocessing's own exit handler (SIGTERM, then an unbounded join) would wait
    for ever for one its owner never stopped: graft kills its workers at exit first."""
    script = tmp_path / "leak.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from graft.reward.grader import mp_context
        from graft.signals import start_worker
        from tests.test_signals import _ignoring_child
        if __name__ == "__main__":
            ctx = mp_context(None)
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_ignoring_child, args=(child,), daemon=True)
            start_worker(p)
            parent.recv()
            print(p.pid, flush=True)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[0])
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _busy_worker(conn) -> None:
    as_worker()
    conn.send("busy")
    while True:   # an item that never ends (a hanging verification), deaf to the stop signals
        time.sleep(3600)


ORPHAN = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from graft.reward.grader import mp_context
from graft.signals import start_worker
from tests.test_signals import _busy_worker
if __name__ == "__main__":
    ctx = mp_context(None)
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_busy_worker, args=(child,), daemon=True)
    start_worker(p)
    parent.recv()
    print(p.pid, flush=True)
    os.killpg(os.getpgrp(), signal.SIGTERM)   # the group: the worker ignores it, this process dies without a word
"""


def test_a_busy_worker_does_not_outlive_graft_killed_outright(tmp_path):
    """A worker ignores the stop signals, so a group SIGTERM no longer ends one stuck in an item; when graft's process
    is killed outright (no handler, no exit hook) the forkserver it leaves ends, and the worker with it."""
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN.format(repo=str(REPO)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=REPO,
                          start_new_session=True)
    assert proc.returncode == -signal.SIGTERM, proc.stderr   # no handler ran, no exit hook
    pid = int(proc.stdout.split()[0])
    t0 = time.time()
    while time.time() - t0 < 10:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"worker {pid} outlived its parent")
