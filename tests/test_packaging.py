"""The package's metadata: one version source, a typed marker shipped with the code, classifiers, a changelog."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import graft
import graft.registry

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


def test_every_path_the_contributor_page_names_exists():
    """docs/contributing.md names the module, registry and test of each variant: each must exist, so the page
    cannot drift from the code."""
    text = (REPO / "docs" / "contributing.md").read_text()
    paths = set(re.findall(r"`((?:graft|tests)/[\w/]+\.py)(?:::(\w+))?", text))
    assert len(paths) >= 10
    for path, test in paths:
        assert (REPO / path).is_file(), path
        if test:
            assert f"def {test}(" in (REPO / path).read_text(), f"{path}::{test}"
    for registry in re.findall(r"`([A-Z]+)` in `graft/registry.py`|\| `([A-Z]+)` \|", text):
        name = next(r for r in registry if r)
        assert hasattr(graft.registry, name), name


def test_the_package_data_rule_ships_every_packaged_config():
    """graft/configs goes into the wheel and sdist through package-data: every file under it matches one of the
    rule's globs, as setuptools expands them. The repository's configs/ links each packaged preset (so
    ``configs/default.yaml`` and ``graft train default`` are the same file) and holds the experiment plans, which
    stay beside the results/ they read (``../../results/...``)."""
    rules = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["graft"]
    shipped = {p for rule in rules for p in (REPO / "graft").glob(rule) if p.is_file()}
    files = {p for p in (REPO / "graft" / "configs").rglob("*") if p.is_file()}
    assert len(files) >= 20 and files <= shipped
    links = {p.name: p for p in (REPO / "configs").iterdir() if p.is_symlink()}
    assert sorted(links) == sorted(p.name for p in (REPO / "graft" / "configs").iterdir())
    assert all(p.resolve() == REPO / "graft" / "configs" / name for name, p in links.items())
    assert (REPO / "configs" / "experiments" / "study.yaml").resolve().parent == REPO / "configs" / "experiments"
