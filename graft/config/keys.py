"""The dotted keys of the config tree: a key's type hint, every key, the nearest valid key to a misspelt one, and the
one-line error of an unknown key (TRL's and verl's names get graft's: :mod:`graft.config.trl_verl`)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from typing import Any

from graft.config.checks import members
from graft.config.root import Config
from graft.config.trl_verl import is_other_name, other_name_hint


def field_hint(key: str) -> Any:
    """Type hint of the dotted config field ``key`` (``exchange.delta_by_length``, ``models.0.lr``),
    or ``None`` when no such field exists (then :func:`build` reports the key)."""
    hint: Any = Config
    for part in key.split("."):
        while typing.get_origin(hint) in (typing.Union, types.UnionType):
            options = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(options) != 1:
                return None
            hint = options[0]
        origin = typing.get_origin(hint)
        if dataclasses.is_dataclass(hint):
            hints = members(hint)
            if part not in hints:
                return None
            hint = hints[part]
        elif origin in (list, tuple, dict) and typing.get_args(hint):
            hint = typing.get_args(hint)[-1 if origin is dict else 0]
        else:
            return None
    return hint


def dataclass_of(hint: Any) -> Any:
    """The dataclass a field holds (itself, optional, or as list/dict items), else None."""
    while typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(members) != 1:
            return None
        hint = members[0]
    if typing.get_origin(hint) in (list, dict) and typing.get_args(hint):
        hint = typing.get_args(hint)[-1]
    return hint if dataclasses.is_dataclass(hint) else None


def key_templates(cls: type | None = None, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the config tree, list items and mapping values as ``*``
    (``models.*.lr``, ``ray.resources.*.num_gpus``)."""
    cls = cls or Config
    out = []
    for name, hint in members(cls).items():
        sub = dataclass_of(hint)
        key = prefix + name
        if sub is None:
            out.append(key)
        elif sub is hint:
            out += key_templates(sub, key + ".")
        else:
            out += key_templates(sub, key + ".*.")
    return out


def nearest_key(key: str) -> str | None:
    """The valid dotted key closest to the unknown ``key`` (``report_to`` -> ``logging.report_to``):
    difflib over every dotted key and over the leaf names, list indices taken from ``key``; None
    when nothing is close."""

    parts = key.split(".")
    templates = key_templates()
    filled = []
    for t in templates:
        tp = t.split(".")
        filled.append(
            ".".join(
                parts[i] if p == "*" and i < len(parts) and parts[i].isdigit() else "0" if p == "*" else p
                for i, p in enumerate(tp)
            )
        )
    score = {}
    for full in filled:
        r = max(
            difflib.SequenceMatcher(None, key, full).ratio(),
            difflib.SequenceMatcher(None, parts[-1], full.split(".")[-1]).ratio(),
        )
        score[full] = r + 0.01 * full.startswith(".".join(parts[:-1]) + ".")  # same section wins a tie
    best = max(score, key=score.__getitem__)
    return best if score[best] >= 0.75 else None


def unknown_keys(key: str, value: Any, known: str) -> list[str]:
    """The one-line errors of the unknown dotted ``key`` set to ``value``; ``known`` (the keys of its section) closes a
    line that names no certain replacement. A mapping holding another trainer's keys (a verl section:
    ``actor_rollout_ref: {actor: {kl_loss_coef: 0.1, ...}}``) gives one line per leaf; any other mapping of one key is
    read as one dotted key (``chekpoint: {keep_last: 3}`` is ``chekpoint.keep_last``)."""
    leaves = _leaves(key, value)
    if len(leaves) > 1 and any(other_name_hint(k, _graft_leaves()) for k in leaves):
        return [_unknown(k, "") for k in leaves]
    while isinstance(value, dict) and len(value) == 1 and not is_other_name(key):
        ((sub, value),) = value.items()
        key = f"{key}.{sub}"
    return [_unknown(key, known)]


def _leaves(key: str, value: Any) -> list[str]:
    """The dotted leaf keys under ``key``: itself when ``value`` is no mapping or ``key`` is another trainer's name."""
    if not isinstance(value, dict) or not value or is_other_name(key):
        return [key]
    return [leaf for sub, v in value.items() for leaf in _leaves(f"{key}.{sub}", v)]


def _unknown(key: str, known: str) -> str:
    """One unknown key's line: another trainer's name gets graft's key (or is said to have none, and a graft key of
    the same last name is suggested beside), a misspelt key its nearest valid one."""
    hint, near, leaf = other_name_hint(key, _graft_leaves()), nearest_key(key), key.rsplit(".", 1)[-1]
    if hint and near and near.endswith(f".{leaf}") and f".{leaf}" not in hint:  # TRL's delta; graft's exchange.delta
        hint += f"; graft's own {leaf} is {near}"
    if hint:
        return f"{key}: unknown config key; {hint}"
    return f"{key}: unknown config key" + (f"; did you mean {near}?" if near else "") + (f" ({known})" if known else "")


@functools.cache
def _graft_leaves() -> set[str]:
    """The last part of every graft key (``lr``, ``clip_high``, ``n``)."""
    return {t.rsplit(".", 1)[-1] for t in key_templates()}
