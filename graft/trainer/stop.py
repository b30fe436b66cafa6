"""How a run ends early on purpose: a stop signal, or an update that keeps diverging.

The stop signals (SIGTERM, SIGINT, SIGHUP; :mod:`graft.signals`) are handled by :class:`graft.signals.StopSignal`:
the first one lets the loop finish the step in progress, checkpoint, flush and raise :class:`Preempted` (exit
:data:`PREEMPTED_EXIT`); a second takes the signal's default action at once (nothing is lost beyond the last
checkpoint). graft's worker processes ignore them, so a signal to the whole process group stops the run exactly as
one to the trainer alone.
"""

from __future__ import annotations

PREEMPTED_EXIT = 75
"""Exit status of a run stopped by a stop signal after checkpointing (EX_TEMPFAIL: run it again with resume=true)."""
DIVERGED_EXIT = 3
"""Exit status of a run stopped after ``update.max_nonfinite_steps`` consecutive non-finite updates."""


class Preempted(Exception):
    """The run stopped on a signal, after its last finished step was checkpointed."""


class Diverged(RuntimeError):
    """The loss or gradient norm stayed non-finite, or weights turned non-finite: the run stops, its last
    finite checkpoint kept."""


class StopTraining(Exception):
    """Raised by a callback of :func:`graft.train` (or a callback returns ``True``) to end the run after the step it
    was called for: the step is checkpointed and the run ends cleanly, resumable with ``resume: true``."""
