"""The package's shape (docs/design.md, "Layers"): imports only point down, no cycles, imports at the
top of modules (an import inside a function only defers an optional heavy dependency, and says so),
and no function longer than a screen."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "graft"

LAYERS: list[tuple[str, ...]] = [
    ("graft", "graft.errors", "graft.registry", "graft.console", "graft.success"),
    ("graft.types", "graft.seeds", "graft.files", "graft.cores", "graft.heap", "graft.signals"),
    ("graft.config",),
    ("graft.algos", "graft.reward", "graft.data", "graft.distributed"),
    ("graft.domains",),
    ("graft.policy",),
    ("graft.storage",),
    ("graft.exchange",),
    ("graft.evaluation",),
    ("graft.trainer",),
    ("graft.bench",),
    ("graft.api",),        # graft.train / load_config / load_run: the Python API, which the CLI's train runs
    ("graft.commands",),   # the command layer: every command's entry point and parser (graft/commands/)
    ("graft.cli", "graft.__main__"),   # `python -m graft.cli` / `python -m graft`: graft.commands.cli's main
    ("graft.docs_gen",),
]
"""Bottom to top. A module may import its own folder and any lower layer; nothing of its own layer's
other folders and nothing above."""

MAX_DEFERRED_IMPORTS = 15
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 300


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


MODULES = _modules()


def _folder(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def _layer(module: str) -> int:
    folder = _folder(module)
    for i, names in enumerate(LAYERS):
        if folder in names:
            return i
    raise AssertionError(f"{module}: its folder {folder} is in no layer of LAYERS (add it)")


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The graft modules an import statement loads (``from graft.x import y`` -> ``graft.x.y`` when that is a module)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
            base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    return [n for n in names if n == "graft" or n.startswith("graft.")]


def _imports() -> list[tuple[str, str, int, bool, str]]:
    """(importer, imported, line, inside a function, source line + the line above) for every graft import."""
    rows = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                context = "\n".join(lines[max(0, node.lineno - 2): node.end_lineno])
                for t in _targets(module, node) or [""]:
                    rows.append((module, t, node.lineno, id(node) in inner, context))
    return rows


IMPORTS = _imports()


def test_imports_point_down():
    bad = [f"{m}:{line} imports {t}" for m, t, line, _, _ in IMPORTS
           if t and t != m and _folder(t) != _folder(m) and _layer(t) >= _layer(m)]
    assert not bad, "imports that point up or sideways (see LAYERS):\n" + "\n".join(bad)


def test_no_import_cycle():
    graph: dict[str, set[str]] = {}
    for m, t, *_ in IMPORTS:
        if t and t != m:
            graph.setdefault(m, set()).add(t)
    state: dict[str, int] = {}

    def visit(v: str, path: list[str]) -> list[str] | None:
        state[v] = 1
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return path + [v, w]
            if w not in state:
                found = visit(w, path + [v])
                if found:
                    return found
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state:
            cycle = visit(v, [])
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_imports_inside_functions_are_few_and_say_why():
    deferred = {}
    for path in MODULES.values():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(f):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        deferred[(path.relative_to(ROOT.parent), node.lineno)] = \
                            "\n".join(lines[max(0, node.lineno - 2): node.end_lineno])
    silent = [f"{p}:{n}" for (p, n), text in deferred.items() if "#" not in text]
    assert not silent, "imports inside functions without a comment giving the reason:\n" + "\n".join(silent)
    assert len(deferred) <= MAX_DEFERRED_IMPORTS, (
        f"{len(deferred)} imports inside functions (at most {MAX_DEFERRED_IMPORTS}):\n"
        + "\n".join(f"{p}:{n}" for p, n in sorted(deferred)))


def test_no_function_longer_than_a_screen():
    long = []
    for path in MODULES.values():
        for f in ast.walk(ast.parse(path.read_text())):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = f.end_lineno - f.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT.parent)}:{f.lineno} {f.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_no_module_over_800_lines_and_no_class_over_300():
    long = [f"{p.relative_to(ROOT.parent)} ({n} lines)" for p in MODULES.values() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    big = []
    for path in MODULES.values():
        for c in ast.walk(ast.parse(path.read_text())):
            if isinstance(c, ast.ClassDef) and (n := c.end_lineno - c.lineno + 1) > MAX_CLASS_LINES:
                big.append(f"{path.relative_to(ROOT.parent)}:{c.lineno} {c.name} ({n} lines)")
    assert not long and not big, f"modules over {MAX_MODULE_LINES} lines: {long}; classes over {MAX_CLASS_LINES}: {big}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_is_in_a_layer(module):
    _layer(module)


ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? ?#?\d+|\bissue\d+")
"""An issue number as prose ("issue 39", "issues #20") or in a name ("issue39_...")."""


def test_no_issue_numbers_in_the_package_or_in_benchmark_names():
    """The CHANGELOG and docs/history.md carry history; the code, its configs and the benchmarks' names do not."""
    repo = ROOT.parent
    files = [p for p in sorted(ROOT.rglob("*")) if p.suffix in (".py", ".yaml", ".md") and p.is_file()]
    found = [f"{p.relative_to(repo)}:{i}: {line.strip()[:100]}" for p in files
             for i, line in enumerate(p.read_text().splitlines(), 1) if ISSUE_NUMBER.search(line)]
    found += [str(p.relative_to(repo)) for p in (repo / "benchmarks").rglob("*") if ISSUE_NUMBER.search(p.name)]
    assert not found, "issue numbers:\n" + "\n".join(found)


def test_the_issue_number_pattern():
    assert all(ISSUE_NUMBER.search(t) for t in ("see issue 39", "(issue 20 §3)", "issues #20", "issue39_head.py"))
    assert not any(ISSUE_NUMBER.search(t) for t in ("an issue of size 3", "tissue39", "Math-Verify#65"))
