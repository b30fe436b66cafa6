"""Exchange orchestration on crafted batches, with a model-free receiver: every switch's exact effect."""
from __future__ import annotations

import math

import pytest
import torch

from dataclasses import replace

from graft.config import ExchangeConfig
from graft.exchange.handover import Scoring
from graft.exchange.live import exchange_live
from graft.exchange.stored import exchange_stored
from graft.types import RolloutGroup

N = 4
T = 0.5
"""reward.success_threshold (the default): the crafted rewards are 0/1."""


class FakeReceiver:
    """Tokenizes a response as one token per character; every token has log-prob ``logp``."""

    def __init__(self, name: str, logp: float = -1.0):
        self.name, self.logp = name, logp

    @property
    def codec(self):   # a test double: its own codec
        return self

    def render_prompt(self, problem, messages=None):
        return f"[{self.name}] {problem}"

    def encode_prompt(self, problem, messages=None):
        return [1, 2, 3]

    def encode_responses(self, texts, finished):
        return [[ord(c) for c in t] for t in texts]

    def token_logprobs(self, prompt_ids, response_ids, chunk, micro_batch, temperature, progress=False):
        self.temperature = temperature
        return [torch.full((len(r),), self.logp) for r in response_ids]


def group(model: str, pid: str, rewards: list[float], gen_logp: list[float] | None = None) -> RolloutGroup:
    """A group of len(rewards) two-character responses; response i has mean generation log-prob gen_logp[i]."""
    gen_logp = gen_logp or [-1.0] * len(rewards)
    r = torch.tensor(rewards)
    std = r.std()
    adv = ((r - r.mean()) / (std + 1e-6)).tolist() if std > 0 else [0.0] * len(rewards)
    return RolloutGroup(
        prompt_id=pid, problem=f"problem {pid}", answer="4", source=model, holder=model, prompt_text="", prompt_token_ids=[0],
        responses=[f"r{i}" for i in range(len(rewards))], token_ids=[[7, 8]] * len(rewards),
        old_logprobs=[[lp, lp] for lp in gen_logp], gen_token_ids=[[7, 8]] * len(rewards),
        gen_logprobs=[[lp, lp] for lp in gen_logp], finished=[True] * len(rewards), rewards=list(rewards),
        status=["ok"] * len(rewards), advantages=adv, weights=[1.0] * len(rewards), compat=[1.0] * len(rewards),
    )


def batch(k_a: list[int], k_b: list[int], logp_a=None):
    ga = [group("A", f"p{i}", [1.0] * k + [0.0] * (N - k), logp_a) for i, k in enumerate(k_a)]
    gb = [group("B", f"p{i}", [1.0] * k + [0.0] * (N - k)) for i, k in enumerate(k_b)]
    return {"A": ga, "B": gb}


RECEIVERS = {"A": FakeReceiver("A"), "B": FakeReceiver("B"), "C": FakeReceiver("C")}
RENAMED = {"ratio": "balance_ratio", "floor": "balance_floor"}


def no_regrade(groups):
    """The receiver's re-verification: here it agrees with the source (the crafted rewards stay)."""


def run(groups, settings=None, generator=None, **kw):
    ex = replace(settings or ExchangeConfig(), **{RENAMED.get(k, k): v for k, v in kw.items()})
    res = exchange_live(1, groups, RECEIVERS, N, ex, Scoring(), no_regrade, generator, threshold=T)
    return res.train_groups, res.audit, res.metrics, {n: [g for g in gs if g.is_peer] for n, gs in res.train_groups.items()}


def selected(audit, src):
    return next(a for a in audit if a["source"] == src)["selected"]


