"""The package is ruff-clean under the repository's lint configuration and formatted as ``ruff format`` writes it
(``[tool.ruff]`` in pyproject.toml)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (pip install ruff)")
@pytest.mark.timeout(300)
def test_ruff_reports_no_findings() -> None:
    # ruff reads [tool.ruff] from pyproject.toml in the repository root; no cache, so a run leaves nothing behind.
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "graft"],
                          cwd=ROOT, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"ruff check graft exited {proc.returncode}:\n{output}"


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (pip install ruff)")
@pytest.mark.timeout(300)
def test_ruff_format_would_change_nothing() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "graft"],
                          cwd=ROOT, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"ruff format --check graft exited {proc.returncode} (run `ruff format graft`):\n{output}"
