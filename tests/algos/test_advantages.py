import math

import pytest
import torch

from graft.algos.advantages import (
    RollingRate,
    all_correct_advantages,
    grpo_advantages,
    hacpo_advantages,
    pooled_advantages,
    success_counts,
)

EPS = 1e-6


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=0, atol=atol)


def test_success_counts_threshold_is_strictly_above_half():
    rewards = torch.tensor([[1.0, 0.0, 0.6, 0.4], [0.5, 0.5, 0.0, 0.0]])
    assert success_counts(rewards, 0.5).tolist() == [2, 0]
    assert success_counts(rewards, 0.5).dtype == torch.long


def test_grpo_one_success_of_four_unbiased():
    # mean .25; deviations [.75, -.25, -.25, -.25]; unbiased var (.5625 + 3*.0625)/3 = .25 -> std .5
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), eps=EPS)
    close(adv, [[0.75 / (0.5 + EPS), -0.25 / (0.5 + EPS), -0.25 / (0.5 + EPS), -0.25 / (0.5 + EPS)]])
    close(adv, [[1.5, -0.5, -0.5, -0.5]], atol=1e-5)


def test_grpo_biased_std():
    # biased var .75/4 = .1875 -> std .4330127
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), eps=EPS, unbiased=False)
    std = math.sqrt(0.1875)
    close(adv, [[0.75 / (std + EPS), -0.25 / (std + EPS), -0.25 / (std + EPS), -0.25 / (std + EPS)]])


def test_grpo_eps_is_used():
    # [1,1,0,0]: mean .5, unbiased std sqrt(1/3) = .5773503; with eps 1e-4 (TRL)
    adv = grpo_advantages(torch.tensor([[1.0, 1.0, 0.0, 0.0]]), eps=1e-4)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    close(adv, [[a, a, -a, -a]])


@pytest.mark.parametrize("row", [[0.0] * 8, [1.0] * 8, [0.1] * 3, [0.7] * 5])
def test_grpo_zero_variance_is_exactly_zero(row):
    adv = grpo_advantages(torch.tensor([row]))
    assert torch.equal(adv, torch.zeros_like(adv))


def test_grpo_single_sample_group_is_zero():
    assert torch.equal(grpo_advantages(torch.tensor([[1.0], [0.0]])), torch.zeros(2, 1))


def test_grpo_rows_are_independent():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    full = grpo_advantages(rewards)
    for i in range(3):
        close(full[i : i + 1], grpo_advantages(rewards[i : i + 1]))


def test_pooled_advantages_hand_case():
    # joint [0,0,0,0 | 1,0]: mean 1/6, unbiased var (5*(1/6)^2 + (5/6)^2)/5 = 1/6 -> std .4082483
    own, peer = pooled_advantages(torch.zeros(4), torch.tensor([1.0, 0.0]), eps=EPS)
    std = math.sqrt(1 / 6)
    close(own, [-(1 / 6) / (std + EPS)] * 4)
    close(peer, [(5 / 6) / (std + EPS), -(1 / 6) / (std + EPS)])


def test_pooled_differs_from_frozen_source_advantages():
    peer = torch.tensor([1.0, 0.0])
    _, pooled = pooled_advantages(torch.zeros(4), peer)
    frozen = grpo_advantages(peer[None])[0]
    assert not torch.allclose(pooled, frozen)


def test_all_correct_advantages_constant():
    assert torch.equal(all_correct_advantages(3, 0.5), torch.tensor([0.5, 0.5, 0.5]))
    assert all_correct_advantages(0, 1.0).shape == (0,)


def test_hacpo_capability_baseline():
    # omega_peer = .2/.8 = .25; b = mean([0, 1, .25, .25]) = .375
    # joint [0,1,1,1]: mean .75, unbiased std .5 -> adv = (r - .375)/.5
    own, peer = hacpo_advantages(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0]), p_learner=0.2, p_source=0.8, eps=EPS)
    close(own, [-0.375 / (0.5 + EPS), 0.625 / (0.5 + EPS)])
    close(peer, [0.625 / (0.5 + EPS)] * 2)


def test_hacpo_ratio_is_clamped():
    # raw ratio .01/1 = .01 -> clamped .1; b = (0 + 1 + .1 + 0)/4 = .275 (unclamped would be .2525)
    # joint [0,1,1,0]: unbiased std sqrt(1/3)
    own, peer = hacpo_advantages(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0]), p_learner=0.01, p_source=1.0, eps=EPS)
    std = math.sqrt(1 / 3) + EPS
    close(own, [-0.275 / std, 0.725 / std])
    close(peer, [0.725 / std, -0.275 / std])


def test_hacpo_baseline_above_one_falls_back_to_own_mean():
    # ratio 1/.1 = 10; b = mean([0,0,10,10]) = 5 > 1 -> b = mean(own) = 0
    # joint [0,0,1,1]: unbiased std sqrt(1/3)
    own, peer = hacpo_advantages(torch.zeros(2), torch.ones(2), p_learner=1.0, p_source=0.1, eps=EPS)
    close(own, [0.0, 0.0])
    close(peer, [1 / (math.sqrt(1 / 3) + EPS)] * 2)


def test_hacpo_identical_rewards_use_plain_mean_and_give_zero():
    own, peer = hacpo_advantages(torch.ones(3), torch.ones(2), p_learner=0.1, p_source=0.9)
    assert torch.equal(own, torch.zeros(3)) and torch.equal(peer, torch.zeros(2))


def test_hacpo_equal_rates_match_pooled():
    own_r, peer_r = torch.tensor([0.0, 1.0, 0.0]), torch.tensor([1.0, 1.0, 0.0])
    h_own, h_peer = hacpo_advantages(own_r, peer_r, p_learner=0.4, p_source=0.4)
    p_own, p_peer = pooled_advantages(own_r, peer_r)
    close(h_own, p_own)
    close(h_peer, p_peer)


def test_hacpo_zero_rates_are_finite():
    own, peer = hacpo_advantages(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0]), p_learner=0.0, p_source=0.0)
    assert torch.isfinite(own).all() and torch.isfinite(peer).all()


def test_rolling_rate_window_and_state():
    rate = RollingRate(window=3)
    assert rate.value == 1.0
    for r in (0.1, 0.2, 0.3, 0.4):
        rate.update(r)
    assert rate.value == pytest.approx(0.3)  # mean of the last three: .2 .3 .4
    other = RollingRate(window=99)
    other.load_state_dict(rate.state_dict())
    other.update(1.0)
    assert other.window == 3
    assert other.value == pytest.approx((0.3 + 0.4 + 1.0) / 3)
