import random

import pytest
import torch

from graft.algos.minibatch import plan_minibatches

PEER = [False, True, False, True, False]


def test_peer_last_hand_case():
    # own 0,2,4 then peer 1,3; 5 groups in 2 minibatches -> sizes 3, 2
    assert plan_minibatches(PEER, 2, "peer_last") == [[0, 2, 4], [1, 3]]
    assert plan_minibatches(PEER, 3, "peer_last") == [[0, 2], [4, 1], [3]]


def test_peer_first_hand_case():
    assert plan_minibatches(PEER, 2, "peer_first") == [[1, 3, 0], [2, 4]]


def test_fewer_groups_than_minibatches():
    assert plan_minibatches([True, False], 4) == [[1], [0]]
    assert plan_minibatches([], 4) == []


def test_random_order_is_seeded_permutation():
    flags = [i % 3 == 0 for i in range(10)]
    a = plan_minibatches(flags, 4, "random", torch.Generator().manual_seed(1))
    b = plan_minibatches(flags, 4, "random", torch.Generator().manual_seed(1))
    c = plan_minibatches(flags, 4, "random", torch.Generator().manual_seed(2))
    assert a == b and a != c
    assert sorted(i for mb in a for i in mb) == list(range(10))


def test_unknown_order_raises():
    with pytest.raises(ValueError, match="peer_last, peer_first, random"):
        plan_minibatches(PEER, 2, "sorted")


@pytest.mark.parametrize("order", ["peer_last", "peer_first", "random"])
def test_partition_and_balance_over_random_inputs(order):
    rng = random.Random(order)
    for trial in range(200):
        n = rng.randint(0, 40)
        flags = [rng.random() < rng.random() for _ in range(n)]
        k = rng.randint(1, 8)
        plan = plan_minibatches(flags, k, order, torch.Generator().manual_seed(trial))
        assert sorted(i for mb in plan for i in mb) == list(range(n))
        assert len(plan) == min(k, n) and all(plan)
        if plan:
            sizes = [len(mb) for mb in plan]
            assert max(sizes) - min(sizes) <= 1
        has_peer = [any(flags[i] for i in mb) for mb in plan]
        own_only = [all(not flags[i] for i in mb) for mb in plan]
        if order == "peer_last":  # every own-only minibatch precedes every peer-containing one
            assert has_peer == sorted(has_peer)
        if order == "peer_first":  # every peer-containing minibatch precedes every own-only one
            assert own_only == sorted(own_only)
