"""Every choice is written once, where it is implemented (``@REGISTRY.register("name")``): a config field that takes a
choice is ``Annotated[str, REGISTRY]`` and the code looks the name up in the same registry, so a name registered
from here is both accepted by the config and run, with no other edit."""
from __future__ import annotations

import typing

import pytest
import torch

from graft.algos.gating import gate
from graft.algos.losses import aggregate
from graft.algos.selection import balanced_targets, resolve_conflicts
from graft.config import Config, ConfigError, load_config
from graft.config.checks import field_types, registry_of
from graft.config.show import sections
from graft.registry import BALANCES, Registry, registries

TWO = ["models=[{name: A, path: a}, {name: B, path: b}]"]


def _leaves() -> list[tuple[str, str, typing.Any]]:
    """``(section, field, type hint)`` of every field of the config tree that is not itself a section."""
    out = []
    for cls in sections(Config):
        for name, hint in field_types(cls).items():
            inner = typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint
            if not (isinstance(inner, type) and inner in sections(Config)):
                out.append((cls.__name__, name, hint))
    return out


def _choice_registry(hint: typing.Any) -> Registry | None:
    for h in (hint, *typing.get_args(hint)):
        registry = registry_of(h)
        if registry is not None:
            return registry
    return None


def _literals(hint: typing.Any) -> bool:
    return typing.get_origin(hint) is typing.Literal or any(_literals(a) for a in typing.get_args(hint))


def test_every_choice_field_takes_the_names_of_a_registry():
    """No field of the config tree spells its choices out (a ``Literal``); every one that takes a choice names the
    registry its implementations register in, and that registry's names are what its source registers."""
    literal = [f"{c}.{n}" for c, n, h in _leaves() if _literals(h)]
    assert not literal, f"choice fields not taken from a registry: {literal}"
    choices = {f"{c}.{n}": _choice_registry(h) for c, n, h in _leaves() if _choice_registry(h) is not None}
    assert len(choices) >= 14, sorted(choices)
    for key, registry in choices.items():
        assert list(registry) == registry.scanned(), key       # no name registered outside its home's source
        for name in registry:
            registry[name]  # every name imports to its implementation


def test_every_registry_names_its_objects():
    for symbol, registry in registries().items():
        for name in registry:
            obj = registry[name]
            if hasattr(obj, "__dict__") and not isinstance(obj, type(registry)):
                assert getattr(obj, "name", None) in registry and registry[obj.name] is obj, (symbol, name)


def test_an_unknown_name_is_refused_by_the_config_and_by_the_implementation():
    with pytest.raises(ConfigError, match=r"^exchange.balance: 'minimum' is not one of min, none, asymmetric$"):
        load_config(None, [*TWO, "exchange.balance=minimum"])
    with pytest.raises(ConfigError, match=r"^logging.report_to(\.0)?: .*tensorboard, wandb, mlflow"):
        load_config(None, [*TWO, "logging.report_to=[neptune]"])
    with pytest.raises(ValueError, match="unknown balance 'minimum'; valid: min, none, asymmetric"):
        balanced_targets(3, 1, "minimum")
    with pytest.raises(ValueError, match="unknown conflict rule 'x'; valid: most_successes, most_compatible, model_order"):
        resolve_conflicts(torch.ones(2, 1, dtype=torch.bool), torch.ones(2, 1), torch.ones(2, 1), "x")


def test_the_tables_give_what_the_branches_gave():
    assert balanced_targets(5, 2, "min") == (2, 2) and balanced_targets(5, 2, "none") == (5, 2)
    assert balanced_targets(9, 2, "asymmetric", ratio=2.0, floor=1) == (5, 2)
    keep, k, s = torch.ones(3, 1, dtype=torch.bool), torch.tensor([[2.], [3.], [3.]]), torch.tensor([[.9], [.1], [.2]])
    assert resolve_conflicts(keep, k, s, "most_successes")[:, 0].tolist() == [False, False, True]
    assert resolve_conflicts(keep, k, s, "most_compatible")[:, 0].tolist() == [True, False, False]
    assert resolve_conflicts(keep, k, s, "model_order")[:, 0].tolist() == [True, False, False]
    scores = torch.tensor([0.5, 0.9, 1.4])
    admitted, w, _ = gate(scores, 0.8, cap=1.0)
    assert admitted.tolist() == [False, True, True] and w.tolist() == pytest.approx([0.0, 0.9, 1.0])
    admitted, w, _ = gate(scores, 0.8, admission="all", weighting="none")
    assert admitted.all() and w.tolist() == [1.0, 1.0, 1.0]
    loss, mask = torch.tensor([[1., 2., 3.], [4., 0., 0.]]), torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert float(aggregate(loss, mask, "token-mean")) == pytest.approx(10 / 4)
    assert float(aggregate(loss, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)


def halve(size_ab: int, size_ba: int, ratio: float, floor: int) -> tuple[int, int]:
    """A toy balance rule: half of each direction's candidates."""
    return size_ab // 2, size_ba // 2


def test_a_balance_rule_registered_here_is_a_config_choice_and_runs():
    BALANCES.register("halve", halve)
    try:
        cfg = load_config(None, [*TWO, "exchange.balance=halve"])
        assert cfg.exchange.balance == "halve"
        assert balanced_targets(6, 3, cfg.exchange.balance) == (3, 1)
    finally:
        BALANCES.unregister("halve")
    with pytest.raises(ConfigError, match="exchange.balance: 'halve' is not one of"):
        load_config(None, [*TWO, "exchange.balance=halve"])
