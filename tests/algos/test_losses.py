import math

import pytest
import torch

from graft.algos.losses import (
    aggregate,
    hacpo_loss,
    importance_ratio,
    luffy_loss,
    policy_loss,
    merge,
    sgt_loss,
    summarize,
)
from graft.config import UpdateConfig
from graft.registry import RULES
from graft.trainer.rules import make_rule

POLICY_LOSSES = {name: rule.loss for name, rule in RULES.items()}


def get_policy_loss(name):
    return make_rule(UpdateConfig(rule=name), 0.5).loss

LN2 = math.log(2.0)


def batch(ratios, adv, weights=None, peer=None, mask=None):
    """old_logp = log .5 everywhere, logp = log(.5 * ratio) so rho = ratio exactly (up to float)."""
    r = torch.tensor(ratios, dtype=torch.float64)
    old = torch.full_like(r, math.log(0.5))
    logp = (old + torch.log(r)).clone().requires_grad_(True)
    n = r.shape[0]
    return dict(
        logp=logp,
        old_logp=old,
        advantages=torch.tensor(adv, dtype=torch.float64),
        weights=torch.ones(n, dtype=torch.float64) if weights is None else torch.tensor(weights, dtype=torch.float64),
        mask=torch.ones_like(r, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool),
        is_peer=torch.zeros(n, dtype=torch.bool) if peer is None else torch.tensor(peer, dtype=torch.bool),
    )


def random_batch(seed, b=6, t=5, peer_rows=2):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    logp = (old + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.3).requires_grad_(True)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None] < lengths[:, None]
    peer = torch.zeros(b, dtype=torch.bool)
    peer[b - peer_rows :] = True
    weights = torch.where(peer, torch.rand(b, generator=g, dtype=torch.float64), torch.ones(b, dtype=torch.float64))
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    return dict(logp=logp, old_logp=old, advantages=adv, weights=weights, mask=mask, is_peer=peer)


def close(a, b, atol=1e-9):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), rtol=0, atol=atol)


# ------------------------------------------------------------------ hand-worked GRAFT objective

@pytest.mark.parametrize(
    "rho, adv, expected, low, high",
    [
        (1.5, 1.0, -1.28, 0, 1),   # min(1.5, clip(1.5)=1.28) = 1.28 -> loss -1.28, high clip active
        (1.5, -1.0, 1.5, 0, 0),    # min(-1.5, -1.28) = -1.5: unclipped side wins, no clip active
        (0.5, -1.0, 0.8, 1, 0),    # min(-0.5, -0.8) = -0.8 -> loss 0.8, low clip active
        (0.5, 1.0, -0.5, 0, 0),    # min(0.5, 0.8) = 0.5
        (1.1, 2.0, -2.2, 0, 0),    # inside the trust region: rho * A
    ],
)
def test_clipped_single_token(rho, adv, expected, low, high):
    loss, m = policy_loss(**batch([[rho]], [adv]))
    close(loss, expected)
    assert (m["count/own_clip_low"], m["count/own_clip_high"]) == (low, high)
    assert (m["clip_frac/own_low"], m["clip_frac/own_high"]) == (float(low), float(high))
    assert m["tokens/own"] == 1 and m["tokens/peer"] == 0 and m["clip_frac/peer_high"] == 0.0


def test_weights_scale_the_clipped_term():
    loss, _ = policy_loss(**batch([[1.5]], [1.0], weights=[0.5]))
    close(loss, -0.64)  # 0.5 * 1.28
    loss, _ = policy_loss(**batch([[1.5]], [1.0], weights=[0.0]))
    close(loss, 0.0)


