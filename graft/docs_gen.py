"""The documentation site's generated pages, from the one place each fact lives: the configuration reference from
the config tree's field docs (:func:`graft.config.field_docs`), the command reference from the parsers the
commands' entry points build, and the home page from README.md. ``docs/hooks.py`` adds them to the MkDocs site
at build time; nothing generated is committed."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any, Callable

import yaml

from graft.commands.cli import COMMANDS
from graft.config import Config, field_docs
from graft.config.checks import members
from graft.config.coerce import hint_words
from graft.config.keys import dataclass_of
from graft.config.show import field_default

ROOT = Path(__file__).resolve().parents[1]
"""The checkout: README.md and docs/ sit here."""

_PARSE_METHODS = {"parse_known_args": "parse_args", "parse_known_intermixed_args": "parse_intermixed_args"}
"""ArgumentParser's inner parse methods -> the public method a command calls to reach each."""


class _Built(Exception):
    """Raised from inside a command's entry point the moment it parses: the parser it built, and how it parses."""

    def __init__(self, parser: argparse.ArgumentParser, method: str):
        super().__init__(parser.prog)
        self.parser, self.method = parser, method


def command_parser(name: str) -> tuple[argparse.ArgumentParser, Callable[[list[str]], argparse.Namespace]]:
    """The parser ``graft NAME`` builds, and its parse function as the command calls it (``parse_args`` or
    ``parse_intermixed_args``): the entry point runs until its first parse call, which is stopped before it reads
    any argument, so nothing of the command runs."""
    module, func = COMMANDS[name]
    entry = getattr(importlib.import_module(module), func)
    saved = {m: getattr(argparse.ArgumentParser, m) for m in _PARSE_METHODS}

    def stopper(method: str) -> Callable:
        def stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
            raise _Built(self, _PARSE_METHODS[method])

        return stop

    try:
        for m in saved:
            setattr(argparse.ArgumentParser, m, stopper(m))
        entry([])
    except _Built as built:
        return built.parser, getattr(built.parser, built.method)
    finally:
        for m, f in saved.items():
            setattr(argparse.ArgumentParser, m, f)
    raise AssertionError(f"graft {name}: its entry point {module}.{func} returned without parsing its arguments")


def _help(parser: argparse.ArgumentParser) -> str:
    """The parser's --help text at a fixed width, whatever the terminal."""
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)
    return parser.format_help().rstrip()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands: argparse's, or those a parser that dispatches by its first argument names
    (``subcommands()``, :class:`graft.bench.args.BenchParser`)."""
    named: dict[str, argparse.ArgumentParser] = getattr(parser, "subcommands", dict)()
    return named | {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }


def cli_reference() -> str:
    """docs/reference/cli.md: every command's --help, in the order of graft.commands.cli's command table."""
    out = [
        "# Command reference",
        "",
        "Generated from the parsers the commands build (`graft/docs_gen.py`); `graft COMMAND --help` prints the "
        "same. `-v` (progress and info lines) and `-q` (errors only) go before or after any command.",
        "",
    ]
    for name in COMMANDS:
        parser, _ = command_parser(name)
        out += [f"## graft {name}", "", "```text", _help(parser), "```", ""]
        for sub_name, sub in _subparsers(parser).items():
            out += [f"### graft {name} {sub_name}", "", "```text", _help(sub), "```", ""]
    return "\n".join(out)


def _default_cell(f: dataclasses.Field) -> str:
    """The field's default (:func:`graft.config.show.field_default`) as inline YAML code."""
    text = yaml.safe_dump(json.loads(json.dumps(field_default(f))), default_flow_style=True, width=10_000)
    return "`" + text.strip().removesuffix("\n...").strip() + "`"


def _plain(text: str) -> str:
    """Docstring text as markdown: Sphinx roles (``:data:`x```) as plain code."""
    return re.sub(r":\w+:`", "`", text)


def _cell(text: str) -> str:
    return _plain(text).replace("|", "\\|")


def _sections(cls: type, prefix: str, about: str, docs: dict) -> list[tuple[str, type, str]]:
    """``(dotted prefix, dataclass, the description of the field holding it)`` of ``cls`` and of every dataclass
    below it, in tree order."""
    out = [(prefix, cls, about)]
    for name, hint in members(cls).items():
        sub = dataclass_of(hint)
        if sub is not None:
            about = docs.get((cls.__name__, name)) or inspect.getdoc(sub) or ""  # a settings section: its class's doc
            out += _sections(sub, f"{prefix}{name}." if sub is hint else f"{prefix}{name}.*.", about, docs)
    return out


def config_reference() -> str:
    """docs/reference/config.md: every key of the config tree with what it accepts, its default and its
    description, one table per section."""
    docs = field_docs()
    out = [
        "# Configuration reference",
        "",
        "Generated from `graft/config/`, where every field is documented once (`graft/docs_gen.py` writes "
        "this page; `graft config show CONFIG` prints the same descriptions beside a config's resolved values). "
        "`*` is a list index (`models.0.lr`) or a mapping key (`ray.resources.qwen3.num_gpus`). Defaults are the "
        "dataclass defaults; `configs/default.yaml` and the other presets override many.",
        "",
    ]
    for prefix, cls, about in _sections(Config, "", "The run as a whole.", docs):
        hints = members(cls)
        rows = [f for f in dataclasses.fields(cls) if f.name in hints and dataclass_of(hints[f.name]) is None]
        out += [
            f"## `{prefix.rstrip('.') or 'top level'}`",
            "",
            _plain(about),
            "",
            "| key | accepts | default | description |",
            "|---|---|---|---|",
        ]
        out += [
            f"| `{prefix}{f.name}` | {_cell(hint_words(hints[f.name]))} | {_cell(_default_cell(f))} | "
            f"{_cell(docs.get((cls.__name__, f.name), ''))} |"
            for f in rows
        ]
        out.append("")
    return "\n".join(out)


_LINK = re.compile(r"\]\(([^)\s#][^)\s]*)\)")


def home_page() -> str:
    """docs/index.md: README.md, its links re-pointed from the repository root to docs/."""

    def repoint(m: re.Match) -> str:
        target = m.group(1)
        if "://" in target:
            return m.group(0)
        return f"]({target.removeprefix('docs/') if target.startswith('docs/') else '../' + target})"

    return _LINK.sub(repoint, (ROOT / "README.md").read_text())


PAGES: dict[str, Callable[[], str]] = {
    "index.md": home_page,
    "reference/config.md": config_reference,
    "reference/cli.md": cli_reference,
}
"""The generated pages: their path under docs/ -> the function that writes them."""
