"""Dynamic sampling's two decisions, worked by hand: which groups carry gradient, and which of a round fill the batch."""
from __future__ import annotations

import torch

from graft.algos.advantages import grpo_advantages
from graft.algos.dynamic import carries_gradient, fill, round_metrics


def test_a_group_of_equal_rewards_carries_no_gradient():
    # rewards per group (n = 4): all fail, all succeed, 0.3 everywhere (a continuous reward, all-fail at 0.5 too),
    # one success, two equal halves of a continuous reward
    rewards = torch.tensor([[0., 0., 0., 0.], [1., 1., 1., 1.], [.3, .3, .3, .3], [1., 0., 0., 0.], [.2, .2, .7, .7]])
    adv = grpo_advantages(rewards)            # equal rewards: exactly 0 (not eps-sized residues)
    assert carries_gradient(adv, torch.ones_like(adv, dtype=torch.bool)).tolist() == [False, False, False, True, True]


def test_padding_is_ignored():
    # a peer group of 2 admitted responses padded to G = 4 with made-up nonzero values: only the real ones count
    adv = torch.tensor([[0.0, 0.0, 9.0, 9.0], [0.5, -0.5, 9.0, 9.0]])
    mask = torch.tensor([[True, True, False, False], [True, True, False, False]])
    assert carries_gradient(adv, mask).tolist() == [False, True]


def test_a_batch_filled_from_rounds_where_half_the_groups_carry_nothing():
    # target 4 groups; each round samples 4 prompts of which the 2nd and 4th have zero variance.
    # round 1 keeps groups 0 and 2 (2 of 4); round 2 keeps its 0 and 2 (4 of 4): full after 2 rounds, 4 of 8 kept.
    target, kept, rounds, sampled = 4, 0, 0, 0
    round_keep = torch.tensor([True, False, True, False])
    while kept < target and rounds < 3:
        take = fill(round_keep, kept, target)
        kept, rounds, sampled = kept + int(take.sum()), rounds + 1, sampled + len(round_keep)
    assert (kept, rounds) == (4, 2)
    assert round_metrics(sampled, kept, rounds) == {"dynamic/rounds": 2, "dynamic/sampled": 8, "dynamic/kept": 4,
                                                    "dynamic/kept_frac": 0.5}


def test_a_round_fills_only_the_room_left_and_the_rounds_can_run_out():
    # 3 of 4 kept already: of [T, T, F, T] only the first fits
    assert fill(torch.tensor([True, True, False, True]), kept=3, target=4).tolist() == [True, False, False, False]
    # a full batch takes nothing
    assert not fill(torch.tensor([True, True]), kept=4, target=4).any()
    # every group of every round carries nothing: 3 rounds run out with 0 kept
    kept = 0
    for _ in range(3):
        kept += int(fill(torch.zeros(4, dtype=torch.bool), kept, 4).sum())
    assert kept == 0 and round_metrics(12, 0, 3)["dynamic/kept_frac"] == 0.0


def test_a_pool_where_half_the_groups_have_zero_variance_fills_in_three_rounds():
    # 12 groups of n = 4 binary rewards, drawn 4 per round in order; 6 of them have zero variance (Z), 6 mixed (M):
    #   round 1: Z Z M Z   -> carries [F F T F]: keeps group 2               (1 of 4 kept)
    #   round 2: Z M Z M   -> carries [F T F T]: keeps groups 5 and 7       (3 of 4)
    #   round 3: M M Z M   -> carries [T T F T]: room for 1, keeps group 8  (4 of 4: full)
    # 3 rounds, 12 groups sampled, 4 kept: kept_frac 4 / 12 = 1/3
    Z0, Z1, M = [0.0] * 4, [1.0] * 4, [1.0, 0.0, 0.0, 1.0]
    pool = torch.tensor([Z0, Z1, M, Z0, Z1, M, Z0, M, M, M, Z1, M])
    assert int((pool.std(dim=1) == 0).sum()) == 6
    adv = grpo_advantages(pool)
    carries = carries_gradient(adv, torch.ones_like(adv, dtype=torch.bool))
    target, kept, rounds, taken = 4, 0, 0, []
    while kept < target and rounds < 3:
        take = fill(carries[4 * rounds : 4 * rounds + 4], kept, target)
        taken += (4 * rounds + torch.nonzero(take).flatten()).tolist()
        kept, rounds = kept + int(take.sum()), rounds + 1
    assert taken == [2, 5, 7, 8] and rounds == 3
    assert round_metrics(12, kept, rounds) == {"dynamic/rounds": 3, "dynamic/sampled": 12, "dynamic/kept": 4,
                                               "dynamic/kept_frac": 4 / 12}
