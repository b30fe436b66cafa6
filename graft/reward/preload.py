"""Imported by the grader's forkserver: loads and warms math_verify once (and the reward-function worker's
module), so every worker forked from it starts ready in milliseconds instead of ~1 s (import + grammar compile).
No torch: nothing here imports it. It also lets the processes the forkserver forks for others (a user's own
``forkserver`` ``Pool``) start with the stop signals unblocked (:func:`graft.signals.forkserver_preload`)."""

from graft import signals
from graft.reward import functions, verifier, worker

PRELOADED = (functions, verifier, worker)
"""What every forked worker finds already imported."""

verifier.warm_up()
signals.forkserver_preload()
