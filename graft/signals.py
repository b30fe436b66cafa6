"""The stop protocol of every process graft runs: who acts on SIGTERM, SIGINT and SIGHUP, and who ignores them.

A cluster stops a job by signalling all of it: Slurm and systemd send SIGTERM to the job's process group (or to
every process of its cgroup), a closed terminal sends SIGHUP, Ctrl-C sends SIGINT to the foreground group. graft
answers the three alike, whichever of its processes receives them:

- the process that runs the work (``graft train``, ``graft experiment run``) handles them with
  :class:`StopSignal`: the first asks for a stop at the next safe point (the trainer's: after the step in progress,
  checkpointed, exit 75), a second ends the process at once;
- every worker process graft starts (the grader's and the reward functions' workers, Ray actors) ignores them
  from birth -- :func:`start_worker` starts it with them blocked, its entry point calls :func:`as_worker`
  (a Ray actor :func:`ignore_stop_signals`) -- and is stopped by its parent, explicitly, once the work it holds is
  answered: a signal can never end a work item half-way for its result to be scored. Their own children (a reward
  function's subprocesses) inherit the ignoring. The code sandbox runs each program in a session of its own, and
  its processes ignore them too (whichever process grades); a stop that reaches a program anyway (it restored the
  default action; a cluster signals every process of the job's cgroup) makes the grader grade it again
  (:mod:`graft.reward.sandbox`). The forkserver graft starts is born with them blocked and stays so (a group signal
  cannot end it); every other process it forks -- a user's own ``forkserver`` ``Pool`` shares it -- gets them
  unblocked as it starts (:func:`forkserver_preload`), so that ``terminate()`` ends it as it would without graft;
- a command graft runs for a plan (``graft experiment run``'s ``graft train``) runs in a session of its own and
  gets each signal its parent gets, once, and SIGTERM if its parent dies (:func:`run_command`).

nohup's convention holds: a SIGHUP that was ignored when the process started stays ignored.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import threading
import weakref
from collections.abc import Iterator
from multiprocessing import resource_tracker
from multiprocessing.process import BaseProcess
from subprocess import Popen

from graft.console import quiet

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""The signals that ask graft to stop."""

_ACTIVE: list["StopSignal"] = []
_WORKERS: "weakref.WeakSet[BaseProcess]" = weakref.WeakSet()
_EXIT_HOOK: list[bool] = []
_PR_SET_PDEATHSIG = 1


def stopping() -> str | None:
    """The signal (``SIGTERM``, ...) that asked this process to stop, while a :class:`StopSignal` is entered; else None.
    A worker that dies while this is set died of the stop, not of its item: the item is handed out again."""
    return next((s.requested for s in _ACTIVE if s.requested), None)


