"""Every value checked against (and converted to) its field's type hint: :func:`build` makes a dataclass from nested
mappings and reports every error with its dotted field."""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import re
import types
import typing
from typing import Annotated, Any, Literal

import yaml

from graft.config.checks import BROKEN, ConfigError, ConfigErrors, FieldError, accepts_of, each, grouped, members, registry_of
from graft.config.keys import unknown_keys


def build(cls: type, data: Any, where: str) -> Any:
    """Build dataclass ``cls`` from nested dicts; every value is checked against its field's
    type (:func:`coerce`) and every error names the dotted field (``where`` is the path of ``cls``).

    Every unknown key and every field's type error is reported, in every section (:class:`ConfigErrors`); the
    ``__post_init__`` invariants of a dataclass run only when all of its fields are well typed, and every broken one
    is reported (:func:`construct`); the top level's run only when every section built."""
    if not dataclasses.is_dataclass(cls):
        return data
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping of {cls.__name__} fields, got {show_value(data)}")
    hints = members(cls)
    known = list(hints)

    def check(name: Any, value: Any) -> Any:
        if name in known:
            return coerce(hints[name], value, join_key(where, name))
        lines = unknown_keys(join_key(where, name), value, f"the keys of {where or 'the top level'} are {', '.join(known)}")
        raise ConfigErrors([ConfigError(line) for line in lines]) if len(lines) > 1 else ConfigError(lines[0])

    kwargs = dict(zip(data, each(check, data.items()), strict=True))  # every field's errors, before any invariant
    return construct(cls, grouped(cls, kwargs), where)


def construct(cls: type, kwargs: dict, where: str) -> Any:
    """``cls(**kwargs)`` with every broken invariant of its ``__post_init__`` reported together (:data:`BROKEN`),
    each prefixed with ``where``. An exception other than a :class:`ConfigError` after an invariant broke is its
    consequence (a check guarding the code after it) and is dropped; without one it is raised as before."""
    broken: list[ConfigError] = []
    token = BROKEN.set(broken)
    try:
        made = cls(**kwargs)
    except ConfigError as e:
        broken += e.errors if isinstance(e, ConfigErrors) else [e]
    except TypeError as e:
        if not broken:
            raise ConfigError(f"{where or 'config'}: {e}") from None
    except Exception:
        if not broken:
            raise
    finally:
        BROKEN.reset(token)
    errors = [ConfigError(f"{join_key(where, e.field)}: {e.reason}") if isinstance(e, FieldError) else e for e in broken]
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    return made


def join_key(where: str, name: Any) -> str:
    return f"{where}.{name}" if where else str(name)


def show_value(value: Any) -> str:
    """A value as the user wrote it (YAML spelling for null/booleans/mappings)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, (str, int, float)):
        return repr(value)
    return f"a {type(value).__name__}"


def hint_words(hint: Any) -> str:
    """What a type hint accepts, in words (for messages)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "text"
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin is Annotated:
        registry, accepts = registry_of(hint), accepts_of(hint)
        if registry is not None:
            return "one of " + registry.choices()
        return accepts.words if accepts is not None else hint_words(args[0])
    if origin is collections.abc.Callable:
        return "a Python callable"
    if origin in (typing.Union, types.UnionType):
        parts = [hint_words(a) for a in args if a is not type(None)]
        if type(None) in args:
            parts.append("null")
        return " or ".join(parts)
    if origin is list:
        return f"a list of {hint_words(args[0])}" if args else "a list"
    if origin is tuple:
        return f"a list of {len(args)} numbers" if args and args[-1] is not Ellipsis else "a list"
    if origin is dict:
        return f"a mapping of {hint_words(args[0])} to {hint_words(args[1])}" if args else "a mapping"
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return f"a mapping of {hint.__name__} fields"
    return getattr(hint, "__name__", str(hint))


_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _exact(hint: Any, value: Any) -> bool:
    """``value`` already has type ``hint`` (no conversion needed); used to pick a member of a union."""
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, float)
    if hint is str:
        return isinstance(value, str)
    origin = typing.get_origin(hint)
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in typing.get_args(hint))
    if origin is Annotated:
        registry, accepts = registry_of(hint), accepts_of(hint)
        if registry is not None:
            return isinstance(value, str) and value in registry
        return accepts.test(value) if accepts is not None else _exact(typing.get_args(hint)[0], value)
    if origin is collections.abc.Callable:
        return callable(value) and not isinstance(value, type)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict or dataclasses.is_dataclass(hint):
        return isinstance(value, dict)
    return False


def coerce(hint: Any, value: Any, where: str) -> Any:
    """``value`` checked against (and converted to) the type ``hint`` of field ``where``.

    A choice (``Annotated[str, REGISTRY]``) or a Literal: one of the names, exactly (``GRPO`` is not ``grpo``).
    int: an integer (a float with an integral value is accepted; booleans are not). float: a number (ints accepted; text
    such as ``2e-6``, which YAML 1.1 reads as a string, is converted; NaN is rejected). bool:
    true/false. str: text (numbers are turned into text). ``X | None``: null or X. list/tuple:
    a list whose items are checked (``models.0``; a single text or number is a one-item list),
    tuple of the declared length. dict: a
    mapping whose keys and values are checked, or the text ``{k:v,...}``. Dataclass: a mapping
    (:func:`build`).
    """
    if hint is Any:
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build(hint, value, where)
    if hint in _SCALARS:
        return _SCALARS[hint](value, where)
    origin = typing.get_origin(hint)
    origin = typing.Union if origin is types.UnionType else origin
    if origin in _GENERICS:
        return _GENERICS[origin](hint, typing.get_args(hint), value, where)
    return value


