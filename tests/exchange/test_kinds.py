"""One place decides which exchange runs (graft.exchange.kinds); every kind is called the same way and
describes itself; a new kind is one class plus its registry line."""
from __future__ import annotations

from dataclasses import replace

import pytest

from graft.config import load_config
from graft.exchange.kinds import (Exchange, ExchangeDescription, describe_exchange, exchange_kind, make_exchange)
from graft.registry import EXCHANGES
from graft.trainer import loop
from graft.types import ExchangeResult
from tests.trainer.helpers import crafted_rewards, params, tiny_config

TWO = ["models=[{name: A, path: a}, {name: B, path: b}]"]
ONE = ["models=[{name: A, path: a}]"]


@pytest.mark.parametrize("overrides, kind, method", [
    (TWO, "live", "GRAFT"),
    ([*TWO, "exchange.mode=grpo"], "none", "GRPO"),
    ([*TWO, "update.rule=hacpo"], "hacpo", "HACPO"),
    ([*TWO, "update.rule=luffy"], "live", "GRAFT"),           # LUFFY changes the loss, not who trains on what
    ([*ONE, "peer.source=store", "peer.store_path=s"], "stored", "GRAFT (stored peer)"),
    ([*TWO, "exchange.mode=grpo", "update.rule=hacpo"], "none", "GRPO"),   # grpo: nothing is shared, whatever the rule
])
def test_the_three_settings_decide_the_kind(overrides, kind, method):
    cfg = load_config(None, overrides)
    assert exchange_kind(cfg) == kind
    desc = describe_exchange(cfg)
    assert (desc.kind, desc.method) == (kind, method)
    assert desc.lines()[0].startswith(f"exchange: {method} -- ")


def test_hacpo_states_the_settings_it_replaces():
    # HACPO shares every response: the configured gate (delta 0.8, admission gate) is not used. The description
    # says so, field by field, instead of a model card claiming delta = 0.8.
    desc = describe_exchange(load_config(None, [*TWO, "update.rule=hacpo"]))
    assert desc.replaced["exchange.delta"] == (0.8, 0.0)
    assert desc.replaced["exchange.admission"] == ("gate", "all")
    assert desc.settings["exchange.delta"] == 0.0
    assert "exchange.weighting" not in desc.replaced            # compat either way
    assert any("exchange.delta = 0.0 (configured 0.8: not used by HACPO)" in line for line in desc.lines())
    live = describe_exchange(load_config(None, TWO))
    assert live.replaced == {} and live.settings["exchange.delta"] == 0.8


def test_the_model_card_uses_the_description():
    from graft.export import model_card

    cfg = load_config(None, [*TWO, "update.rule=hacpo"])
    card = model_card(cfg, cfg.models[0], 3, "run", "float32", [], None)
    assert "# A after 3 steps of HACPO" in card
    assert "`exchange.delta` = 0 in force (configured 0.8: HACPO does not use it)" in card
    assert "| exchange.delta | 0 |" in card
    grpo = load_config(None, [*TWO, "exchange.mode=grpo"])
    card = model_card(grpo, grpo.models[0], 3, "run", "float32", [], None)
    assert "steps of GRPO" in card and "exchange.delta" not in card


class Silence(Exchange):
    """A toy kind: every model trains on its own groups with every advantage set to 0 (so nothing moves)."""

    kind = "toy"
    calls: list = []

    def __call__(self, groups, step):
        self.calls.append((step, {n: len(gs) for n, gs in groups.items()}))
        train = {n: [replace(g, advantages=[0.0] * g.size) for g in gs] for n, gs in groups.items()}
        return ExchangeResult(train, metrics={"exchange/toy/silenced": sum(len(gs) for gs in groups.values())})

    @classmethod
    def describe_config(cls, cfg):
        return ExchangeDescription(cls.kind, "toy", "every model trains on its own groups with zero advantages")


def test_a_new_kind_is_one_class_and_its_registry_line(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    EXCHANGES.register("toy", Silence)
    try:
        run = loop.setup(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1"))
        try:
            run.exchange = EXCHANGES["toy"](run.cfg, run.learners, run.grade)
            before = params(run)
            m = loop.train_step(run, 1)
            after = params(run)
        finally:
            loop.close_learners(run.learners)
            run.store.close()
            run.lock.release()
    finally:
        EXCHANGES.unregister("toy")
    assert Silence.calls == [(1, {"A": 4, "B": 4})]                 # the loop hands every model's 4 groups of step 1
    assert m["exchange/toy/silenced"] == 8                          # its metrics reach the step's record
    assert m["A/tokens/update"] == 0 and m["B/tokens/update"] == 0   # and the update trains on what it returned
    assert all(bool((before[k] == after[k]).all()) for k in before)
    assert run.exchange.describe().method == "toy"
    # the run's recorded config states the exchange it resolved (the config's own kind: GRAFT, live)
    assert (run.run_dir / "config.yaml").read_text().startswith("# exchange: GRAFT -- whole groups among A, B")
    assert "toy" not in EXCHANGES


def test_make_exchange_builds_the_registered_kind(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "update.rule=hacpo")
    ex = make_exchange(cfg, {}, lambda groups: None)
    assert type(ex) is EXCHANGES["hacpo"] and ex.describe().method == "HACPO"
    assert set(ex.state_dict()["rates"]) == {"A", "B"}
