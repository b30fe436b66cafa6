"""The bench's commands answer --help: graft bench and the scripts that call into graft.bench."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.patience import patient


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv, usage", [
    (["-m", "graft.cli", "bench", "--help"], "usage: graft bench"),
    (["scripts/gpu_check.py", "--help"], "usage: gpu_check.py"),
    (["scripts/profile_rollout.py", "--help"], "usage: profile_rollout.py"),
    (["scripts/probe_task.py", "--help"], "usage: graft probe"),
    (["benchmarks/issue39_commits.py", "--help"], "usage: issue39_commits.py"),
    (["benchmarks/issue39_precision.py", "--help"], "usage: issue39_precision.py"),
    (["benchmarks/issue39_ceiling.py", "--help"], "usage: issue39_ceiling.py"),
    (["benchmarks/issue39_batch.py", "--help"], "usage: issue39_batch.py"),
    (["benchmarks/issue39_malloc.py", "--help"], "usage: issue39_malloc.py"),
    (["benchmarks/issue39_update.py", "--help"], "usage: issue39_update.py"),
    (["benchmarks/issue39_head.py", "--help"], "usage: issue39_head.py"),
    (["benchmarks/issue39_rollout_ab.py", "--help"], "usage: issue39_rollout_ab.py"),
    (["benchmarks/code_grading_cost.py", "--help"], "usage: code_grading_cost.py"),
    (["results/code/kill_rates.py", "--help"], "usage: kill_rates.py"),
])
def test_help(argv, usage):
    """Each command prints its usage and exits 0."""
    p = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=REPO, timeout=patient(120))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(usage)


def test_gpu_check_does_not_load_the_trainer():
    """scripts/gpu_check.sh runs on a bare GPU machine: no trainer file outputs, so no pyarrow."""
    code = "import sys, graft.bench.gpu_check; print(sorted({'pyarrow', 'graft.trainer.loop'} & set(sys.modules)))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=patient(120))
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr
