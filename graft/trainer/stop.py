"""How a run ends early on purpose: a preemption signal, or an update that keeps diverging.

The first SIGTERM or SIGINT only sets :attr:`StopSignal.requested`; the loop finishes the step in
progress, checkpoints, flushes and raises :class:`Preempted` (exit :data:`PREEMPTED_EXIT`). A second
signal takes the signal's default action at once (the process dies, as it would without graft's
handler; nothing is lost beyond the last checkpoint).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from graft.console import quiet

PREEMPTED_EXIT = 75
"""Exit status of a run stopped by SIGTERM/SIGINT after checkpointing (EX_TEMPFAIL: run it again with resume=true)."""
DIVERGED_EXIT = 3
"""Exit status of a run stopped after ``update.max_nonfinite_steps`` consecutive non-finite updates."""

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
    """The run stopped on a signal, after its last finished step was checkpointed."""


class Diverged(RuntimeError):
    """The loss or gradient norm stayed non-finite, or weights turned non-finite: the run stops, its last
    finite checkpoint kept."""


class StopSignal:
    """While entered: the first SIGTERM/SIGINT sets :attr:`requested` (its name), a second kills at once.
    Outside the main thread it installs nothing (signals are only delivered there)."""

    def __init__(self, what: str = "the step in progress") -> None:
        self.what = what
        self.requested: str | None = None
        self._previous: dict = {}

    def _handle(self, signum: int, frame) -> None:
        if self.requested is not None:
            for s in SIGNALS:
                signal.signal(s, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.requested = signal.Signals(signum).name
        if not quiet():  # printed, not logged: a signal handler must not wait for logging's locks
            print(
                f"{self.requested}: finishing {self.what}, then stopping (send it again to stop at once)",
                file=sys.stderr,
                flush=True,
            )

    def __enter__(self) -> "StopSignal":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def reclaim(self) -> None:
        """Install the handler again where something replaced it while entered: ``ray.init`` (``backend: ray``)
        sets a SIGTERM handler that exits at once, which would lose the step in progress."""
        for s in self._previous:
            if signal.getsignal(s) != self._handle:
                signal.signal(s, self._handle)

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}
