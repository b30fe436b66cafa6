import math

import pytest
import torch

from graft.algos.gating import compatibility_scores, gate, hacpo_peer_weights, length_deltas

S = torch.tensor([0.5, 0.8, 0.81, 1.2])  # delta .8: drop .5 and exactly .8, admit .81 and 1.2


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=0, atol=atol)


def test_compatibility_identical_is_exactly_one():
    lp = torch.tensor([-0.7, -2.3, -0.01, 0.0])
    assert torch.equal(compatibility_scores(lp, lp.clone()), torch.ones(4))


def test_compatibility_hand_value_and_finite():
    # exp(-0.7 - (-0.6)) = exp(-0.1) = 0.904837
    close(compatibility_scores(torch.tensor([-0.7]), torch.tensor([-0.6])), [math.exp(-0.1)])
    s = compatibility_scores(torch.tensor([0.0, -100.0]), torch.tensor([-100.0, 0.0]))
    assert torch.isfinite(s).all() and s[0] == math.exp(20)


def test_length_deltas_smallest_bound_at_or_above():
    lengths = torch.tensor([1, 16, 17, 64, 65])
    close(length_deltas(lengths, {64: 0.7, 16: 0.5}, default=0.8), [0.5, 0.5, 0.7, 0.7, 0.8])
    close(length_deltas(lengths, {}, default=0.8), [0.8] * 5)


def test_gate_drops_at_exactly_delta_and_caps_weight():
    admitted, w, m = gate(S, 0.8)
    assert admitted.tolist() == [False, False, True, True]
    close(w, [0.0, 0.0, 0.81, 1.0])  # min(s, 1) for admitted, 0 for dropped
    assert m["admitted"] == 2 and m["transferred"] == 4 and m["admitted_frac"] == 0.5
    assert m["s_mean"] == pytest.approx((0.5 + 0.8 + 0.81 + 1.2) / 4, abs=1e-6)


def test_gate_custom_cap_and_zero_delta():
    _, w, _ = gate(S, 0.8, cap=1.1)
    close(w, [0.0, 0.0, 0.81, 1.1])
    admitted, _, _ = gate(torch.tensor([0.0, 1e-9]), 0.0)  # delta 0 still drops s == 0
    assert admitted.tolist() == [False, True]


def test_gate_per_response_delta():
    admitted, _, _ = gate(S, torch.tensor([0.4, 0.9, 0.9, 1.2]))
    assert admitted.tolist() == [True, False, False, False]


def test_weighting_none_gives_unit_weight():
    admitted, w, _ = gate(S, 0.8, weighting="none")
    assert admitted.tolist() == [False, False, True, True]
    close(w, [0.0, 0.0, 1.0, 1.0])


@pytest.mark.parametrize("seed", range(10))
def test_random_admission_same_count_as_gate(seed):
    s = torch.rand(12, generator=torch.Generator().manual_seed(100 + seed)) * 1.5
    gated, _, _ = gate(s, 0.8)
    admitted, w, m = gate(s, 0.8, admission="random", generator=torch.Generator().manual_seed(seed))
    assert int(admitted.sum()) == int(gated.sum()) == m["admitted"]
    close(w, torch.where(admitted, s.clamp(max=1.0), torch.zeros_like(s)))


def test_random_admission_differs_from_gate_for_some_seed():
    gated, _, _ = gate(S, 0.8)
    draws = [gate(S, 0.8, admission="random", generator=torch.Generator().manual_seed(i))[0] for i in range(20)]
    assert any(not torch.equal(d, gated) for d in draws)


def test_admission_all():
    admitted, w, m = gate(S, 0.8, admission="all")
    assert admitted.all() and m["admitted_frac"] == 1.0
    close(w, [0.5, 0.8, 0.81, 1.0])
    _, w_none, _ = gate(S, 0.8, admission="all", weighting="none")  # the no-compatibility ablation
    close(w_none, [1.0] * 4)


def test_gate_metrics_quantiles_and_empty():
    s = torch.arange(11, dtype=torch.float32) / 10  # 0, .1, ..., 1
    _, _, m = gate(s, 0.8)
    assert (m["s_p10"], m["s_p50"], m["s_p90"]) == pytest.approx((0.1, 0.5, 0.9), abs=1e-6)
    admitted, w, m = gate(torch.zeros(0), 0.8)
    assert admitted.shape == w.shape == (0,)
    # nothing transferred: counts are 0, and no score was observed, so the share and the s statistics
    # are NaN (null in metrics.jsonl) rather than a 0 that a plot would draw as "every s was 0"
    assert m["transferred"] == 0 and m["admitted"] == 0
    assert all(math.isnan(m[k]) for k in ("admitted_frac", "s_mean", "s_p10", "s_p50", "s_p90"))


def test_gate_metrics_median_of_admitted_beside_median_of_all_transferred():
    """S with δ 0.8 admits 0.81 and 1.2: the median s of every transferred response is (0.8 + 0.81) / 2 = 0.805,
    the admitted ones' (0.81 + 1.2) / 2 = 1.005. Nothing admitted: no admitted score to read -> NaN."""
    _, _, m = gate(S, 0.8)
    assert m["s_p50"] == pytest.approx(0.805) and m["s_p50_admitted"] == pytest.approx(1.005)
    _, _, m = gate(S, 2.0)
    assert m["admitted"] == 0 and m["s_p50"] == pytest.approx(0.805) and math.isnan(m["s_p50_admitted"])
    assert math.isnan(gate(torch.zeros(0), 0.8)[2]["s_p50_admitted"])


def test_gate_unknown_modes_raise():
    with pytest.raises(ValueError, match="gate, random, all"):
        gate(S, 0.8, admission="x")
    with pytest.raises(ValueError, match="compat, none"):
        gate(S, 0.8, weighting="x")


def test_hacpo_stepwise_weights():
    s = torch.tensor([0.5, 0.79, 0.85, 1.3])
    # lower = 1 - .2 + k*.025: k=0 -> .8, k=1 -> .825, k=2 -> .85; upper 1
    close(hacpo_peer_weights(s, 0.2, 0.025, 0), [0.8, 0.8, 0.85, 1.0])
    close(hacpo_peer_weights(s, 0.2, 0.025, 1), [0.825, 0.825, 0.85, 1.0])
    close(hacpo_peer_weights(s, 0.2, 0.025, 2), [0.85, 0.85, 0.85, 1.0])
    close(hacpo_peer_weights(s, 0.2, 0.025, 100), [1.0] * 4)  # lower bound capped at 1
    close(hacpo_peer_weights(s, 0.2, 0.025, 0, capability_ratio=2.0), [1.6, 1.6, 1.7, 2.0])


def test_hacpo_weights_log_clamp():
    # |log s| <= 10 first; with delta 1 the lower bound is 0, so the clamp is visible
    close(hacpo_peer_weights(torch.tensor([0.0, 1e-6, 1e-4]), 1.0, 0.0, 0), [math.exp(-10), math.exp(-10), 1e-4], atol=1e-9)
