"""Dynamic sampling's rounds, model-free: crafted success counts, the real live exchange over a fake receiver
(tests/exchange/test_exchange.py), hand-worked which prompts each model keeps and what the merged audit says."""
from __future__ import annotations

from dataclasses import replace

import pytest

from graft.config import ExchangeConfig
from graft.exchange.common import merge_rounds
from graft.exchange.handover import Scoring
from graft.exchange.live import exchange_live
from graft.trainer.dynamic import Round, carrying, fill_batches
from graft.types import ExchangeResult, Prompt
from tests.exchange.test_exchange import N, RECEIVERS, group, no_regrade

# success counts (A, B) out of n = 4 per prompt
K = {
    # round 0: p0 A->B (B all-fail, A 2 of 4), p1 B->A; p2 both all-correct, p3 both all-fail (zero variance)
    "p0": (2, 0), "p1": (0, 1), "p2": (4, 4), "p3": (0, 0),
    # round 1: A carries p4 and p7 (own); B is all-correct or all-fail everywhere, and no candidate either way
    "p4": (3, 4), "p5": (0, 0), "p6": (0, 0), "p7": (1, 4),
    # round 2: B carries p8 (own); A's all-fail p8 is a candidate B->A, but A->B has none: balanced to m = 0
    "p8": (0, 2), "p9": (0, 0), "p10": (0, 0), "p11": (0, 0),
    "p12": (2, 3),   # both carry their own
}
TOKENS = {"A/tokens/generated": 10, "B/tokens/generated": 20}


def prompts(*ids: str) -> list[Prompt]:
    return [Prompt(p, f"problem {p}", "4") for p in ids]


def sample(ps: list[Prompt], r: int, balance: str = "min") -> Round:
    groups = {m: [group(m, p.id, [1.0] * K[p.id][i] + [0.0] * (N - K[p.id][i])) for p in ps] for i, m in enumerate("AB")}
    ex = exchange_live(1, groups, RECEIVERS, N, replace(ExchangeConfig(), balance=balance), Scoring(), no_regrade,
                       threshold=0.5)
    return Round(ps, groups, ex, TOKENS)


def batches(pids: list[list[str]], target=4, max_rounds=3, balance="min"):
    """fill_batches over the rounds' prompt lists ``pids`` (round 0 first); also returns the calls of ``sample``."""
    draws, calls = iter(pids[1:]), []

    def sample_r(ps, r):
        calls.append(([p.id for p in ps], r))
        return sample(ps, r, balance)

    every, ex, m = fill_batches(sample(prompts(*pids[0]), 0, balance), lambda: prompts(*next(draws)), sample_r, target,
                                max_rounds)
    return every, ex, m, calls


def test_each_model_keeps_its_own_gradient_carrying_prompts_until_full_or_out_of_rounds():
    every, ex, m, calls = batches([["p0", "p1", "p2", "p3"], ["p4", "p5", "p6", "p7"], ["p8", "p9", "p10", "p11"]])
    # round 0: A keeps p0 (own) and p1 (B's group), B keeps p0 (A's group) and p1 (own): 2 of 4 each
    # round 1: A keeps p4, p7 (own): full, 4 of 4; B keeps nothing (2 of 4)
    # round 2: B keeps p8 (own): 3 of 4, and the 3 rounds ran out
    assert calls == [(["p4", "p5", "p6", "p7"], 1), (["p8", "p9", "p10", "p11"], 2)]
    kept = {n: [(g.prompt_id, g.source) for g in gs] for n, gs in ex.train_groups.items()}
    assert kept == {"A": [("p0", "A"), ("p1", "B"), ("p4", "A"), ("p7", "A")], "B": [("p1", "B"), ("p0", "A"), ("p8", "B")]}
    for gs in ex.train_groups.values():   # every kept group carries gradient
        assert all(any(a != 0 for a in g.advantages) for g in gs)
    # A: 2 rounds, 8 prompts sampled while not full, 4 kept (1/2); B: 3 rounds, 12 sampled, 3 kept (1/4)
    # tokens: every round's, 3 rounds x 10 (A) and x 20 (B), A's third round included (it sampled, keeping nothing)
    assert m == {"A/dynamic/rounds": 2, "A/dynamic/sampled": 8, "A/dynamic/kept": 4, "A/dynamic/kept_frac": 0.5,
                 "A/dynamic/tokens_generated": 30,
                 "B/dynamic/rounds": 3, "B/dynamic/sampled": 12, "B/dynamic/kept": 3, "B/dynamic/kept_frac": 0.25,
                 "B/dynamic/tokens_generated": 60}
    # every round's own groups, for the trajectory store
    assert [g.prompt_id for g in every["A"]] == [f"p{i}" for i in range(12)]


