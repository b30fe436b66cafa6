"""The package's metadata: one version source, a typed marker shipped with the code, classifiers, a changelog."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import graft

REPO = Path(__file__).resolve().parents[1]


def test_version_is_defined_once_and_py_typed_ships():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["dynamic"] == ["version"] and "version" not in meta["project"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "graft.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", graft.__version__)
    assert (REPO / "graft" / "py.typed").is_file()
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["graft"]
    assert "Typing :: Typed" in meta["project"]["classifiers"]
    assert "## Unreleased" in (REPO / "CHANGELOG.md").read_text()