def test_token_mean_vs_seq_mean_token_mean():
    # row 0: 1 token, rho 1, A -1 -> token loss +1; row 1: 3 tokens, rho 1, A +2 -> -2 each
    kw = batch([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [-1.0, 2.0], mask=[[1, 0, 0], [1, 1, 1]])
    close(policy_loss(**kw, agg="token-mean")[0], (1 - 6) / 4)           # -1.25
    close(policy_loss(**kw, agg="seq-mean-token-mean")[0], (1 - 2) / 2)  # -0.5


def test_aggregate_direct_and_empty():
    loss = torch.tensor([[1.0, 2.0], [3.0, float("nan")]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    close(aggregate(loss, mask, "token-mean"), 2.0)
    close(aggregate(loss, mask, "token-mean", num_tokens=6), 1.0)
    close(aggregate(loss, mask, "seq-mean-token-mean"), (1.5 + 3.0) / 2)
    close(aggregate(loss, mask, "seq-mean-token-mean", num_seqs=3), (1.5 + 3.0) / 3)
    empty = torch.zeros_like(mask)
    assert aggregate(loss, empty, "token-mean").item() == 0.0
    assert aggregate(loss, empty, "seq-mean-token-mean").item() == 0.0
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean"):
        aggregate(loss, mask, "sum")


# ------------------------------------------------------------------ invariants

def test_all_fail_group_gives_exactly_zero_gradient():
    kw = random_batch(0)
    kw["advantages"] = torch.zeros(6, dtype=torch.float64)
    loss, _ = policy_loss(**kw)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(kw["logp"].grad) == 0


def test_zero_advantage_rows_get_zero_gradient_in_a_mixed_batch():
    kw = random_batch(1)
    kw["advantages"][:2] = 0.0
    policy_loss(**kw)[0].backward()
    assert torch.count_nonzero(kw["logp"].grad[:2]) == 0
    assert torch.count_nonzero(kw["logp"].grad[2:]) > 0


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_split_batch_with_global_counts_adds_up(seed, agg):
    kw = random_batch(seed)
    full, _ = policy_loss(**kw, agg=agg)
    num_tokens = kw["mask"].sum().item()
    num_seqs = (kw["mask"].sum(1) > 0).sum().item()
    parts = []
    for rows in (slice(0, 3), slice(3, 6)):
        sub = {k: v[rows] for k, v in kw.items()}
        parts.append(policy_loss(**sub, agg=agg, num_tokens=num_tokens, num_seqs=num_seqs)[0])
    close(parts[0] + parts[1], full, atol=1e-12)


def test_identical_policies_give_unit_ratio_and_no_clipping():
    kw = random_batch(2)
    kw["logp"] = kw["old_logp"].clone().requires_grad_(True)
    ratio = importance_ratio(kw["logp"], kw["old_logp"], kw["mask"])
    assert torch.equal(ratio, torch.ones_like(ratio))
    _, m = policy_loss(**kw)
    assert m["ratio/mean"] == 1.0 and m["ratio/max"] == 1.0
    assert all(m[f"count/{p}_clip_{s}"] == 0 for p in ("own", "peer") for s in ("low", "high"))


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_nan_in_masked_positions_does_not_leak(name):
    kw = random_batch(3)
    pad = ~kw["mask"]
    assert pad.any()
    with torch.no_grad():
        kw["logp"][pad] = float("nan")
    old = kw["old_logp"].clone()
    old[pad] = float("inf")
    kw["old_logp"] = old
    loss, m = get_policy_loss(name)(**kw)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(kw["logp"].grad).all()
    assert torch.count_nonzero(kw["logp"].grad[pad]) == 0
    assert all(math.isfinite(v) for v in m.values())


def test_clip_metrics_split_by_population_and_sum():
    # own row: rho [1.5, 1.0] A+1 -> 1 high; peer row: rho [0.5, 0.5, 1.0] A-1 -> 2 low
    kw = batch([[1.5, 1.0, 1.0], [0.5, 0.5, 1.0]], [1.0, -1.0], peer=[False, True], mask=[[1, 1, 0], [1, 1, 1]])
    _, m = policy_loss(**kw)
    assert (m["tokens/own"], m["count/own_clip_high"], m["count/own_clip_low"]) == (2, 1, 0)
    assert (m["tokens/peer"], m["count/peer_clip_low"], m["count/peer_clip_high"]) == (3, 2, 0)
    assert m["clip_frac/own_high"] == 0.5 and m["clip_frac/peer_low"] == pytest.approx(2 / 3)
    assert m["ratio/max"] == pytest.approx(1.5) and m["ratio/mean"] == pytest.approx(4.5 / 5)


# ------------------------------------------------------------------ ablation switches

def test_sequence_level_ratio():
    # log ratios [ln 2, 0], A +1. token: (1.28 + 1)/2 = 1.14; sequence: exp(ln2 / 2) = 1.414 -> clipped 1.28
    kw = batch([[2.0, 1.0]], [1.0])
    tok, mt = policy_loss(**kw, ratio_level="token")
    seq, ms = policy_loss(**kw, ratio_level="sequence")
    close(tok, -1.14)
    close(seq, -1.28)
    assert mt["count/own_clip_high"] == 1 and ms["count/own_clip_high"] == 2
    close(importance_ratio(kw["logp"], kw["old_logp"], kw["mask"], "sequence"), [[math.sqrt(2)] * 2])


def test_sequence_level_ratio_ignores_padding_and_matches_token_for_constant_ratios():
    kw = batch([[1.1, 1.1, 50.0]], [1.0], mask=[[1, 1, 0]])
    close(policy_loss(**kw, ratio_level="sequence")[0], policy_loss(**kw, ratio_level="token")[0])
    close(policy_loss(**kw)[0], -1.1)


def test_luffy_differs_from_graft_only_on_peer_tokens():
    # own row: rho [1.5, 0.9] A+1 -> 1.28 and 0.9; peer row: pi = .5, rho 1, A +1, w 1
    kw = batch([[1.5, 0.9], [1.0, 1.0]], [1.0, 1.0], peer=[False, True], mask=[[1, 1], [1, 0]])
    g_loss, _ = policy_loss(**kw)
    g_grad = torch.autograd.grad(g_loss, kw["logp"])[0]
    l_loss, lm = luffy_loss(**kw, gamma=0.1)
    l_grad = torch.autograd.grad(l_loss, kw["logp"])[0]
    # peer token: graft -1 (rho * A), luffy -f(.5) = -.5/.6 = -.833333; token-mean over 3 tokens
    close(l_loss - g_loss, (-0.5 / 0.6 + 1.0) / 3)
    close(l_grad[0], g_grad[0])
    # d/dlogp of -pi/(pi+g): -g*pi/(pi+g)^2 = -.1*.5/.36 = -.138889; graft: -rho = -1
    close(l_grad[1, 0], -0.1 * 0.5 / 0.36 / 3)
    close(g_grad[1, 0], -1.0 / 3)
    assert lm["luffy/peer_prob_mean"] == pytest.approx(0.5)


def test_luffy_never_clips_peer_tokens():
    kw = batch([[3.0], [3.0]], [1.0, 1.0], peer=[False, True])
    _, g = policy_loss(**kw)
    _, l = luffy_loss(**kw)
    assert g["count/peer_clip_high"] == 1 and l["count/peer_clip_high"] == 0 and l["count/own_clip_high"] == 1


def test_luffy_applies_weights_to_peer_rows():
    kw = batch([[1.0]], [1.0], weights=[0.5], peer=[True])
    close(luffy_loss(**kw)[0], -0.5 * 0.5 / 0.6)


def test_sgt_adds_nll_only_on_sgt_rows():
    # rows: own (rho 1.5, A +1), sgt peer success with pi = [.5, .25]
    kw = batch([[1.5, 1.0], [1.0, 0.5]], [1.0, 0.7], weights=[1.0, 0.3], peer=[False, True])
    own_only = {k: v[:1] for k, v in kw.items()}
    pg, _ = policy_loss(**own_only)                   # (-1.28 - 1) / 2
    nll = (LN2 + 2 * LN2) / 2                         # -(ln .5 + ln .25)/2 = 1.039721
    loss, m = sgt_loss(**kw, coef=2.0)
    close(loss, pg + 2.0 * nll, atol=1e-7)
    assert m["sgt/nll"] == pytest.approx(nll) and m["tokens/sgt"] == 2 and m["tokens/peer"] == 0
    grad = torch.autograd.grad(loss, kw["logp"])[0]
    close(grad[1], [-1.0, -1.0])                      # -coef / 2 sgt tokens; no advantage, no weight


def test_sgt_without_sgt_rows_is_policy_loss():
    kw = random_batch(4)
    none = torch.zeros(6, dtype=torch.bool)
    close(sgt_loss(**kw, sgt_mask=none)[0], policy_loss(**kw)[0], atol=0)


def test_sgt_explicit_mask_overrides_is_peer():
    kw = random_batch(5)
    sgt = torch.tensor([False, False, False, False, True, False])
    pg_mask = kw["mask"] & ~sgt[:, None]
    expected = policy_loss(**{**kw, "mask": pg_mask})[0]
    tok = kw["mask"][4]
    expected = expected + 0.5 * (-kw["logp"][4][tok]).mean()
    close(sgt_loss(**kw, sgt_mask=sgt, coef=0.5)[0], expected, atol=1e-12)


def test_hacpo_peer_rows_unclipped_and_seq_mean_default():
    # own: 1 token rho 1.5 A+1 -> -1.28. peer (w .85): rho [1.5, 1.0] A+1 -> [-1.275, -.85], row mean -1.0625
    kw = batch([[1.5, 1.0], [1.5, 1.0]], [1.0, 1.0], weights=[1.0, 0.85], peer=[False, True], mask=[[1, 0], [1, 1]])
    loss, m = hacpo_loss(**kw)
    close(loss, (-1.28 - 1.0625) / 2)
    close(hacpo_loss(**kw, agg="token-mean")[0], (-1.28 - 1.275 - 0.85) / 3)
    # graft clips the peer's 1.5 to 1.28: (-1.28 + (-.85*1.28 - .85)/2)/2
    close(policy_loss(**kw, agg="seq-mean-token-mean")[0], (-1.28 + (-0.85 * 1.28 - 0.85) / 2) / 2)
    assert m["count/own_clip_high"] == 1 and m["count/peer_clip_high"] == 0


def test_hacpo_own_rows_match_graft():
    kw = random_batch(6)
    kw["is_peer"] = torch.zeros(6, dtype=torch.bool)
    close(hacpo_loss(**kw)[0], policy_loss(**kw, agg="seq-mean-token-mean")[0], atol=0)


# ------------------------------------------------------------------ registry

def test_registry_and_uniform_interface():
    assert set(POLICY_LOSSES) == {"graft", "luffy", "sgt", "hacpo"}
    extra = {"graft": {}, "luffy": {"gamma": 0.1}, "sgt": {"coef": 1.0, "sgt_mask": torch.zeros(6, dtype=torch.bool)}, "hacpo": {}}
    for name, fn in POLICY_LOSSES.items():
        assert get_policy_loss(name) is fn
        kw = random_batch(7)
        loss, m = get_policy_loss(name)(**kw, clip_low=0.2, clip_high=0.28, agg="token-mean", ratio_level="token",
                                        num_tokens=None, num_seqs=None, **extra[name])
        assert loss.dim() == 0 and torch.isfinite(loss)
        counts = {f"count/{p}_clip_{s}" for p in ("own", "peer") for s in ("low", "high")}
        assert counts | {"clip_frac/own_low", "clip_frac/peer_high", "tokens/own", "tokens/peer", "ratio/mean"} <= set(m)
        assert all(isinstance(v, (int, float)) for v in m.values())
    with pytest.raises(ValueError, match="unknown update rule 'ppo'; valid: graft, hacpo, luffy, sgt"):
        make_rule(_with_rule("ppo"), 0.5)


def _with_rule(name):
    uc = UpdateConfig()
    object.__setattr__(uc, "rule", name)
    return uc


def test_merged_micro_batch_metrics_equal_the_whole_batch():
    """issue 10 item 8: ratio/mean, ratio/max, luffy/peer_prob_mean and sgt/nll survive aggregation:
    the summary of merged micro-batch totals equals the summary of one call over the whole batch."""
    torch.manual_seed(0)
    for name, extra in (("graft", {}), ("luffy", {"gamma": 0.1}), ("sgt", {"coef": 1.0})):
        kw = random_batch(6)
        if name == "sgt":
            extra = {"coef": 1.0, "sgt_mask": torch.tensor([True, False, True, False, False, True])}
        whole = get_policy_loss(name)(**kw, **extra)[1]
        totals = {}
        for part in (slice(0, 2), slice(2, 6)):
            sub = {k: (v[part] if torch.is_tensor(v) and v.dim() >= 1 else v) for k, v in kw.items()}
            sub_extra = {k: (v[part] if torch.is_tensor(v) else v) for k, v in extra.items()}
            merge(totals, get_policy_loss(name)(**sub, **sub_extra)[1])
        merged = summarize(totals)
        keys = {"graft": ["ratio/mean", "ratio/max"], "luffy": ["luffy/peer_prob_mean", "ratio/mean"],
                "sgt": ["sgt/nll", "ratio/max"]}[name]
        for key in keys:
            assert merged[key] == pytest.approx(whole[key], rel=1e-6), (name, key)
        assert merged["ratio/max"] > 1.0 or name == "sgt"


def test_unknown_ratio_level_raises():
    with pytest.raises(ValueError, match="token, sequence"):
        policy_loss(**batch([[1.0]], [1.0]), ratio_level="geo")


def test_zero_global_counts_give_zero_not_nan():
    # A micro-batch of only SGT rows: the policy-gradient part has no tokens (num_tokens = 0),
    # and a minibatch without SGT rows has num_sgt_tokens = 0; neither may produce NaN.
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask = torch.ones(1, 2)
    kw = dict(old_logp=logp.detach(), advantages=torch.tensor([0.0]), weights=torch.tensor([1.0]), mask=mask,
              is_peer=torch.tensor([True]))
    loss, _ = sgt_loss(logp, **kw, sgt_mask=torch.tensor([True]), num_tokens=0.0, num_seqs=0.0, num_sgt_tokens=2.0)
    # NLL token-mean: (1 + 2) / 2 = 1.5; the empty policy-gradient part adds 0
    assert float(loss) == pytest.approx(1.5, abs=1e-7)
    loss, _ = sgt_loss(logp, **kw, sgt_mask=torch.tensor([False]), num_tokens=2.0, num_seqs=1.0, num_sgt_tokens=0.0)
    assert torch.isfinite(loss) and float(loss) == 0.0
