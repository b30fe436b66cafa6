"""``exchange.pairing``: which peers a receiver draws from (graft.exchange.pairing), on crafted rewards.

Hand-worked case (the prompts of tests/exchange/test_exchange_n.py; n = 4; every receiver scores every token at
log-prob -1, so s(S -> R) = exp(-1 - gen_S) depends on the source's generation log-prob only):

    prompt        p0  p1  p2  p3  p4
    k_A            3   0   1   0   0        gen_A = -0.9  ->  s(A -> *) = exp(-0.1) = 0.905
    k_B            0   2   0   0   0        gen_B = -1.1  ->  s(B -> *) = exp(+0.1) = 1.105
    k_C            2   0   0   1   1        gen_C = -1.0  ->  s(C -> *) = 1

Balanced selections (test_exchange_n.py): A->B {p0}, B->A {p1}, A->C {p2}, C->A {p3, p4}, B->C {p1}, C->B {p0}.

complementary (solved = R's all-fail prompts with k_S >= 1):
    R = A fails p1 p3 p4:     B solves p1 -> 1;       C solves p3 p4 -> 2       => C
    R = B fails p0 p2 p3 p4:  A solves p0 p2 -> 2;    C solves p0 p3 p4 -> 3    => C
    R = C fails p1 p2:        A solves p2 -> 1;       B solves p1 -> 1          => A (tie: the earlier model)
compatible (median s of the responses handed this step):
    R = A:  B (p1: 4 x 1.105) 1.105;  C (p3, p4: 8 x 1) 1.0    => B
    R = B:  A (p0) 0.905;             C (p0) 1.0               => C
    R = C:  A (p2) 0.905;             B (p1) 1.105             => B
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import pytest
import torch

from graft.config import ConfigError, ExchangeConfig, load_config
from graft.exchange.handover import Scoring
from graft.exchange.kinds import LiveExchange, describe_exchange
from graft.exchange.live import exchange_live
from graft.exchange.pairing import ChoosePeer, PairingWindow, best, decide, pair_compatible, pair_complementary
from graft.files import dumps_json
from graft.registry import PAIRINGS
from tests.exchange.test_exchange import FakeReceiver, group

N = 4
K = {"A": [3, 0, 1, 0, 0], "B": [0, 2, 0, 0, 0], "C": [2, 0, 0, 1, 1]}
GEN = {"A": -0.9, "B": -1.1, "C": -1.0}
RECEIVERS = {m: FakeReceiver(m) for m in "ABC"}
THREE = ["models=[{name: A, path: a}, {name: B, path: b}, {name: C, path: c}]"]
TWO = ["models=[{name: A, path: a}, {name: B, path: b}]"]


def groups(k=K, order=("A", "B", "C")):
    return {m: [group(m, f"p{i}", [1.0] * x + [0.0] * (N - x), [GEN[m]] * N) for i, x in enumerate(k[m])] for m in order}


def run(pairing="all", k=K, order=("A", "B", "C"), window=None, **kw):
    ex = ExchangeConfig(pairing=pairing, **kw)
    return exchange_live(1, groups(k, order), RECEIVERS, N, ex, Scoring(), lambda gs: None, window=window, threshold=0.5)


def rec(res, s, r):
    return next(a for a in res.audit if a["source"] == s and a["receiver"] == r)


def peers_of(res, r):
    return sorted((g.prompt_id, g.source) for g in res.train_groups[r] if g.is_peer)


# ------------------------------------------------------------------ the pure rules
def test_best_takes_the_highest_and_the_first_of_a_tie():
    assert best(torch.tensor([1.0, 3.0, 2.0])).tolist() == [False, True, False]
    assert best(torch.tensor([2.0, 2.0, 1.0])).tolist() == [True, False, False]
    assert best(torch.tensor([-math.inf, -math.inf])).tolist() == [True, False]   # no evidence at all: the first


def test_complementary_sums_the_window():
    # solved Int[W=2, S=2]: [[1, 3], [2, 0]] -> sums [3, 3]: a tie, the first peer
    chosen, scores = pair_complementary(torch.tensor([[1, 3], [2, 0]]), [torch.zeros(0)] * 2)
    assert chosen.tolist() == [True, False] and scores == [3.0, 3.0]
    # [[1, 3], [1, 1]] -> [2, 4]: the second
    chosen, scores = pair_complementary(torch.tensor([[1, 3], [1, 1]]), [torch.zeros(0)] * 2)
    assert chosen.tolist() == [False, True] and scores == [2.0, 4.0]


def test_compatible_takes_the_highest_median_and_skips_a_peer_without_evidence():
    s = [torch.tensor([0.2, 0.9, 0.5]),   # median 0.5
         torch.tensor([0.6, 0.7]),        # median (0.6 + 0.7) / 2 = 0.65 (interpolated, like s_p50)
         torch.zeros(0)]                  # nothing handed: -inf, recorded None
    chosen, scores = pair_compatible(torch.zeros(1, 3, dtype=torch.long), s)
    assert chosen.tolist() == [False, True, False]
    assert scores[0] == pytest.approx(0.5) and scores[1] == pytest.approx(0.65) and scores[2] is None


def every_peer(solved: torch.Tensor, s: list[torch.Tensor]) -> tuple[torch.Tensor, list[float | None]]:
    """A scoring rule that chooses every peer, unscored."""
    return torch.ones(solved.shape[1], dtype=torch.bool), [None] * solved.shape[1]


def test_all_chooses_every_peer_and_records_nothing():
    window = PairingWindow(2)
    chosen, records = PAIRINGS["all"].choose(window, list("ABC"), {})
    assert chosen == {"A": ["B", "C"], "B": ["A", "C"], "C": ["A", "B"]} and records == {} and window.steps == {}
    assert PAIRINGS["all"].state(window) == {} and PAIRINGS["all"].settings == ()


def test_the_window_remembers_and_forgets():
    # receiver A, peers B and C, window 2; solved per step (B, C): (0, 3), (2, 0), (2, 0)
    #   step 1: B 0, C 3 -> C.   step 2: B 0+2 = 2, C 3+0 = 3 -> C (step 2 alone would say B).
    #   step 3: step 1 leaves the window: B 2+2 = 4, C 0+0 = 0 -> B.
    window, want = PairingWindow(2), ["C", "C", "B"]
    for (b, c), w in zip([(0, 3), (2, 0), (2, 0)], want, strict=True):
        ev = {(s, r): {"solved": 0, "s": []} for s in "ABC" for r in "ABC" if s != r}
        ev["B", "A"], ev["C", "A"] = {"solved": b, "s": []}, {"solved": c, "s": []}
        chosen, records = decide(pair_complementary, "complementary", window, list("ABC"), ev)
        assert chosen["A"] == [w]
    assert records["B", "A"]["score"] == 4.0 and records["C", "A"]["score"] == 0.0
    restored = PairingWindow(2)
    restored.load_state_dict(json.loads(json.dumps(window.state_dict())))   # what a checkpoint keeps
    for d in window.steps:
        assert list(restored.steps[d]) == list(window.steps[d])


# ------------------------------------------------------------------ through the live exchange
def test_all_writes_nothing_new():
    res = run("all")
    assert all("pairing" not in a for a in res.audit)
    assert not any(k.endswith("/paired") or k.endswith("/pairing_score") for k in res.metrics)
    assert peers_of(res, "A") == [("p1", "B"), ("p3", "C"), ("p4", "C")]


def test_complementary_pins_the_hand_worked_choice():
    res = run("complementary")
    want = {"A": ["C"], "B": ["C"], "C": ["A"]}
    for r, chosen in want.items():
        for s in "ABC":
            if s != r:
                assert rec(res, s, r)["pairing"]["chosen"] == chosen
                assert res.metrics[f"exchange/{s}->{r}/paired"] == int(s in chosen)
    assert [rec(res, s, "B")["pairing"]["score"] for s in "AC"] == [2.0, 3.0]
    assert [rec(res, s, "C")["pairing"]["evidence"]["solved"] for s in "AB"] == [1, 1]
    # A gets p3, p4 from C (not p1 from B); B gets p0 from C (A's p0 is not paired: no conflict); C gets p2 from A
    assert peers_of(res, "A") == [("p3", "C"), ("p4", "C")]
    assert peers_of(res, "B") == [("p0", "C")]
    assert peers_of(res, "C") == [("p2", "A")]
    assert rec(res, "A", "B")["responses"] == [] and rec(res, "A", "B")["conflicts"] == []
    assert rec(res, "A", "B")["selected"] == ["p0"]            # its balanced selection, as before
    assert res.metrics["exchange/B->C/transferred"] == 0 and res.metrics["exchange/A->C/transferred"] == N


def test_compatible_pins_the_hand_worked_choice():
    res = run("compatible")
    want = {"A": ["B"], "B": ["C"], "C": ["B"]}
    for r, chosen in want.items():
        assert rec(res, next(s for s in "ABC" if s != r), r)["pairing"]["chosen"] == chosen
    assert rec(res, "B", "A")["pairing"]["score"] == pytest.approx(math.exp(0.1), rel=1e-6)
    assert rec(res, "C", "A")["pairing"]["score"] == pytest.approx(1.0)
    assert rec(res, "A", "B")["pairing"]["score"] == pytest.approx(math.exp(-0.1), rel=1e-6)
    assert len(rec(res, "C", "A")["pairing"]["evidence"]["s"]) == 2 * N   # p3, p4: every handed response
    assert peers_of(res, "A") == [("p1", "B")]
    assert peers_of(res, "B") == [("p0", "C")]
    assert peers_of(res, "C") == [("p1", "B")]


@pytest.mark.parametrize("pairing", ["complementary", "compatible"])
def test_swapping_models_swaps_decisions(pairing):
    # no ties here: compatible on K; complementary on K2, where R = A: B 3 (p1 p5 p6), C 4 (p3 p4 p5 p7) -> C;
    # R = B: A 2 (p0 p2), C 4 (p0 p3 p4 p7) -> C;  R = C: A 1 (p2), B 2 (p1 p6) -> B
    k2 = {"A": [3, 0, 1, 0, 0, 0, 0, 0], "B": [0, 2, 0, 0, 0, 1, 2, 0], "C": [2, 0, 0, 1, 1, 1, 0, 1]}
    k = k2 if pairing == "complementary" else K
    base = run(pairing, k)
    for order in itertools.permutations("ABC"):
        res = run(pairing, k, order)
        if pairing == "complementary":
            assert [rec(res, s, r)["pairing"]["chosen"] for s, r in (("B", "A"), ("A", "B"), ("A", "C"))] == [
                ["C"], ["C"], ["B"]]
        for a in base.audit:
            b = rec(res, a["source"], a["receiver"])
            assert b["pairing"]["chosen"] == a["pairing"]["chosen"] and b["pairing"]["score"] == a["pairing"]["score"]
        for m in "ABC":
            assert peers_of(res, m) == peers_of(base, m)


def test_a_tie_goes_to_the_earlier_model():
    # complementary, R = C: A and B each solve one of C's all-fail prompts -> the earlier in `models`
    assert rec(run("complementary"), "A", "C")["pairing"]["chosen"] == ["A"]
    assert rec(run("complementary", order=("B", "A", "C")), "A", "C")["pairing"]["chosen"] == ["B"]


def test_choosing_every_peer_through_the_hook_equals_all():
    """The hook with every peer chosen (a rule registered here) changes nothing but the records it adds."""
    PAIRINGS.register("every", ChoosePeer(every_peer))
    try:
        base, hooked = run("all"), run("every")
    finally:
        PAIRINGS.unregister("every")
    assert [{k: v for k, v in a.items() if k != "pairing"} for a in hooked.audit] == base.audit
    hooked_metrics = {k: v for k, v in hooked.metrics.items() if not k.endswith(("/paired", "/pairing_score"))}
    assert dumps_json(hooked_metrics) == dumps_json(base.metrics)   # NaN != NaN: compared as written
    for m in "ABC":
        assert [(g.prompt_id, g.source, g.advantages, g.weights) for g in hooked.train_groups[m]] == \
            [(g.prompt_id, g.source, g.advantages, g.weights) for g in base.train_groups[m]]


def _rederive(audit: list[dict], names: list[str]) -> None:
    """Every pairing decision from the audit log alone: window scores from the evidence of the window's steps, the
    choice from the scores (highest, ties to the earlier model)."""
    for a in audit:
        p, (s, r, t) = a["pairing"], (a["source"], a["receiver"], a["step"])
        past = [b["pairing"]["evidence"] for b in audit
                if (b["source"], b["receiver"]) == (s, r) and t - p["window"] < b["step"] <= t]
        if p["rule"] == "complementary":
            assert p["score"] == sum(e["solved"] for e in past)
        else:
            values = [x for e in past for x in e["s"]]
            want = float(torch.quantile(torch.tensor(values, dtype=torch.float64), 0.5)) if values else None
            assert p["score"] == pytest.approx(want) if values else p["score"] is None
    for t, r in {(a["step"], a["receiver"]) for a in audit}:
        recs = sorted([a for a in audit if (a["step"], a["receiver"]) == (t, r)], key=lambda a: names.index(a["source"]))
        scores = [-math.inf if a["pairing"]["score"] is None else a["pairing"]["score"] for a in recs]
        assert all(a["pairing"]["chosen"] == [recs[scores.index(max(scores))]["source"]] for a in recs), (t, r)


@pytest.mark.parametrize("pairing", ["complementary", "compatible"])
def test_decisions_rederive_from_the_audit_log(pairing):
    """Three steps with a window of 2 over shifting rewards; the audit lines as written to audit.jsonl."""
    ks = [K, {"A": [0, 0, 1, 0, 4], "B": [0, 3, 0, 1, 0], "C": [1, 0, 0, 0, 0]},
          {"A": [0, 0, 0, 2, 0], "B": [1, 0, 2, 0, 0], "C": [0, 1, 0, 0, 3]}]
    window, audit = PairingWindow(2), []
    for step, k in enumerate(ks):
        ex = ExchangeConfig(pairing=pairing, pairing_window=2)
        res = exchange_live(step, groups(k), RECEIVERS, N, ex, Scoring(), lambda gs: None, window=window, threshold=0.5)
        audit += [json.loads(dumps_json(a)) for a in res.audit]
    _rederive(audit, list("ABC"))


# ------------------------------------------------------------------ the config
@pytest.mark.parametrize("overrides, message", [
    ([*THREE, "exchange.pairing=best"], "exchange.pairing: 'best' is not one of all, complementary, compatible"),
    ([*THREE, "exchange.pairing_window=0"], "exchange.pairing_window: must be >= 1, got 0"),
    ([*TWO, "exchange.pairing=complementary"], "exchange.pairing: complementary chooses among a receiver's peers, "
                                               "but with 2 models each receiver has one"),
    ([*TWO, "exchange.kind=hacpo", "update.rule=hacpo", "exchange.pairing=compatible"],
     "exchange.pairing: compatible chooses among a receiver's peers, which only exchange.kind=live has"),
    (["models=[{name: A, path: a}]", "exchange.kind=stored", "peer.store_path=s", "exchange.pairing=compatible"],
     "exchange.pairing: compatible chooses among a receiver's peers, which only exchange.kind=live has"),
    ([*THREE, "exchange.kind=none", "exchange.pairing=complementary"], "exchange.pairing: complementary chooses"),
])
def test_a_pairing_that_cannot_apply_is_refused_naming_the_field(overrides, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, overrides)


def test_describe_shows_the_pairing():
    lines = describe_exchange(load_config(None, [*THREE, "exchange.pairing=complementary",
                                                 "exchange.pairing_window=4"])).lines()
    assert "chosen by exchange.pairing=complementary over 4 steps" in lines[0]
    assert "exchange.pairing='complementary'" in lines[-1] and "exchange.pairing_window=4" in lines[-1]
    plain = describe_exchange(load_config(None, THREE)).lines()
    assert "exchange.pairing='all'" in plain[-1] and "pairing_window" not in plain[-1]


def test_a_pairing_registered_here_is_a_config_choice():
    PAIRINGS.register("first", ChoosePeer(lambda solved, s: (best(torch.zeros(solved.shape[1])), [None] * solved.shape[1])))
    try:
        assert load_config(None, [*THREE, "exchange.pairing=first"]).exchange.pairing == "first"
        assert peers_of(run("first"), "C") == [("p2", "A")]     # C's first peer, A, hands it p2
    finally:
        PAIRINGS.unregister("first")


def test_the_live_exchange_checkpoints_its_window():
    cfg = load_config(None, [*THREE, "exchange.pairing=complementary"])
    ex = LiveExchange(cfg, RECEIVERS, lambda gs: None)
    ex(groups(), 0)
    state = json.loads(json.dumps(ex.state_dict()))
    again = LiveExchange(cfg, RECEIVERS, lambda gs: None)
    again.load_state_dict(state)
    assert again.window.state_dict() == ex.window.state_dict() and again.window.steps
    assert LiveExchange(replace(cfg, exchange=replace(cfg.exchange, pairing="all")), RECEIVERS,
                        lambda gs: None).state_dict() == {}