class StopSignal:
    """While entered: the first stop signal sets :attr:`requested` (its name), a second ends the process at once
    (the signal's default action, as without graft). Outside the main thread it installs nothing (signals are
    only delivered there)."""

    def __init__(self, what: str = "the step in progress") -> None:
        self.what = what
        self.requested: str | None = None
        self._previous: dict = {}
        self._children: list[Popen] = []

    def _handle(self, signum: int, frame) -> None:
        for child in self._children:
            with contextlib.suppress(OSError):
                os.kill(child.pid, signum)
        if self.requested is not None:
            for s in self._previous:
                signal.signal(s, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.requested = signal.Signals(signum).name
        with contextlib.suppress(OSError):  # a hung-up terminal; printed, not logged: a handler must not wait for logging's locks
            if not quiet():
                print(
                    f"{self.requested}: finishing {self.what}, then stopping (send it again to stop at once)",
                    file=sys.stderr,
                    flush=True,
                )
        if signum == signal.SIGHUP:
            _leave_terminal()

    def __enter__(self) -> "StopSignal":
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                if s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN:
                    continue  # started under nohup
                self._previous[s] = signal.signal(s, self._handle)
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    @contextlib.contextmanager
    def forwarding(self, child: Popen) -> Iterator[None]:
        """While inside, every stop signal this process gets also goes to ``child`` (a command :func:`run_command`
        started in a session of its own, so it gets each signal exactly once)."""
        self._children.append(child)
        try:
            if self.requested:  # asked before the child existed: it stops at its first safe point
                with contextlib.suppress(OSError):
                    os.kill(child.pid, signal.Signals[self.requested])
            yield
        finally:
            self._children.remove(child)


def _leave_terminal() -> None:
    """After SIGHUP the terminal is gone and writing to it fails (EIO): send stdout and stderr to /dev/null."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            if os.isatty(fd):
                os.dup2(null, fd)
    os.close(null)


@contextlib.contextmanager
def blocked() -> Iterator[None]:
    """The stop signals blocked in this thread while inside; one that arrives meanwhile is delivered on leaving.
    A process started inside inherits the block (through fork and exec), so it cannot die of a stop signal before
    its entry point ignores them."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_stop_signals() -> None:
    """Ignore the stop signals (the parent stops this process), then unblock them: what a Ray actor does first."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def as_worker() -> None:
    """The first thing a worker process started by :func:`start_worker` does: :func:`ignore_stop_signals`, and end
    when graft's process does (a thread waits on multiprocessing's parent sentinel), so a worker busy with an item
    -- a hanging verification, deaf to the stop signals -- never outlives a run killed outright."""
    ignore_stop_signals()
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_end_with, args=(parent,), daemon=True, name="graft-parent").start()


def _end_with(parent: BaseProcess) -> None:
    parent.join()  # returns once the parent is gone
    os._exit(0)


def start_worker(proc: BaseProcess) -> None:
    """Start a worker process (whose target calls :func:`as_worker` first) under the protocol: born with
    the stop signals blocked, and killed when this process exits if its owner has not stopped it (multiprocessing's
    own exit handler would send it SIGTERM, which it ignores, and wait for it for ever)."""
    setattr(proc, _WORKER_MARK, True)  # pickled with it: a forkserver child keeps the block (forkserver_preload)
    with blocked():  # multiprocessing's resource tracker, started first (starting it unblocks SIGINT and SIGTERM here)
        resource_tracker.ensure_running()
    with blocked(), _script_hidden():  # and the forkserver, when this call starts them, are born with the signals blocked too
        proc.start()
    _WORKERS.add(proc)
    if not _EXIT_HOOK:
        atexit.register(_kill_workers)  # registered after multiprocessing's: runs before it
        _EXIT_HOOK.append(True)


@contextlib.contextmanager
def _script_hidden() -> Iterator[None]:
    """While a worker starts, the main module shows multiprocessing no file and no module name, so neither the
    forkserver nor a spawned worker runs the user's script again (a script or notebook that calls ``graft.train``
    without an ``if __name__ == "__main__":`` guard would otherwise start training in every worker). graft's workers
    need nothing of ``__main__``: their targets are graft's functions, a user's callable goes by value."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    for k in saved:
        setattr(main, k, None) if k == "__spec__" else delattr(main, k)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


_WORKER_MARK = "_graft_stop_protocol"
"""Set on a process :func:`start_worker` starts (it travels with the pickled process object to the child)."""


def forkserver_preload() -> None:
    """Called in the forkserver process (graft's forkserver preload imports :mod:`graft.reward.preload`, which calls
    it): every process it forks from now on, but graft's workers, gets the stop signals unblocked as it starts
    (multiprocessing's after-fork hook, run before its target). The forkserver graft starts is born with them blocked
    (:func:`start_worker`) and its children inherit the mask: without this, a user's ``forkserver`` ``Pool`` worker
    could not be ended by ``terminate()`` (SIGTERM stays pending) and ``Pool.terminate`` would wait for it for ever."""
    multiprocessing.util.register_after_fork(_unblock_if_not_a_worker, _unblock_if_not_a_worker)


def _unblock_if_not_a_worker(_obj: object) -> None:
    if not getattr(multiprocessing.current_process(), _WORKER_MARK, False) and hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _kill_workers() -> None:
    for proc in list(_WORKERS):
        with contextlib.suppress(Exception):
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2.0)


def run_command(cmd: list[str]) -> int:
    """Run a command of graft's for a plan (``graft experiment run``'s ``graft train``/``graft eval``) and return its
    exit status. It runs in a session of its own and gets each stop signal this process gets, once, from every
    entered :class:`StopSignal` (a group signal would otherwise reach it twice, and a second signal stops at once);
    on Linux it also gets SIGTERM when this process dies, so it stops at its next safe point instead of running on
    as an orphan."""
    linux = sys.platform.startswith("linux")
    proc = Popen(cmd, start_new_session=True, preexec_fn=functools.partial(_die_with_parent, os.getpid()) if linux else None)
    with contextlib.ExitStack() as forwarding:
        for stop in list(_ACTIVE):
            forwarding.enter_context(stop.forwarding(proc))
        return proc.wait()


def _die_with_parent(parent: int) -> None:
    """In the child, before it runs the command: SIGTERM when ``parent`` dies (also if it died already)."""
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)
