"""How the config reports what is wrong: :class:`ConfigError` (one ``field: reason`` line), several at once
(:class:`ConfigErrors`), :func:`check`, the one way a section states an invariant, and :func:`registry_of`, how a
field takes its choices from a registry."""

from __future__ import annotations

import contextvars
import typing
from typing import Annotated, Any, Callable

from graft.errors import UserError
from graft.registry import Registry


class ConfigError(UserError, ValueError):
    """A configuration that cannot run; the message says which field and why."""


class FieldError(ConfigError):
    """A broken invariant of one dataclass; ``field`` is relative to it. :func:`build` prefixes
    the dotted path of the dataclass (``lr`` of ``models.0`` -> ``models.0.lr``)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


class ConfigErrors(ConfigError):
    """Every error found while loading one config: :func:`build` checks each field and section even after one
    fails. Its text is one ``field: reason`` line per error (``graft`` prints each after ``error:``)."""

    def __init__(self, errors: list[ConfigError]):
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors


def each(check: Any, items: Any) -> list:
    """``check(*item)`` for every item, in order; when any raise :class:`ConfigError`, all of their errors are raised
    together (one as itself, several as :class:`ConfigErrors`)."""
    out, errors = [], []
    for item in items:
        try:
            out.append(check(*item))
        except ConfigError as e:
            errors += e.errors if isinstance(e, ConfigErrors) else [e]
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    return out


BROKEN: contextvars.ContextVar[list[ConfigError] | None] = contextvars.ContextVar("graft_config_broken", default=None)
"""While :func:`build` runs a dataclass's ``__post_init__``: the invariants found broken so far (:func:`check`
records each and lets the checks after it run); outside it, ``None`` and a broken invariant raises at once."""


def check(ok: bool, field: str, reason: str) -> None:
    if not ok:
        broken = BROKEN.get()
        if broken is None:
            raise FieldError(field, reason)
        broken.append(FieldError(field, reason))


def field_types(cls: Any) -> dict[str, Any]:
    """The type hints of a section's fields as declared, each choice's registry kept (``Annotated[str, REGISTRY]``:
    :func:`registry_of`)."""
    return typing.get_type_hints(cls, include_extras=True)


def registry_of(hint: Any) -> Registry | None:
    """The registry whose names a field of type ``hint`` takes (``Annotated[str, ENGINES]`` -> ``ENGINES``), else
    None. The names are read when a value is checked, so a variant registered after import is a choice too."""
    if typing.get_origin(hint) is not Annotated:
        return None
    return next((m for m in typing.get_args(hint)[1:] if isinstance(m, Registry)), None)


def check_choices(section: Any) -> None:
    """:func:`check` every choice field of a section built in code (the loader checks them before the section is
    built): a name, or each name of a list, that its registry holds."""
    for name, hint in field_types(type(section)).items():
        value = getattr(section, name)
        registry = registry_of(typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint)
        if registry is not None:
            for item in value if isinstance(value, list) else [value]:
                check(item in registry, name, f"{item!r} is not one of {registry.choices()}")


class Sections:
    """The marker of a field that holds one settings section per entry of ``registry`` that has ``settings`` (a
    dataclass): ``tasks: Annotated[dict[str, Any], Sections(TASKS)]``. A config file writes each section under the
    entry's own name in the field's place (``data.arithmetic``, ``data.code_task``), so a variant registered with
    settings of its own brings its section with it (:func:`members`)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def classes(self) -> dict[str, type]:
        """Entry name -> its settings dataclass, in the registry's order."""
        entries = {name: self.registry[name] for name in self.registry}
        return {name: e.settings for name, e in entries.items() if getattr(e, "settings", None) is not None}

    def defaults(self) -> dict[str, Any]:
        return {name: cls() for name, cls in self.classes().items()}


def sections_of(hint: Any) -> Sections | None:
    """The :class:`Sections` marker of a field of type ``hint``, else None."""
    if typing.get_origin(hint) is not Annotated:
        return None
    return next((m for m in typing.get_args(hint)[1:] if isinstance(m, Sections)), None)


def members(cls: Any) -> dict[str, Any]:
    """The keys of a section as a config file writes them -> their type hints: its fields, in order, a field marked
    :class:`Sections` replaced in its place by one key per settings section."""
    out: dict[str, Any] = {}
    for name, hint in field_types(cls).items():
        marker = sections_of(hint)
        out |= {name: hint} if marker is None else marker.classes()
    return out


def member_values(section: Any) -> dict[str, Any]:
    """The values of :func:`members` of a built section."""
    out: dict[str, Any] = {}
    for name, hint in field_types(type(section)).items():
        value = getattr(section, name)
        out |= {name: value} if sections_of(hint) is None else dict(value)
    return out


def grouped(cls: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` keyed by :func:`members` as keyword arguments of ``cls``: each settings section moved into its
    :class:`Sections` field, the sections not given at their defaults."""
    out = dict(kwargs)
    for name, hint in field_types(cls).items():
        marker = sections_of(hint)
        if marker is not None:
            out[name] = {k: out.pop(k) if k in out else c() for k, c in marker.classes().items()}
    return out


class Accepts:
    """The marker of a field that also takes a Python object built in code, not only what a file can write
    (``train: str | Annotated[Any, Accepts(is_rows, "an in-memory dataset ...")]``): ``test(value)`` says whether a
    value is one, ``words`` what it is (in messages, ``graft config show`` and the configuration reference)."""

    def __init__(self, test: Callable[[Any], bool], words: str) -> None:
        self.test, self.words = test, words


def accepts_of(hint: Any) -> Accepts | None:
    """The :class:`Accepts` marker of a field of type ``hint``, else None."""
    if typing.get_origin(hint) is not Annotated:
        return None
    return next((m for m in typing.get_args(hint)[1:] if isinstance(m, Accepts)), None)
