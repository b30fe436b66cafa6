"""Exchange among three models: selection per ordered pair, balancing per unordered pair, conflicts.

Hand-worked case (n = 4 samples; receivers score every token at log-prob -1, see FakeReceiver):

    prompt        p0  p1  p2  p3  p4
    k_A            3   0   1   0   0
    k_B            0   2   0   0   0
    k_C            2   0   0   1   1

C_{S->R} = {q : k_R = 0, 1 <= k_S < 4}:
    A->B {p0, p2}   B->A {p1}        pair {A,B}: m = min(2, 1) = 1 -> A->B {p0} (k 3), B->A {p1}
    A->C {p2}       C->A {p3, p4}    pair {A,C}: m = 1 -> A->C {p2}, C->A {p3, p4} (tied at k 1: both kept)
    B->C {p1}       C->B {p0,p3,p4}  pair {B,C}: m = 1 -> B->C {p1}, C->B {p0} (k 2)
Receiver B is offered p0 by A (k 3; A's responses have generation log-prob -0.9, so
s = exp(-1 + 0.9) = e^-0.1 = 0.905) and by C (k 2; log-prob -1, s = 1):
    most_successes  -> A (3 > 2)      most_compatible -> C (1 > 0.905)      model_order -> A
"""
from __future__ import annotations

import itertools
import math

import pytest

from graft.config import ExchangeConfig
from graft.exchange.handover import Scoring
from graft.exchange.live import exchange_live
from tests.exchange.test_exchange import FakeReceiver, group

N = 4
K = {"A": [3, 0, 1, 0, 0], "B": [0, 2, 0, 0, 0], "C": [2, 0, 0, 1, 1]}
RECEIVERS = {m: FakeReceiver(m) for m in "ABC"}


def groups(order=("A", "B", "C")):
    gen = {"A": -0.9, "B": -1.0, "C": -1.0}
    return {m: [group(m, f"p{i}", [1.0] * k + [0.0] * (N - k), [gen[m]] * N) for i, k in enumerate(K[m])] for m in order}


def run(order=("A", "B", "C"), **kw):
    return exchange_live(1, groups(order), RECEIVERS, N, ExchangeConfig(**kw), Scoring(), lambda gs: None, threshold=0.5)


def rec(res, s, r):
    return next(a for a in res.audit if a["source"] == s and a["receiver"] == r)


def test_selection_per_pair_and_balancing_per_unordered_pair():
    res = run()
    want = {("A", "B"): ["p0"], ("B", "A"): ["p1"], ("A", "C"): ["p2"], ("C", "A"): ["p3", "p4"],
            ("B", "C"): ["p1"], ("C", "B"): ["p0"]}
    for (s, r), sel in want.items():
        assert rec(res, s, r)["selected"] == sel, (s, r)
    assert [c["prompt_id"] for c in rec(res, "C", "B")["candidates"]] == ["p0", "p3", "p4"]
    assert rec(res, "C", "A")["m"] == 1 and rec(res, "B", "C")["m"] == 1
    assert [(a["source"], a["receiver"]) for a in res.audit] == [("A", "B"), ("A", "C"), ("B", "A"), ("B", "C"),
                                                                 ("C", "A"), ("C", "B")]


@pytest.mark.parametrize("rule,winner", [("most_successes", "A"), ("most_compatible", "C"), ("model_order", "A")])
def test_conflict_goes_to_one_source_and_is_audited(rule, winner):
    res = run(conflict=rule)
    loser = {"A": "C", "C": "A"}[winner]
    peers_b = [(g.prompt_id, g.source) for g in res.train_groups["B"] if g.is_peer]
    assert peers_b == [("p0", winner)]
    assert [(g.prompt_id, g.is_peer) for g in res.train_groups["B"]] == [
        ("p1", False), ("p2", False), ("p3", False), ("p4", False), ("p0", True)]
    for s in ("A", "C"):
        (c,) = rec(res, s, "B")["conflicts"]
        assert c["prompt_id"] == "p0" and c["winner"] == winner
        assert c["contenders"]["A"] == {"k_source": 3, "s_mean": pytest.approx(math.exp(-0.1), rel=1e-6)}
        assert c["contenders"]["C"] == {"k_source": 2, "s_mean": pytest.approx(1.0)}
    assert len(rec(res, winner, "B")["responses"]) == N and rec(res, loser, "B")["responses"] == []
    assert res.metrics[f"exchange/{loser}->B/conflicts_lost"] == 1
    assert res.metrics[f"exchange/{winner}->B/conflicts_lost"] == 0
    # no other receiver has a conflict
    assert all(a["conflicts"] == [] for a in res.audit if a["receiver"] != "B")


def test_permuting_the_model_order_permutes_every_decision():
    base = run()
    for order in itertools.permutations("ABC"):
        res = run(order)
        for a in base.audit:
            b = rec(res, a["source"], a["receiver"])
            assert b["selected"] == a["selected"] and b["m"] == a["m"]
            assert [r["admitted"] for r in b["responses"]] == [r["admitted"] for r in a["responses"]]
            assert [c["winner"] for c in b["conflicts"]] == [c["winner"] for c in a["conflicts"]]
        for m in "ABC":
            assert sorted((g.prompt_id, g.source) for g in res.train_groups[m]) == \
                sorted((g.prompt_id, g.source) for g in base.train_groups[m])
