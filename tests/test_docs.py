"""The documentation: the README stays short and its links resolve, the MkDocs site builds with warnings as errors,
and every `graft ...` command in a code block of the README or docs/ is a real command whose arguments its own
parser accepts, whose config and overrides load, and which an end-to-end test runs."""
from __future__ import annotations

import argparse
import ast
import importlib.util
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

from graft.commands.cli import COMMANDS, unknown_command
from graft.config import load_config
from graft.config.keys import key_templates as _key_templates
from graft.console import split_flags
from graft.docs_gen import PAGES, command_parser, config_reference
from graft.errors import UserError

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

END_TO_END = {
    "train": ["tests/trainer/test_train_e2e.py::test_graft_step_exchanges_and_updates_both_models",
              "tests/trainer/test_rl_metrics.py::test_log_off_a_terminal_is_one_line_per_step"],
    "eval": ["tests/evaluation/test_eval_before_after.py::test_defaults_and_side_by_side",
             "tests/evaluation/test_eval_cli.py::test_train_then_eval_checkpoint_and_report"],
    "grade": ["tests/test_grade_cli.py::test_grade_scores_each_row_with_the_configs_domain"],
    "probe": ["tests/test_probe.py::test_probe_records_its_overrides_consistent_counts_and_a_prediction"],
    "config": ["tests/test_config_show.py::test_config_show_lists_every_resolved_key_with_default_type_and_description"],
    "export": ["tests/test_export.py::test_export_latest_gives_the_checkpoint_logprobs",
               "tests/trainer/test_weights_only.py::test_weights_only_run_exports_and_refuses_to_resume"],
    "analyze": ["tests/evaluation/test_analyze.py::test_grpo_run",
                "tests/trainer/test_resume_repairs.py::test_a_torn_store_file_reruns_from_an_earlier_checkpoint_or_is_refused"],
    "samples": ["tests/evaluation/test_samples.py::test_cli_prints_a_header_and_the_picked_samples"],
    "report": ["tests/evaluation/test_report.py::test_report_two_runs_side_by_side",
               "tests/evaluation/test_eval_cli.py::test_train_then_eval_checkpoint_and_report"],
    "store": ["tests/storage/test_trajectory_store.py::test_info_export_and_cli"],
    "sweep": ["tests/test_cli.py::test_sweep_print_does_not_run"],
    "experiment": ["tests/test_experiment.py::test_run_is_resumable_and_summarised",
                   "tests/test_experiment.py::test_status_of_every_run_and_unknown_only_arms"],
    "onestep": ["tests/test_onestep.py::test_onestep_end_to_end_on_tiny_models",
                "tests/test_onestep.py::test_from_a_finished_grpo_run_equals_training_the_trajectory"],
    "splits": ["tests/test_task_splits.py::test_the_command_in_process_and_as_a_process_write_the_same_splits"],
    "bench": ["tests/test_bench.py::test_bench_runs_graft_sides_end_to_end"],
}
"""Command -> the end-to-end tests that run it (on the tiny models, or on a run folder written like one)."""

FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.M | re.S)
SHELL = {"", "bash", "sh", "shell", "console"}


def fenced_commands(markdown: str) -> list[list[str]]:
    """Every ``graft ...`` command of the markdown's code blocks as argv (without ``graft``): in shell blocks every
    line, joined at a trailing backslash, comments dropped, each segment of ``&&``, ``;`` or a pipe that starts with
    ``graft``; in blocks without a language (file trees, output) the lines that start with ``graft ``."""
    out = []
    for lang, body in FENCE.findall(markdown):
        if lang not in SHELL:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            if not lang and not line.startswith("graft "):
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            segment: list[str] = []
            for token in [*lexer, ";"]:
                if token and set(token) <= set(";&|<>()"):
                    if segment[:1] == ["graft"]:
                        out.append(segment[1:])
                    segment = []
                else:
                    segment.append(token)
    return out


class _UsageError(Exception):
    pass


def _refuse(parser: argparse.ArgumentParser, message: str) -> None:
    raise _UsageError(f"{parser.prog}: {message}")


def command_problem(argv: list[str]) -> str | None:
    """Why ``graft ARGV``, run from the repository's root, is not a command graft runs as written (None when it is):
    an unknown command, arguments its own parser refuses, or a config with overrides that does not load."""
    _, argv = split_flags(argv)
    if not argv or argv[0] not in COMMANDS:
        return unknown_command(argv[0] if argv else "")
    _, parse = command_parser(argv[0])
    try:
        with mock.patch.object(argparse.ArgumentParser, "error", _refuse):
            args = parse(argv[1:])
    except _UsageError as e:
        return str(e)
    if getattr(args, "overrides", None) is not None and getattr(args, "config", None) is not None:
        try:
            load_config(args.config, args.overrides)
        except (UserError, OSError) as e:
            return f"{args.config} {' '.join(args.overrides)}: {e}"
    return None


DOCUMENTED = [(f"{path.relative_to(REPO)}: graft {shlex.join(argv)}", argv)
              for path in DOC_FILES for argv in fenced_commands(path.read_text())]


def test_the_documentation_shows_commands():
    assert {argv[0] for _, argv in DOCUMENTED} >= {"train", "eval", "probe", "analyze", "report", "config"}


@pytest.mark.parametrize("where, argv", DOCUMENTED, ids=[w for w, _ in DOCUMENTED])
def test_every_documented_command_parses_and_its_config_loads(where, argv, monkeypatch):
    monkeypatch.chdir(REPO)
    assert command_problem(argv) is None, where


