"""The package type-checks clean under the repository's mypy configuration (``[tool.mypy]`` in pyproject.toml)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install mypy)")
@pytest.mark.timeout(900)
def test_mypy_reports_no_errors() -> None:
    # mypy's incremental cache (.mypy_cache under the repository root) makes a re-run take seconds.
    # mypy finds its configuration in pyproject.toml ([tool.mypy]) from the repository root.
    proc = subprocess.run([sys.executable, "-m", "mypy", "graft"], cwd=ROOT, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    errors = [line for line in output.splitlines() if ": error:" in line]
    assert proc.returncode == 0 and not errors, (
        f"mypy exited {proc.returncode} with {len(errors)} error(s):\n{output}")
