"""``graft config show``: every leaf of a loaded config with its value, default, type and description."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import textwrap
import typing
from typing import Any

import yaml

from graft.config.checks import member_values, members
from graft.config.coerce import hint_words
from graft.config.data import is_rows
from graft.config.keys import dataclass_of
from graft.config.root import Config


def sections(root: type | None = None) -> list[type]:
    """Every dataclass of the config tree below ``root`` (default :class:`Config`), itself first, each once."""
    out: list[type] = []

    def walk(cls: type) -> None:
        if cls not in out:
            out.append(cls)
            for hint in members(cls).values():
                sub = dataclass_of(hint)
                if sub is not None:
                    walk(sub)

    walk(root or Config)
    return out


def field_docs() -> dict[tuple[str, str], str]:
    """``(dataclass name, field) -> one-line description``: the first sentence of the docstring under each field of
    every section (the one place fields are documented), read with ``ast`` from the section's source."""
    out = {}
    for cls in sections():
        (node,) = ast.parse(textwrap.dedent(inspect.getsource(cls))).body
        assert isinstance(node, ast.ClassDef)
        for a, b in zip(node.body, node.body[1:], strict=False):  # each statement and the next
            if (
                isinstance(a, ast.AnnAssign)
                and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str)
            ):
                text = " ".join(b.value.value.replace("``", "`").split())
                out[(node.name, a.target.id)] = re.split(r"(?<=\.)\s+(?=[A-Z`(])", text, maxsplit=1)[0]
    return out


class Setting(typing.NamedTuple):
    """One leaf of a loaded config, as ``graft config show`` prints it."""

    key: str
    """Dotted key (``models.0.lr``)."""
    value: Any
    """The resolved value."""
    default: Any
    """The field's dataclass default (of ``ModelConfig`` for ``models.0.lr``)."""
    accepts: str
    """What the field's type hint accepts, in words (:func:`hint_words`: ``a number``, ``one of chat, plain, fewshot``)."""
    description: str
    """The first sentence of the field's docstring (:func:`field_docs`)."""

    @property
    def changed(self) -> bool:
        return plain(self.value) != plain(self.default)


def plain(value: Any) -> Any:
    return json.loads(json.dumps(value))


def field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    assert f.default_factory is not dataclasses.MISSING, f"{f.name}: every config field has a default or a factory"
    return f.default_factory()


def describe(cfg: Any) -> list[Setting]:
    """Every leaf field of a loaded config, in tree order (models and mapping entries by their index / key), as
    ``graft config show`` prints them."""
    docs = field_docs()

    def walk(obj: Any, prefix: str) -> list[Setting]:
        rows = []
        hints, fields = members(type(obj)), {f.name: f for f in dataclasses.fields(obj)}
        for name, value in member_values(obj).items():
            key = prefix + name
            if dataclasses.is_dataclass(value):
                rows += walk(value, key + ".")
            elif isinstance(value, list) and value and all(dataclasses.is_dataclass(v) for v in value):
                for i, v in enumerate(value):
                    rows += walk(v, f"{key}.{i}.")
            elif isinstance(value, dict) and value and all(dataclasses.is_dataclass(v) for v in value.values()):
                for k, v in value.items():
                    rows += walk(v, f"{key}.{k}.")
            else:
                doc = docs.get((type(obj).__name__, name), "")
                rows.append(Setting(key, value, field_default(fields[name]), hint_words(hints[name]), doc))
        return rows

    return walk(cfg, "")


SHOW_COLUMNS = ("key", "value", "default", "type", "description")
"""The columns of ``graft config show``, after the ``*`` that marks a value differing from its default."""


def show_config(cfg: Any) -> str:
    """The resolved config as a table: a ``*`` on each value that differs from its default, then key, value,
    default (values in YAML flow style), what the field accepts and its description; columns two spaces apart,
    a long cell pushing the rest of its line (no cell is cut)."""
    settings = describe(cfg)
    rows = [SHOW_COLUMNS] + [(s.key, _flow(s.value), _flow(s.default), s.accepts, s.description) for s in settings]
    marks = [" "] + ["*" if s.changed else " " for s in settings]
    widths = [min(max(len(r[i]) for r in rows), cap) for i, cap in enumerate((36, 28, 16, 28))]
    return "\n".join(
        f"{mark} " + "".join(c.ljust(w) + "  " for c, w in zip(r, widths, strict=False)) + r[-1]
        for mark, r in zip(marks, rows, strict=True)
    )  # the last cell, unpadded, has no width


def _flow(value: Any) -> str:
    """A value in YAML flow style, on one line."""
    return yaml.safe_dump(plain(value), default_flow_style=True, width=10_000).strip().removesuffix("\n...")


def to_dict(cfg: Any) -> dict:
    """Plain nested dict of a config as a config file writes it (tuples become lists, settings sections under their
    own names), suitable for YAML/JSON."""
    return plain(_tree(cfg))


def _tree(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _tree(v) for k, v in member_values(value).items()}
    if isinstance(value, (list, tuple)) and not (value and is_rows(value)):
        return [_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: _tree(v) for k, v in value.items()}
    return value if value is None or isinstance(value, (str, int, float, bool)) else object_text(value)


def object_text(value: Any) -> str:
    """How a Python object set in code (a reward function, an in-memory dataset) is written in a saved config: a
    function as ``module:qualname``, a dataset as ``<in-memory dataset: N rows>``."""
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '?')}:{value.__qualname__}"
    if is_rows(value):
        return f"<in-memory dataset: {len(value)} rows>"
    return f"<{type(value).__name__}>"