def test_the_audit_and_the_exchange_metrics_count_every_round():
    _, ex, _, _ = batches([["p0", "p1", "p2", "p3"], ["p4", "p5", "p6", "p7"], ["p8", "p9", "p10", "p11"]])
    rec = {(r["source"], r["receiver"]): r for r in ex.audit}
    assert len(ex.audit) == 2 and all(r["rounds"] == 3 and r["step"] == 1 for r in ex.audit)
    # B->A: candidates p1 (round 0) and p8 (round 2, balanced away: A->B had none that round); m = 1 + 0 + 0
    assert [c["prompt_id"] for c in rec["B", "A"]["candidates"]] == ["p1", "p8"]
    assert rec["B", "A"]["selected"] == ["p1"] and rec["B", "A"]["m"] == 1
    assert [(x["prompt_id"], x["index"]) for x in rec["B", "A"]["responses"]] == [("p1", i) for i in range(4)]
    assert ex.metrics["exchange/B->A/candidates"] == 2 and ex.metrics["exchange/B->A/kept_prompts"] == 1
    assert ex.metrics["exchange/B->A/m"] == 1 and ex.metrics["exchange/A->B/candidates"] == 1
    # 4 responses each way, all admitted (s = exp(-1 - -1) = 1 > 0.8); their s statistics: 1
    assert ex.metrics["exchange/A->B/admitted"] == ex.metrics["exchange/B->A/transferred"] == 4
    assert ex.metrics["exchange/A->B/admitted_frac"] == 1.0 and ex.metrics["exchange/A->B/s_p50"] == pytest.approx(1.0)


def test_a_full_first_round_is_the_step_without_dynamic_sampling():
    # p0, p1 carry for both (after the exchange), p12 too: target 3 is full after round 0 and nothing is dropped
    first = sample(prompts("p0", "p1", "p12"), 0)
    every, ex, m = fill_batches(first, lambda: pytest.fail("no further round"), sample, 3, 3)
    assert ex.train_groups == first.exchange.train_groups and ex.audit == first.exchange.audit
    assert ex.metrics == first.exchange.metrics and all("rounds" not in r for r in ex.audit)
    assert m["A/dynamic/rounds"] == m["B/dynamic/rounds"] == 1 and m["A/dynamic/kept_frac"] == 1.0


def test_a_prompt_drawn_twice_in_a_step_is_sampled_once_and_no_fresh_prompt_is_an_empty_round():
    # round 1 draws p2, p3 again (an epoch boundary): only p4, p5 are sampled; round 2 draws nothing new
    every, ex, m, calls = batches([["p0", "p1", "p2", "p3"], ["p2", "p3", "p4", "p5"], ["p4", "p5"]])
    assert calls == [(["p4", "p5"], 1)]
    # A: p0, p1 + p4 = 3; B: p0, p1 = 2; 3 rounds, 4 + 2 + 0 prompts sampled
    assert m["A/dynamic/kept"] == 3 and m["B/dynamic/kept"] == 2
    assert m["A/dynamic/rounds"] == 3 and m["A/dynamic/sampled"] == 6
    assert all(r["rounds"] == 2 for r in ex.audit)   # two rounds exchanged; the empty one did not
    for gs in ex.train_groups.values():
        assert len({g.prompt_id for g in gs if not g.is_peer}) == len([g for g in gs if not g.is_peer])


def test_nothing_kept_leaves_an_empty_batch():
    every, ex, m, _ = batches([["p2", "p3"], ["p5", "p6"], ["p9", "p10"]], target=2)
    assert ex.train_groups == {"A": [], "B": []} and m["A/dynamic/kept"] == 0 and m["A/dynamic/kept_frac"] == 0.0


def test_a_response_of_zero_weight_carries_nothing():
    g = group("A", "p0", [1.0, 0.0, 0.0, 0.0])
    assert carrying(["p0", "p9"], [g]).tolist() == [True, False]
    assert carrying(["p0"], [replace(g, weights=[0.0, 1.0, 1.0, 1.0])]).tolist() == [True]   # the others: -0.5
    assert carrying(["p0"], [replace(g, weights=[1.0, 0.0, 0.0, 0.0], advantages=[0.0, -0.5, -0.5, -0.5])]).tolist() == [False]
    assert carrying(["p0"], []).tolist() == [False]


def test_merging_unbalanced_rounds_keeps_m_at_minus_one():
    a = sample(prompts("p0", "p1"), 0, balance="none").exchange
    b = sample(prompts("p8"), 1, balance="none").exchange
    assert isinstance(a, ExchangeResult) and isinstance(b, ExchangeResult)
    audit, metrics = merge_rounds([a, b])
    assert [r["m"] for r in audit] == [-1, -1] and metrics["exchange/B->A/m"] == -1
    # B->A: p1 (round 0) and p8 (round 1, unbalanced now): 8 responses; s of every one 1
    assert metrics["exchange/B->A/admitted"] == 8 and metrics["exchange/B->A/s_mean"] == pytest.approx(1.0)
    assert metrics["exchange/A->B/admitted"] == 4 and metrics["exchange/A->B/s_p50_admitted"] == pytest.approx(1.0)


def test_each_round_has_its_own_seeds_and_round_0_is_the_step_s():
    from graft.seeds import round_seed, step_seed
    assert round_seed(3, 5, 0, "A") == step_seed(3, 5, "A")   # a step of one round samples as before
    assert len({round_seed(3, 5, r, "A") for r in range(3)} | {step_seed(3, 6, "A")}) == 4
