"""Time limits for tests that start processes, actors or process groups, scaled to how busy the machine is.

A limit in these tests bounds work that should finish (a model loading in a Ray actor, a subprocess run), not
a behaviour under test, so on a loaded machine it stretches instead of failing a correct change: ``patient(s)``
is ``s`` times the machine's load per core when that is above 1 (measured when called) and times
``GRAFT_TEST_PATIENCE`` (default 1; raise it for very slow machines). Tests of a timeout itself (a hanging
reward function, a grader that must give up after 1 s) keep their fixed limits.
"""
from __future__ import annotations

import os


def load_factor() -> float:
    """The 1-minute load average per CPU core, at least 1."""
    try:
        return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except OSError:   # no load average on this platform
        return 1.0


def patient(seconds: float) -> float:
    """``seconds`` stretched by :func:`load_factor` and ``GRAFT_TEST_PATIENCE``."""
    return seconds * load_factor() * float(os.environ.get("GRAFT_TEST_PATIENCE", "1"))