def _to_literal(hint: Any, args: tuple, value: Any, where: str) -> Any:
    if any(type(value) is type(a) and value == a for a in args):
        return value
    raise ConfigError(f"{where}: {show_value(value)} is not one of {', '.join(str(a) for a in args)}")


def _to_annotated(hint: Any, args: tuple, value: Any, where: str) -> Any:
    registry, accepts = registry_of(hint), accepts_of(hint)
    if accepts is not None:
        if accepts.test(value):
            return value
        raise ConfigError(f"{where}: expected {accepts.words}, got {show_value(value)}")
    if registry is None:
        return coerce(args[0], value, where)
    if isinstance(value, str) and value in registry:
        return value
    raise ConfigError(f"{where}: {show_value(value)} is not one of {registry.choices()}")


def _to_callable(hint: Any, args: tuple, value: Any, where: str) -> Any:
    if callable(value) and not isinstance(value, type):
        return value
    raise ConfigError(f"{where}: expected a Python callable, got {show_value(value)}")


def _to_union(hint: Any, args: tuple, value: Any, where: str) -> Any:
    members = [a for a in args if a is not type(None)]
    if value is None:
        if type(None) in args:
            return None
        raise ConfigError(f"{where}: expected {hint_words(hint)}, got null")
    for a in members:
        if _exact(a, value):
            return coerce(a, value, where)
    errors = []
    for a in members:
        try:
            return coerce(a, value, where)
        except ConfigError as e:
            errors.append(e)
    if len(members) == 1:
        raise errors[0]
    raise ConfigError(f"{where}: expected {hint_words(hint)}, got {show_value(value)}")


def _to_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{where}: expected true or false, got {show_value(value)}")


def _to_int(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
        return int(value)
    raise ConfigError(f"{where}: expected an integer, got {show_value(value)}")


def _to_float(value: Any, where: str) -> float:
    out = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out = float(value)
    elif isinstance(value, str) and _NUMBER.match(value.strip()):
        out = float(value)
    if out is None or math.isnan(out):
        raise ConfigError(f"{where}: expected a number, got {show_value(value)}")
    return out


def _to_str(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{where}: expected text, got {show_value(value)}")


def _to_list(hint: Any, args: tuple, value: Any, where: str) -> list:
    if value is None:
        return []
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        value = [value]  # one item: `logging.report_to=tensorboard`, `models.0.stop=END`
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: expected {hint_words(hint)}, got {show_value(value)}")
    return each(lambda i, v: coerce(args[0], v, f"{where}.{i}"), enumerate(value)) if args else list(value)


def _to_tuple(hint: Any, args: tuple, value: Any, where: str) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: expected {hint_words(hint)}, got {show_value(value)}")
    if args and args[-1] is Ellipsis:
        return tuple(each(lambda i, v: coerce(args[0], v, f"{where}.{i}"), enumerate(value)))
    if args and len(value) != len(args):
        raise ConfigError(f"{where}: expected {hint_words(hint)}, got {len(value)} item(s)")
    return tuple(
        each(lambda i, a, v: coerce(a, v, f"{where}.{i}"), zip(range(len(args)), args, value, strict=True)) if args else value
    )


def _to_dict(hint: Any, args: tuple, value: Any, where: str) -> dict:
    if value is None:
        return {}
    if isinstance(value, str):
        value = parse_flow_mapping(value, where)
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected {hint_words(hint)}, got {show_value(value)}")
    key_t, val_t = args if args else (Any, Any)
    if any(v is None for v in value.values()) and not accepts_none(val_t):
        raise ConfigError(
            f"{where}: a key has no value ({value!r}); in YAML write a space after each colon, e.g. {{8: 0.01, 12: 0.9}}"
        )
    return dict(each(lambda k, v: (coerce(key_t, k, f"{where} key {k!r}"), coerce(val_t, v, f"{where}.{k}")), value.items()))


_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}
"""Plain field types -> their check-and-convert function."""
_GENERICS = {
    Literal: _to_literal,
    Annotated: _to_annotated,
    typing.Union: _to_union,
    list: _to_list,
    tuple: _to_tuple,
    dict: _to_dict,
    collections.abc.Callable: _to_callable,
}
"""Generic origins (``Annotated[str, REGISTRY]``, ``Literal[...]``, ``X | None``, ``list[X]`` ...) -> their
check-and-convert function."""


def accepts_none(hint: Any) -> bool:
    return hint is Any or (typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint))


def parse_flow_mapping(text: str, where: str = "") -> dict:
    """``{8:0.01,12:0.9}`` (or with spaces) as a dict, each key and value read as YAML.

    YAML reads a flow mapping only with a space after each colon (``{8:0.01}`` is the single
    key ``8:0.01``, a base-60 number in YAML 1.1), so mappings typed on the command line
    without spaces are parsed here. Nested mappings/lists are not supported by this form.
    """
    t = text.strip()
    if not (t.startswith("{") and t.endswith("}")) or any(c in t[1:-1] for c in "{}[]"):
        raise ConfigError(f"{where}: expected a mapping such as {{8: 0.01, 12: 0.9}}, got {text!r}")
    out: dict = {}
    body = t[1:-1].strip()
    for item in body.split(",") if body else []:
        k, sep, v = item.partition(":")
        if not sep or not k.strip() or not v.strip():
            raise ConfigError(f"{where}: {item.strip()!r} in {text!r} is not key:value")
        try:
            out[yaml.safe_load(k.strip())] = yaml.safe_load(v.strip())
        except yaml.YAMLError:
            raise ConfigError(f"{where}: {item.strip()!r} in {text!r} is not key:value") from None
    return out
