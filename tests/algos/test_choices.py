"""Every choice list is written once, in graft/registry.py next to the function or class that implements each name:
the config's ``Literal`` choices are built from those registries and the code looks the name up there, so a name
registered from here is both accepted by the config and run, with no other edit."""
from __future__ import annotations

import typing

import pytest
import torch

from graft.algos.gating import gate
from graft.algos.losses import aggregate
from graft.algos.selection import balanced_targets, resolve_conflicts
from graft.config import ConfigError, ExchangeConfig, LoggingConfig, UpdateConfig, load_config
from graft.registry import ADMISSIONS, BALANCES, CONFLICTS, LOSS_AGGS, TRACKERS, WEIGHTINGS

TWO = ["models=[{name: A, path: a}, {name: B, path: b}]"]


def _choices(cls: type, name: str) -> tuple:
    hint = typing.get_type_hints(cls)[name]
    while typing.get_origin(hint) is not typing.Literal:   # list[Literal[...]]
        hint, = typing.get_args(hint)
    return typing.get_args(hint)


@pytest.mark.parametrize("cls, name, registry", [
    (ExchangeConfig, "balance", BALANCES), (ExchangeConfig, "conflict", CONFLICTS),
    (ExchangeConfig, "admission", ADMISSIONS), (ExchangeConfig, "weighting", WEIGHTINGS),
    (UpdateConfig, "loss_agg", LOSS_AGGS), (LoggingConfig, "report_to", TRACKERS),
])
def test_the_config_choices_are_the_registry_names(cls, name, registry):
    assert _choices(cls, name) == tuple(registry)
    for impl in registry:
        assert callable(registry[impl]), impl                  # every name imports to its implementation


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
