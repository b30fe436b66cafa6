"""``exchange.kind`` names the exchange (graft.exchange.kinds): every kind checks its own settings when the config
loads, states the settings it actually uses, is called the same way, and a new kind is one class registered by
name -- selectable with ``exchange.kind`` and nothing else."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from graft.config import ConfigError, load_config, upgrade_tree
from graft.exchange.kinds import Exchange, describe_exchange, exchange_kind, hands_over, make_exchange
from graft.registry import EXCHANGES
from graft.trainer import loop
from graft.types import ExchangeResult
from tests.trainer.helpers import crafted_rewards, params, tiny_config

TWO = ["models=[{name: A, path: a}, {name: B, path: b}]"]
ONE = ["models=[{name: A, path: a}]"]
HACPO = [*TWO, "exchange.kind=hacpo", "update.rule=hacpo"]


@pytest.mark.parametrize("overrides, kind, method", [
    (TWO, "live", "GRAFT"),
    ([*TWO, "exchange.kind=none"], "none", "GRPO"),
    (HACPO, "hacpo", "HACPO"),
    ([*TWO, "update.rule=luffy"], "live", "GRAFT"),           # LUFFY changes the loss, not who trains on what
    ([*ONE, "exchange.kind=stored", "peer.store_path=s"], "stored", "GRAFT (stored peer)"),
])
def test_exchange_kind_names_the_exchange(overrides, kind, method):
    cfg = load_config(None, overrides)
    assert exchange_kind(cfg) == cfg.exchange.kind == kind
    desc = describe_exchange(cfg)
    assert (desc.kind, desc.method) == (kind, method)
    assert desc.lines()[0].startswith(f"exchange: {method} -- ")
    assert hands_over(cfg) == (kind != "none")


@pytest.mark.parametrize("overrides, kind", [
    ([*TWO, "exchange.mode=grpo"], "none"),
    ([*TWO, "exchange.mode=graft"], "live"),
    ([*ONE, "peer.source=store", "peer.store_path=s"], "stored"),
])
def test_the_keys_of_earlier_versions_still_load_with_a_notice(overrides, kind, capsys):
    assert load_config(None, overrides).exchange.kind == kind
    notice, = capsys.readouterr().err.strip().splitlines()
    assert notice.startswith("notice: ") and f"exchange.kind={kind}" in notice


@pytest.mark.parametrize("saved, kind", [
    ({"exchange": {"mode": "graft"}, "peer": {"source": "live"}, "update": {"rule": "graft"}}, "live"),
    ({"exchange": {"mode": "grpo"}, "peer": {"source": "live"}, "update": {"rule": "graft"}}, "none"),
    ({"exchange": {"mode": "graft"}, "peer": {"source": "live"}, "update": {"rule": "hacpo"}}, "hacpo"),
    ({"exchange": {"mode": "graft"}, "peer": {"source": "store"}, "update": {"rule": "graft"}}, "stored"),
    ({"update": {"rule": "hacpo"}}, "hacpo"),                   # configs/baselines/hacpo.yaml of before
])
def test_a_saved_config_of_before_runs_the_exchange_it_ran(saved, kind):
    notices = upgrade_tree(saved)
    assert saved["exchange"]["kind"] == kind and "mode" not in saved["exchange"]
    assert "source" not in saved.get("peer", {}) and len(notices) == 1


def test_every_committed_run_config_still_loads():
    root = Path(__file__).resolve().parents[2] / "results"
    configs = sorted(root.glob("**/config.yaml"))
    if not configs:
        pytest.skip("no committed runs")
    kinds = {exchange_kind(load_config(p)) for p in configs}
    assert kinds <= set(EXCHANGES)


@pytest.mark.parametrize("overrides, message", [
    ([*TWO, "exchange.kind=hacpo"], "update.rule: exchange.kind=hacpo trains with update.rule=hacpo, got 'graft'"),
    ([*TWO, "update.rule=hacpo"], "update.rule: hacpo runs with its own exchange, exchange.kind=hacpo (got exchange.kind=live)"),
    ([*ONE, "exchange.kind=hacpo", "update.rule=hacpo"], "models: exchange.kind=hacpo trains exactly 2 model(s), got 1"),
    (ONE, "models: exchange.kind=live trains at least 2 model(s), got 1"),
    ([*TWO, "exchange.kind=stored", "peer.store_path=s"], "models: exchange.kind=stored trains exactly 1 model(s), got 2"),
    ([*ONE, "exchange.kind=stored"], "peer.store_path: is required with exchange.kind=stored"),
    ([*TWO, "exchange.kind=grpo"], "exchange.kind: 'grpo' is not one of none, live, stored, hacpo"),
])
def test_each_kind_checks_its_own_settings_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert str(e.value) == message


def test_hacpo_states_the_settings_it_overrides():
    # HACPO shares every response and aggregates seq-mean-token-mean: the configured gate (delta 0.8, admission gate)
    # and update.loss_agg (token-mean) are not what trains. The description says so, field by field.
    desc = describe_exchange(load_config(None, HACPO))
    assert desc.replaced["exchange.delta"] == (0.8, 0.0)
    assert desc.replaced["exchange.admission"] == ("gate", "all")
    assert desc.replaced["update.loss_agg"] == ("token-mean", "seq-mean-token-mean")
    assert desc.settings["exchange.delta"] == 0.0 and desc.settings["update.loss_agg"] == "seq-mean-token-mean"
    assert "exchange.weighting" not in desc.replaced            # compat either way
    lines = desc.lines()
    assert "  exchange.delta = 0.0 (configured 0.8: overridden by hacpo)" in lines
    assert "  update.loss_agg = 'seq-mean-token-mean' (configured 'token-mean': overridden by hacpo)" in lines
    assert lines[-1].startswith("  effective: exchange.delta=0.0, ")
    live = describe_exchange(load_config(None, TWO))
    assert live.replaced == {} and live.settings["exchange.delta"] == 0.8
    assert live.settings["update.loss_agg"] == "token-mean"
    # a setting configured as the kind uses it is no override
    same = describe_exchange(load_config(None, [*HACPO, "update.loss_agg=seq-mean-token-mean"]))
    assert "update.loss_agg" not in same.replaced


def test_the_model_card_uses_the_description():
    from graft.commands.export import model_card

    cfg = load_config(None, HACPO)
    card = model_card(cfg, cfg.models[0], 3, "run", "float32", [], None)
    assert "# A after 3 steps of HACPO" in card
    assert "`exchange.delta` = 0 in force (configured 0.8: overridden by hacpo)" in card
    assert "| exchange.delta | 0 |" in card
    assert "| update.loss_agg | seq-mean-token-mean |" in card
    grpo = load_config(None, [*TWO, "exchange.kind=none"])
    card = model_card(grpo, grpo.models[0], 3, "run", "float32", [], None)
    assert "steps of GRPO" in card and "exchange.delta" not in card


class Silence(Exchange):
    """A toy kind: every model trains on its own groups with every advantage set to 0 (so nothing moves)."""

    kind, method, models = "toy", "toy", (2, 2)
    calls: list = []

    def __call__(self, groups, step):
        self.calls.append((step, {n: len(gs) for n, gs in groups.items()}))
        train = {n: [replace(g, advantages=[0.0] * g.size) for g in gs] for n, gs in groups.items()}
        return ExchangeResult(train, metrics={"exchange/toy/silenced": sum(len(gs) for gs in groups.values())})

    @classmethod
    def summary(cls, cfg):
        return "every model trains on its own groups with zero advantages"


def test_a_kind_registered_here_is_selected_by_exchange_kind(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    EXCHANGES.register("toy", Silence)
    try:
        with pytest.raises(ConfigError, match=r"^models: exchange.kind=toy trains exactly 2 model\(s\), got 1$"):
            load_config(None, [*ONE, "exchange.kind=toy"])   # its own check runs at load time
        run = loop.setup(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1", "exchange.kind=toy"))
        try:
            before = params(run)
            m = loop.train_step(run, 1)
            after = params(run)
        finally:
            loop.close_learners(run.learners)
            run.store.close()
            run.lock.release()
    finally:
        EXCHANGES.unregister("toy")
    assert type(run.exchange) is Silence
    assert Silence.calls == [(1, {"A": 4, "B": 4})]                 # the loop hands every model's 4 groups of step 1
    assert m["exchange/toy/silenced"] == 8                          # its metrics reach the step's record
    assert m["A/tokens/update"] == 0 and m["B/tokens/update"] == 0   # and the update trains on what it returned
    assert all(bool((before[k] == after[k]).all()) for k in before)
    # the run's recorded config states the exchange it ran, and its settings
    text = (run.run_dir / "config.yaml").read_text()
    assert text.startswith("# exchange: toy -- every model trains on its own groups with zero advantages\n")
    assert "#   effective: update.rule='graft', update.loss_agg='token-mean'\n" in text
    assert "toy" not in EXCHANGES


def test_make_exchange_builds_the_registered_kind(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "exchange.kind=hacpo", "update.rule=hacpo")
    ex = make_exchange(cfg, {}, lambda groups: None)
    assert type(ex) is EXCHANGES["hacpo"] and ex.describe().method == "HACPO"
    assert set(ex.state_dict()["rates"]) == {"A", "B"}


def test_a_hacpo_run_records_its_effective_settings_in_its_folder_and_model_card(tmp_path, tiny_llama_dir,
                                                                                 tiny_gemma_dir, monkeypatch):
    from graft.commands.cli import main

    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1", "exchange.kind=hacpo", "update.rule=hacpo")
    loop.train(cfg)
    run_dir = Path(cfg.run_dir)
    head = [line for line in (run_dir / "config.yaml").read_text().splitlines() if line.startswith("#")]
    assert head[0].startswith("# exchange: HACPO -- ")
    assert "#   exchange.delta = 0.0 (configured 0.8: overridden by hacpo)" in head
    assert "#   update.loss_agg = 'seq-mean-token-mean' (configured 'token-mean': overridden by hacpo)" in head
    assert any(line.startswith("#   effective: exchange.delta=0.0, ") and
               line.endswith("update.rule='hacpo', update.loss_agg='seq-mean-token-mean'") for line in head)
    again = load_config(run_dir / "config.yaml")                   # the comments do not change what loads
    assert (again.exchange.kind, again.exchange.delta, again.update.loss_agg) == ("hacpo", 0.8, "token-mean")
    out = tmp_path / "exported"
    assert main(["export", str(run_dir), "--model", "A", str(out)]) == 0
    card = (out / "README.md").read_text()
    assert "`exchange.delta` = 0 in force (configured 0.8: overridden by hacpo)" in card
    assert "`update.loss_agg` = seq-mean-token-mean in force (configured token-mean: overridden by hacpo)" in card
    assert "| update.loss_agg | seq-mean-token-mean |" in card
