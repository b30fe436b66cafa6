"""How the config reports what is wrong: :class:`ConfigError` (one ``field: reason`` line), several at once
(:class:`ConfigErrors`), and :func:`check`, the one way a section states an invariant."""

from __future__ import annotations

import contextvars
import typing
from typing import Any, Callable

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
"""While :func:`build` runs a dataclass's ``__post_init__``: the invariants found broken so far (:func:`_check`
records each and lets the checks after it run); outside it, ``None`` and a broken invariant raises at once."""


def check(ok: bool, field: str, reason: str) -> None:
    if not ok:
        broken = BROKEN.get()
        if broken is None:
            raise FieldError(field, reason)
        broken.append(FieldError(field, reason))


_Cls = typing.TypeVar("_Cls", bound=type)
CHOICES: dict[str, Registry] = {}
"""``Class.field`` -> the registry whose names the field takes (filled by :func:`registry_choices`)."""


def registry_choices(**registries: Registry) -> Callable[[_Cls], _Cls]:
    """Field -> the registry whose names it takes (``engine=ENGINES``): its runtime type hint becomes a ``Literal``
    of the names (``list`` of it for a field declared ``list[str]``).

    A registry's names are known only when the hints are read (a plugin or a test may register more after import),
    and a static type checker cannot read a ``Literal`` built from them. So the class body declares such a field as
    ``str`` or ``list[str]`` (what a type checker sees), and this replaces its annotation by a text evaluated in this
    module like every other annotation here (``from __future__ import annotations``): ``typing.get_type_hints``
    (:func:`build`, :func:`field_hint`, the docs) builds the ``Literal`` from the registry as it is at that moment.
    Apply it above ``@dataclass``."""

    def apply(cls: _Cls) -> _Cls:
        for name, registry in registries.items():
            declared = cls.__annotations__.get(name)
            if declared not in ("str", "list[str]"):
                raise TypeError(f"{cls.__name__}.{name} must be declared str or list[str], not {declared!r}")
            key = f"{cls.__name__}.{name}"
            CHOICES[key] = registry
            hint = f"Literal[tuple(CHOICES[{key!r}])]"
            cls.__annotations__[name] = hint if declared == "str" else f"list[{hint}]"
        return cls

    return apply