def test_default_graft_selection_balancing_and_replacement():
    # k_A = [3, 2, 1, 0, 4], k_B = [0, 0, 0, 2, 0]
    # C_A->B = {p0 (k_A 3), p1 (2), p2 (1)}; p4 excluded: k_A = n.   C_B->A = {p3}.   m = min(3, 1) = 1
    # A->B keeps the top-1 by k_A: p0.  B->A keeps p3.
    out, audit, m, peers = run(batch([3, 2, 1, 0, 4], [0, 0, 0, 2, 0]))
    assert selected(audit, "A") == ["p0"] and selected(audit, "B") == ["p3"]
    assert m["exchange/A->B/candidates"] == 3 and m["exchange/A->B/m"] == 1 and m["exchange/B->A/m"] == 1
    # B's batch: own p1..p4, then the peer group for p0 (whole group: 4 responses, source advantages)
    assert [(g.prompt_id, g.is_peer) for g in out["B"]] == [("p1", False), ("p2", False), ("p3", False), ("p4", False), ("p0", True)]
    peer = out["B"][-1]
    # rewards [1,1,1,0]: mean .75, unbiased std sqrt((3 * .0625 + .5625) / 3) = .5
    # -> advantages [.25, .25, .25, -.75] / (.5 + 1e-6) = [.5, .5, .5, -1.5]
    assert peer.advantages == pytest.approx([0.25 / (0.5 + 1e-6)] * 3 + [-0.75 / (0.5 + 1e-6)], rel=1e-6)
    assert peer.holder == "B" and peer.source == "A" and peer.prompt_text == "[B] problem p0"
    assert peer.weights == [1.0] * 4                      # s = exp(-1 - (-1)) = 1 -> w = min(1, 1)


def test_ties_at_boundary_are_kept():
    # C_A->B: p0 (k 3), p1 (k 2), p2 (k 2); C_B->A: p3, p4 -> m = 2; the 2nd-ranked k is 2 and p2 ties it
    out, audit, m, _ = run(batch([3, 2, 2, 0, 0], [0, 0, 0, 1, 1]))
    assert sorted(selected(audit, "A")) == ["p0", "p1", "p2"] and m["exchange/A->B/kept_prompts"] == 3


def test_m_zero_exchanges_nothing():
    out, audit, m, _ = run(batch([2, 3], [0, 0]))          # C_A->B has 2, C_B->A is empty
    assert selected(audit, "A") == [] and selected(audit, "B") == []
    assert not any(g.is_peer for gs in out.values() for g in gs)


def test_no_balancing_keeps_every_candidate():
    out, audit, m, _ = run(batch([3, 2, 1, 0], [0, 0, 0, 2]), balance="none")
    assert selected(audit, "A") == ["p0", "p1", "p2"]


def test_asymmetric_balancing():
    # |C_A->B| = 3, |C_B->A| = 1: m_A->B = min(3, ceil(1.0 * 1) + 1) = 2 -> p0, p1
    out, audit, m, _ = run(batch([3, 2, 1, 0], [0, 0, 0, 2]), balance="asymmetric", ratio=1.0, floor=1)
    assert selected(audit, "A") == ["p0", "p1"] and selected(audit, "B") == ["p3"]


def test_gate_drops_low_compatibility_and_caps_weight():
    # receiver mean log-prob -1 for every response; source means [-1, -0.9, -0.5, -1.5]
    # s = exp(-1 - src) = [1, e^-0.1 = .905, e^-0.5 = .607, e^0.5 = 1.65]; delta .8 drops index 2
    g = batch([2, 0], [0, 1], logp_a=[-1.0, -0.9, -0.5, -1.5])
    out, audit, m, _ = run(g)
    rows = next(a for a in audit if a["source"] == "A")["responses"]
    assert [r["admitted"] for r in rows] == [True, True, False, True]
    assert [r["s"] for r in rows] == pytest.approx([1.0, math.exp(-0.1), math.exp(-0.5), math.exp(0.5)], rel=1e-6)
    peer = next(x for x in out["B"] if x.is_peer)
    assert peer.index == [0, 1, 3] and peer.weights == pytest.approx([1.0, math.exp(-0.1), 1.0], rel=1e-6)
    assert m["exchange/A->B/admitted_frac"] == pytest.approx(0.75)


def test_no_floor_admits_all_but_keeps_weights():
    g = batch([2, 0], [0, 1], logp_a=[-1.0, -0.9, -0.5, -1.5])
    out, _, _, _ = run(g, ExchangeConfig(delta=0.0))
    peer = next(x for x in out["B"] if x.is_peer)
    assert peer.index == [0, 1, 2, 3]
    assert peer.weights == pytest.approx([1.0, math.exp(-0.1), math.exp(-0.5), 1.0], rel=1e-6)


def test_no_compat_weighting_gives_weight_one():
    g = batch([2, 0], [0, 1], logp_a=[-1.0, -0.9, -0.5, -1.5])
    out, _, _, _ = run(g, ExchangeConfig(admission="all", weighting="none"))
    peer = next(x for x in out["B"] if x.is_peer)
    assert peer.weights == [1.0] * 4


