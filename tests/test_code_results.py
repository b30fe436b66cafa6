"""The code domain's results scripts (results/code/): they answer --help and run, draw_rewarded.py's check names a wrong
rewarded program, and the committed re-grading of the code GRAFT run's samples (results/code/graft16/regraded.txt,
quoted in results/code/README.md) is what ``regrade_samples.py`` prints today: it fails when the task's tests or the
reward change (the figures move)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from graft.reward import sandbox
from tests.patience import patient

REPO = Path(__file__).resolve().parents[1]
CODE = REPO / "results" / "code"


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=REPO, timeout=patient(300))


@pytest.mark.parametrize("script", ["kill_rates.py", "regrade_samples.py", "draw_rewarded.py"])
def test_help(script):
    p = _run(str(CODE / script), "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: {script}")


def test_kill_rates_runs_and_writes_its_table(tmp_path):
    out = tmp_path / "k.md"
    p = _run(str(CODE / "kill_rates.py"), "--rows", "1", "--seeds", "0", "--tests", "12", "--out", str(out))
    assert p.returncode == 0, p.stderr
    table = out.read_text()
    assert "| add |" in table and "| keep_multiples |" in table and "| **all** | | 0.00% | |" in table


def test_the_committed_regrading_is_current():
    """regraded.txt is the script's output today, and every sample of both files was parsed (20 + 29 = 49)."""
    if not sandbox._probe("bwrap")[0]:
        pytest.skip(f"the code reward needs bwrap: {sandbox._probe('bwrap')[1]}")
    run = CODE / "graft16"
    p = _run(str(CODE / "regrade_samples.py"), str(run / "samples_rewarded.txt"), str(run / "samples_peer.txt"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.replace(str(REPO) + "/", "") == (run / "regraded.txt").read_text()
    heads = sum(line.startswith("-- step ") for f in ("samples_rewarded.txt", "samples_peer.txt")
                for line in (run / f).read_text().splitlines())
    graded = sum(" recorded " in line for line in p.stdout.splitlines())
    assert heads == graded == 49


def test_draw_rewarded_reads_and_checks_rewarded_programs(tmp_path):
    """--check runs every rewarded program on fresh inputs: a wrong one that the row's tests let through (the GRAFT
    run's is_multiple_of_9, True for 1..8) is named, a right one is not; unrewarded lines are left out."""
    if not sandbox._probe("bwrap")[0]:
        pytest.skip(f"the code reward needs bwrap: {sandbox._probe('bwrap')[1]}")
    rows = [("```python\ndef is_multiple_of_11(n):\n    return n % 11 == 0 or n // 11 == 0\n```", 1.0),
            ("```python\ndef is_multiple_of_11(n):\n    return n % 11 == 0\n```", 1.0),
            ("```python\ndef is_multiple_of_11(n):\n    return True\n```", 0.0)]
    samples = tmp_path / "s.jsonl"
    samples.write_text("".join(json.dumps({"model": "m", "id": "multiple-00017", "i": i, "reward": r, "status": "ok",
                                           "response": t}) + "\n" for i, (t, r) in enumerate(rows)))
    p = _run(str(CODE / "draw_rewarded.py"), str(samples), "-n", "5", "--check", "20")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("2 of 2 rewarded responses of s.jsonl (3 lines), seed 0\n")
    assert "!! m · multiple-00017 · sample 0: " in p.stdout and "sample 1:" not in p.stdout
    assert p.stdout.strip().endswith("1 of 2 rewarded programs differ from the reference on the edge classes and 20 "
                                     "random inputs of their function")
