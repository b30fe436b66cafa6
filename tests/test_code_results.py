"""The code domain's results scripts (results/code/): they answer --help and run, and the committed re-grading of the
code GRAFT run's samples (results/code/graft16/regraded.txt, quoted in results/code/README.md) is what
``regrade_samples.py`` prints today: it fails when the task's tests or the reward change (the figures move)."""
from __future__ import annotations

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


@pytest.mark.parametrize("script", ["kill_rates.py", "regrade_samples.py"])
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