def test_the_checker_refuses_broken_examples(monkeypatch):
    monkeypatch.chdir(REPO)
    markdown = "\n".join([
        "```bash",
        "bash scripts/install.sh && graft train configs/default.yaml steps=2   # fine",
        "graft train configs/default.yaml exchange.gate=0.5      # an unknown key",
        "graft probe configs/default.yaml --promts 64            # an unknown flag",
        "graft -v config show configs/nope.yaml                  # no such config",
        "graft sweep configs/default.yaml --grid steps=1,2 \\",
        "    --print steps=abc                                   # a bad value, after a continuation",
        "graft trian configs/default.yaml                        # no such command",
        "graft eval --data math500 --repeats                     # a flag without its value",
        "```",
        "```yaml",
        "graft train not-a-command-in-yaml",
        "```",
    ])
    commands = fenced_commands(markdown)
    assert [c[0] for c in commands] == ["train", "train", "probe", "-v", "sweep", "trian", "eval"]
    problems = [command_problem(c) for c in commands]
    assert problems[0] is None
    assert all(problems[1:]), problems
    assert "exchange.gate" in problems[1] and "--promts" in problems[2] and "nope.yaml" in problems[3]
    assert "steps" in problems[4] and "did you mean 'train'" in problems[5] and "--repeats" in problems[6]


def _test_functions(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}


def test_every_documented_command_has_end_to_end_tests_that_exist():
    assert set(END_TO_END) <= set(COMMANDS)
    missing = sorted({argv[0] for _, argv in DOCUMENTED} - set(END_TO_END))
    assert not missing, f"documented commands without an end-to-end test in END_TO_END: {missing}"
    gone = [t for tests in END_TO_END.values() for t in tests
            if t.split("::")[1] not in _test_functions(REPO / t.split("::")[0])]
    assert not gone, f"END_TO_END names tests that do not exist: {gone}"


def test_the_configuration_reference_has_every_key_of_the_config_tree():
    page = config_reference()
    missing = [key for key in _key_templates() if f"| `{key}` |" not in page]
    assert not missing, f"keys missing from the configuration reference: {missing}"


def test_readme_is_short_and_keeps_the_quick_start():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "bash scripts/install.sh && graft train configs/default.yaml\n" in readme
    assert "bash scripts/install.sh && python3 -m pytest -q -x --timeout=900\n" in readme   # .ci/run runs this


def test_readme_links_into_the_docs_resolve():
    toc = pytest.importorskip("markdown.extensions.toc", reason="the markdown package (with mkdocs) names the anchors")

    def anchors(page: str) -> set[str]:
        return {toc.slugify(h, "-") for h in re.findall(r"^#+ (.+)$", FENCE.sub("", page), re.M)}

    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", (REPO / "README.md").read_text())
    assert links
    bad = []
    for target, anchor in links:
        page = target.removeprefix("docs/")
        if page in PAGES:
            continue
        path = REPO / target
        if not path.is_file() or (anchor and anchor not in anchors(path.read_text())):
            bad.append(f"{target}#{anchor}" if anchor else target)
    assert not bad, f"README links to docs that do not exist: {bad}"


LINKED_FILES = [*DOC_FILES, REPO / "CHANGELOG.md", *sorted((REPO / "benchmarks").rglob("*.md"))]
"""The markdown whose relative links must resolve inside the repository."""


def relative_links_that_leave_or_miss(path: Path, text: str) -> list[str]:
    """The relative link targets of markdown ``text`` (read from ``path``; code blocks skipped) that point outside the
    repository or at nothing; links with a scheme (``https://``) and anchors alone are fine. A generated page of
    the site (``docs/reference/cli.md``) counts as there."""
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", text)):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        file = Path(os.path.normpath(path.parent / target.split("#")[0]))
        generated = file.is_relative_to(REPO / "docs") and str(file.relative_to(REPO / "docs")) in PAGES
        if not file.is_relative_to(REPO) or not (file.exists() or generated):
            bad.append(target)
    return bad


def test_no_link_of_the_readme_or_docs_leaves_the_repository():
    bad = [f"{p.relative_to(REPO)}: {t}" for p in LINKED_FILES for t in relative_links_that_leave_or_miss(p, p.read_text())]
    assert not bad, "links that leave the repository or name no file:\n" + "\n".join(bad)


def test_the_link_check_refuses_links_out_of_the_repository():
    page = REPO / "docs" / "page.md"
    text = ("[spec](../../shared/spec/GRAFT.md) [ok](concepts.md#x) [gone](nope.md) [web](https://x.org/a) "
            "[ref](reference/cli.md) [up](../README.md)\n```\n[in code](../../x.md)\n```\n")
    assert relative_links_that_leave_or_miss(page, text) == ["../../shared/spec/GRAFT.md", "nope.md"]


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install -e '.[docs]')")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                           "-d", str(site)], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    for uri in PAGES:
        assert (site / uri.replace(".md", ".html" if uri == "index.md" else "/index.html")).is_file(), uri
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert all(f"graft {name}" in cli for name in COMMANDS)


def test_a_link_to_a_missing_repository_file_fails_the_build(caplog):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    spec = importlib.util.spec_from_file_location("graft_docs_hooks", REPO / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = SimpleNamespace(file=SimpleNamespace(src_uri="concepts.md"))
    config = SimpleNamespace(docs_dir=str(REPO / "docs"))
    markdown = ("[the default](../configs/default.yaml), [`configs/default.yaml`](../configs/default.yaml), "
                "[Metrics](metrics.md#per-model-m), [gone](../configs/gone.yaml)")
    with caplog.at_level(logging.WARNING):
        out = hooks.on_page_markdown(markdown, page, config, None)
    assert out == ("the default (`configs/default.yaml`), `configs/default.yaml`, [Metrics](metrics.md#per-model-m), "
                   "gone (`configs/gone.yaml`)")
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and "configs/gone.yaml" in caplog.text