def test_random_admission_admits_same_count():
    g = batch([2, 0], [0, 1], logp_a=[-1.0, -0.9, -0.5, -1.5])
    out, audit, _, _ = run(g, ExchangeConfig(admission="random"), generator=torch.Generator().manual_seed(0))
    rows = next(a for a in audit if a["source"] == "A")["responses"]
    assert sum(r["admitted"] for r in rows) == 3     # the gate would admit 3


def test_random_selection_draws_same_count_from_all_fail_prompts():
    # GRAFT would keep 1 prompt per direction; random selection draws 1 from B's all-fail prompts {p0, p1, p2}
    out, audit, _, _ = run(batch([3, 2, 0, 0], [0, 0, 0, 2]), selection="random", generator=torch.Generator().manual_seed(1))
    sel = selected(audit, "A")
    assert len(sel) == 1 and sel[0] in {"p0", "p1", "p2"}


def test_successes_only_transfers_correct_responses():
    out, _, _, _ = run(batch([2, 0], [0, 1]), ExchangeConfig(successes_only=True))
    peer = next(x for x in out["B"] if x.is_peer)
    assert peer.index == [0, 1] and peer.rewards == [1.0, 1.0]
    # advantages stay those of the full source group: rewards [1,1,0,0] -> mean .5, std .577 -> +.866
    assert peer.advantages == pytest.approx([0.5 / (0.57735027 + 1e-6)] * 2, rel=1e-6)


def test_pooled_rewards_keeps_own_group_and_normalises_jointly():
    out, _, _, _ = run(batch([2, 0], [0, 1]), ExchangeConfig(pooled_rewards=True))
    own = next(x for x in out["B"] if x.prompt_id == "p0" and not x.is_peer)
    peer = next(x for x in out["B"] if x.prompt_id == "p0" and x.is_peer)
    # pooled rewards: own [0,0,0,0] + peer [1,1,0,0]: mean .25, unbiased std = sqrt(8 * .25 * .75 / 7) = .6547
    std = math.sqrt(2 * 0.75**2 / 7 + 6 * 0.25**2 / 7)
    assert own.advantages == pytest.approx([-0.25 / (std + 1e-6)] * 4, rel=1e-5)
    assert peer.advantages == pytest.approx([0.75 / (std + 1e-6)] * 2 + [-0.25 / (std + 1e-6)] * 2, rel=1e-5)


def test_include_all_correct_hands_over_k_equal_n_with_documented_advantage():
    out, audit, _, _ = run(batch([4, 0], [0, 1]), ExchangeConfig(all_correct_advantage=1.0), include_all_correct=True)
    assert selected(audit, "A") == ["p0"]
    peer = next(x for x in out["B"] if x.is_peer)
    assert peer.advantages == [1.0] * 4


def test_length_bucket_deltas():
    # responses are 2 characters = 2 receiver tokens; bucket {2: 0.95} applies: s = e^-0.1 = .905 <= .95 is dropped
    g = batch([2, 0], [0, 1], logp_a=[-1.0, -0.9, -1.0, -1.0])
    out, audit, _, _ = run(g, ExchangeConfig(delta_by_length={2: 0.95}))
    rows = next(a for a in audit if a["source"] == "A")["responses"]
    assert [r["admitted"] for r in rows] == [True, False, True, True]


def test_swapping_models_swaps_decisions():
    g = batch([3, 2, 1, 0, 0], [0, 0, 0, 2, 1])
    swapped = {"B": [group("B", x.prompt_id, x.rewards) for x in g["A"]], "A": [group("A", x.prompt_id, x.rewards) for x in g["B"]]}
    _, audit, m, _ = run(g)
    _, audit_sw, m_sw, _ = run(swapped)
    assert selected(audit, "A") == selected(audit_sw, "B") and selected(audit, "B") == selected(audit_sw, "A")
    for key in ("candidates", "m", "kept_prompts", "transferred", "admitted"):
        assert m[f"exchange/A->B/{key}"] == m_sw[f"exchange/B->A/{key}"]


def test_stored_peer_one_direction_with_cap_and_pick():
    own = [group("A", f"p{i}", [0.0] * N) for i in range(3)] + [group("A", "p3", [1.0, 0, 0, 0])]
    stored = [group("S", "p0", [1.0, 0, 0, 0]), group("S", "p1", [1.0, 1.0, 1.0, 0]), None, group("S", "p3", [1.0, 1, 0, 0])]
    res = exchange_stored(1, own, stored, RECEIVERS["A"], N, ExchangeConfig(), Scoring(), no_regrade, cap=1,
                          balance=False, source_name="S", threshold=T)
    out, audit = res.train_groups, res.audit
    # candidates: p0 (k 1) and p1 (k 3); p2 has no stored group; p3 is not all-fail for A. cap 1 -> p1
    assert sorted(c["prompt_id"] for c in audit[0]["candidates"]) == ["p0", "p1"]
    assert audit[0]["selected"] == ["p1"]
    assert [g.prompt_id for g in out["A"] if g.is_peer] == ["p1"]


