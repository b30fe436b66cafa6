"""Code grading stopped the way Slurm's scancel and systemd stop a job: SIGTERM to every process of its cgroup --
the trainer, graft's grader workers, bwrap, the sandbox's harness and the programs' own processes -- emulated by
walking /proc for the grading process's whole tree. graft's rule: an item a stop interrupts is never scored. So the
rewards and statuses equal an uninterrupted grading's, with the grader's workers and in-process (``workers=0``,
where the grading process handles the signal instead of ignoring it), for programs that leave the stop signals
alone (every sandbox process ignores them) and for programs that restore SIGTERM's default (the stop kills one of
them mid-run: the sandbox reports it and the grader grades it again). About 3 s per grading on 2 cores."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graft.reward import sandbox
from tests.patience import patient
from tests.reward.cgroup_stop import EXPECTED, REFERENCES

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sandbox._probe("bwrap")[0], reason="the code domain needs bwrap")


def tree(root: int) -> list[int]:
    """``root`` and every process descended from it (a snapshot of /proc: what a cgroup-wide kill reaches)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


HARNESS = b"\0-I\0-S\0-B\0"
"""In the command line of the sandbox's harness (``python -I -S -B ... -c SOURCE``)."""


def _wait_for_a_program(root: int) -> None:
    """Until a sandbox runs a program in ``root``'s tree (the first of the timed items)."""
    deadline = time.monotonic() + patient(30)
    while not any(HARNESS in _cmdline(pid) for pid in tree(root)):
        assert time.monotonic() < deadline, "no sandbox started"
        time.sleep(0.005)


def grade(workers: int, log: Path, stop: bool) -> tuple[dict, list[bytes]]:
    """Run the grading process (tests/reward/cgroup_stop.py) in a session of its own; with ``stop``, SIGTERM to every
    process of its tree 0.1 s after the first timed program started (it runs for 0.4 s). Its result and the
    signalled commands."""
    env = {**os.environ, "GRAFT_TEST_STOP_LOG": str(log), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.reward.cgroup_stop", str(workers)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    signalled: list[bytes] = []
    try:
        assert proc.stdout.readline().strip() == "grading", proc.stderr.read()
        if stop:
            _wait_for_a_program(proc.pid)
            time.sleep(0.1)
            for pid in tree(proc.pid):
                signalled.append(_cmdline(pid))
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
        out, err = proc.communicate(timeout=patient(120))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), signalled


@pytest.mark.parametrize("workers", [1, 0])
def test_a_cgroup_wide_sigterm_scores_nothing_it_interrupted(tmp_path, workers):
    log = tmp_path / "interrupted.log"
    result, signalled = grade(workers, log, stop=True)
    assert result["stop"] == "SIGTERM"                          # the grading process got it too (a step would stop)
    assert any(b"bwrap" in c for c in signalled), signalled     # and the sandbox's processes, mid-program
    assert any(HARNESS in c for c in signalled), signalled
    assert (result["rewards"], result["statuses"]) == EXPECTED   # what an uninterrupted grading gives
    # the program running then restores SIGTERM's default: the stop killed it, and it was graded again
    assert log.read_text().splitlines() == [REFERENCES[0]]


def test_uninterrupted_grading_gives_the_expected_outcome(tmp_path):
    result, _ = grade(1, tmp_path / "interrupted.log", stop=False)
    assert (result["rewards"], result["statuses"], result["stop"]) == (*EXPECTED, None)
    assert not (tmp_path / "interrupted.log").exists()
