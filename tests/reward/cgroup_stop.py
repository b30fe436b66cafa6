"""A grading process stopped the way Slurm's scancel or systemd stops a job: SIGTERM to EVERY process of its
cgroup, not one process group (tests/reward/test_cgroup_stop.py). Run as ``python -m tests.reward.cgroup_stop
WORKERS LOG``: the trainer's side. Under a :class:`graft.signals.StopSignal` (as ``graft train`` runs a step) it
grades :data:`RESPONSES` with the code domain's grader (``WORKERS`` worker processes; 0: in this process), after one
item that warms the workers and the sandbox up; it prints ``grading`` when the timed items begin, then one JSON
line: the rewards, the statuses and the stop it was asked for. :func:`verify` (the grader's verify function) logs to
``LOG`` every answer ``interrupted``, so the test sees the stop reach a program and the item graded again.

Half the programs restore SIGTERM's default action at import (a program may: graft cannot forbid it), so a stop
that reaches one of their processes kills it; the others leave the signals alone (ignored: they are born so).
Each sleeps 0.2 s at import and 0.1 s per call, so that the stop lands while one runs."""
from __future__ import annotations

import json
import os
import sys

from graft.reward.code import code_reference, verify_code
from graft.reward.verifier import INTERRUPTED

DEFAULT = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
BODY = "import time\ntime.sleep(0.2)\ndef f(x):\n    time.sleep(0.1)\n    return {}\n"
PASSES, FAILS = BODY.format("x"), BODY.format("x + 1")
PROGRAMS = [DEFAULT + PASSES, DEFAULT + FAILS, PASSES, DEFAULT + PASSES, FAILS, DEFAULT + PASSES]
RESPONSES = [f"```python\n{p}```" for p in PROGRAMS]
EXPECTED = ([1.0, 0.0, 1.0, 1.0, 0.0, 1.0], ["ok", "wrong_answer", "ok", "ok", "wrong_answer", "ok"])
"""What the programs earn when nothing stops them (two tests each: f(i) == i and f(i + 1) == i + 1)."""
REFERENCES = [code_reference({"tests": [f"assert f({i}) == {i}", f"assert f({i + 1}) == {i + 1}"], "entry_point": "f"})
              for i in range(len(RESPONSES))]


def verify(response: str, reference: str, **settings) -> tuple[float, str]:
    """The code reward, logging every ``interrupted`` answer to the file named by ``GRAFT_TEST_STOP_LOG``."""
    reward, status = verify_code(response, reference, **settings)
    if status == INTERRUPTED:
        with open(os.environ["GRAFT_TEST_STOP_LOG"], "a") as f:
            f.write(f"{reference}\n")
    return reward, status


def main(workers: int) -> None:
    from graft.reward.grader import Grader
    from graft.signals import StopSignal

    with Grader(8.0, workers, verify_fn="tests.reward.cgroup_stop:verify", verify_kwargs={"timeout_s": 6.0, "success_threshold": 0.5}) as grader:
        with StopSignal() as stop:
            grader.grade(RESPONSES[2:3], REFERENCES[2:3])   # workers started and the sandbox's self-test run
            print("grading", flush=True)
            rewards, statuses = grader.grade(RESPONSES, REFERENCES)
            print(json.dumps({"rewards": rewards, "statuses": statuses, "stop": stop.requested}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