def test_random_selection_of_an_all_correct_group_keeps_its_zero_advantages():
    """issue 10 item 2: random selection may draw a prompt on which the source got every sample right;
    without exchange.include_all_correct that group carries its GRPO advantages (all 0), not +1."""
    # B's all-fail prompts {p0, p1}; A: k = 4 (all correct) on p0, 2 on p1; B -> A has one candidate (p2)
    # so m = 1 and random selection draws 1 prompt from {p0, p1}. Seed 0 draws p0 here (checked below).
    g = batch([4, 2, 0], [0, 0, 2])
    for seed in range(8):
        out, audit, _, _ = run(g, selection="random", generator=torch.Generator().manual_seed(seed))
        if selected(audit, "A") == ["p0"]:
            break
    assert selected(audit, "A") == ["p0"], "no seed drew the all-correct prompt"
    rows = next(a for a in audit if a["source"] == "A")["responses"]
    assert [r["advantage"] for r in rows] == [0.0] * N
    assert all(p.advantages == [0.0] * p.size for p in out["B"] if p.is_peer)


def test_all_gated_out_group_removes_the_receivers_own_group():
    """issue 10 item 6: a selected prompt whose peer responses are all gated out contributes nothing
    (the receiver's own all-fail group is replaced by an empty group, not left in the token-mean denominator)."""
    # C_A->B = {p0}, C_B->A = {p1}; every A response has mean gen log-prob -0.1 and the receiver scores -1:
    # s = exp(-1 - (-0.1)) = e^-0.9 = .41 <= .8, so nothing of A's group reaches B.
    g = batch([2, 0], [0, 1], logp_a=[-0.1] * N)
    out, audit, m, _ = run(g)
    assert selected(audit, "A") == ["p0"] and m["exchange/A->B/admitted"] == 0
    assert [(x.prompt_id, x.is_peer) for x in out["B"]] == [("p1", False)]
    # the other direction is untouched: A's own p1 group is replaced by B's
    assert [(x.prompt_id, x.is_peer) for x in out["A"]] == [("p0", False), ("p1", True)]


def test_audit_m_is_minus_one_without_balancing():
    """issue 10 item 7: under exchange.balance=none there is no balanced target: m = -1 in the audit and
    the metrics (docs/run-folder.md, docs/metrics.md), not |C|."""
    out, audit, m, _ = run(batch([3, 2, 1, 0], [0, 0, 0, 2]), balance="none")
    assert [a["m"] for a in audit] == [-1, -1]
    assert m["exchange/A->B/m"] == -1 and m["exchange/B->A/m"] == -1
    assert m["exchange/A->B/candidates"] == 3


def test_stored_balancing_counts_the_reverse_direction():
    """issue 10 item 3: with peer.balance=true the reverse direction (stored group all-fail, receiver
    mixed) is counted, so m = min(|C|, |reverse|) and prompts are exchanged."""
    from graft.storage.trajectory_store import StoredGroup
    from graft.exchange.stored import stored_peer_groups

    def sg(pid, step, rewards):
        G = len(rewards)
        return StoredGroup(model="S", tokenizer="t", run_id="r", step=step, epoch=0, prompt_id=pid, problem=f"problem {pid}",
                           answer="4", prompt_text="", responses=[f"s{i}" for i in range(G)], token_ids=[[7, 8]] * G,
                           gen_logprobs=[[-1.0, -1.0]] * G, finished=[True] * G, rewards=rewards, statuses=["ok"] * G,
                           advantages=[0.0] * G)

    # receiver A: p0, p1 all-fail; p2 mixed (k 2). Stored S: p0 k 1, p1 k 2, p2 all-fail.
    own = [group("A", "p0", [0.0] * N), group("A", "p1", [0.0] * N), group("A", "p2", [1.0, 1.0, 0, 0])]
    store = {"p0": [sg("p0", 1, [1.0, 0, 0, 0])], "p1": [sg("p1", 1, [1.0, 1.0, 0, 0])], "p2": [sg("p2", 1, [0.0] * N)]}
    stored = stored_peer_groups(store, own, step=1, pick="latest", include_all_correct=False, threshold=T)
    res = exchange_stored(1, own, stored, RECEIVERS["A"], N, ExchangeConfig(), Scoring(), no_regrade, cap=None,
                          balance=True, source_name="S", threshold=T)
    # |C| = 2 (p0, p1), reverse = 1 (p2) -> m = 1 -> the top-1 by stored k: p1
    assert res.audit[0]["m"] == 1 and res.audit[0]["selected"] == ["p1"]
    assert res.metrics["exchange/S->A/m"] == 1 and res.metrics["exchange/S->A/kept_prompts"] == 1
    assert [g.prompt_id for g in res.train_groups["A"] if g.is_peer] == ["p1"]


def test_stored_latest_pick_does_not_reach_back_to_an_older_success():
    """issue 10 item 4: peer.pick=latest uses the latest stored group not after the receiver's step, as
    documented; if that group is all-fail the prompt is no candidate, even when an older group succeeded."""
    from graft.storage.trajectory_store import StoredGroup
    from graft.exchange.stored import stored_peer_groups

    def sg(step, rewards):
        return StoredGroup(model="S", tokenizer="t", run_id="r", step=step, epoch=0, prompt_id="p0", problem="q",
                           answer="4", prompt_text="", responses=["a"] * N, token_ids=[[7]] * N,
                           gen_logprobs=[[-1.0]] * N, finished=[True] * N, rewards=rewards, statuses=["ok"] * N,
                           advantages=[0.0] * N)

    own = [group("A", "p0", [0.0] * N)]
    store = {"p0": [sg(1, [1.0, 0, 0, 0]), sg(3, [0.0] * N)]}
    (picked,) = stored_peer_groups(store, own, step=4, pick="latest", include_all_correct=False, threshold=T)
    assert picked.step == 3 and picked.successes(T) == 0
    res = exchange_stored(4, own, [picked], RECEIVERS["A"], N, ExchangeConfig(), Scoring(), no_regrade, cap=None,
                          balance=False, source_name="S", threshold=T)
    assert res.audit[0]["candidates"] == [] and not any(g.is_peer for g in res.train_groups["A"])
    (any_pick,) = stored_peer_groups(store, own, step=4, pick="any", include_all_correct=False, threshold=T)
    assert any_pick.step == 1    # "any" takes the group with most successes the candidate rule accepts


@pytest.mark.parametrize("threshold, cand_ab, cand_ba, kept_a, kept_b", [
    (0.5, 1, 1, ["p1"], ["p0"]),
    (0.25, 0, 0, [], []),
    (0.7, 0, 1, [], []),
])
def test_candidate_sets_follow_the_success_threshold(threshold, cand_ab, cand_ba, kept_a, kept_b):
    # continuous rewards. A: p0 [.3, .3, .3, .3], p1 [.6, 0, 0, 0]; B: p0 [.9, 0, 0, 0], p1 [.3, .3, 0, 0].
    # 0.5:  k_A = [0, 1], k_B = [1, 0] -> C_A->B = {p1}, C_B->A = {p0}, m = 1: each hands its one candidate over.
    # 0.25: k_A = [4, 1], k_B = [1, 2] -> no all-fail group: nothing.
    # 0.7:  k_A = [0, 0], k_B = [1, 0] -> C_A->B = {}, C_B->A = {p0}, m = min(0, 1) = 0: nothing kept.
    groups = {"A": [group("A", "p0", [0.3] * 4), group("A", "p1", [0.6, 0.0, 0.0, 0.0])],
              "B": [group("B", "p0", [0.9, 0.0, 0.0, 0.0]), group("B", "p1", [0.3, 0.3, 0.0, 0.0])]}
    res = exchange_live(1, groups, RECEIVERS, N, ExchangeConfig(), Scoring(), no_regrade, threshold=threshold)
    m = res.metrics
    assert (m["exchange/A->B/candidates"], m["exchange/B->A/candidates"]) == (cand_ab, cand_ba)
    assert selected(res.audit, "A") == kept_a and selected(res.audit, "B") == kept_b
    if threshold == 0.5:   # A's p1 group goes to B: 4 responses, one of them (0.6) a success of A's
        assert m["exchange/A->B/transferred"] == 4 and m["exchange/A->B/transferred_correct"] == 1
        assert [c["k_source"] for c in next(a for a in res.audit if a["source"] == "A")["candidates"]] == [1]
