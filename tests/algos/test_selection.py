import pytest
import torch

from graft.algos.selection import (
    balanced_selection,
    balanced_targets,
    candidate_mask,
    capped_selection,
    random_selection,
    top_with_ties,
)

T, F = True, False


def b(*xs):
    return torch.tensor(xs, dtype=torch.bool)


def k(*xs):
    return torch.tensor(xs, dtype=torch.long)


def test_candidate_mask_excludes_all_correct_and_receiver_successes():
    k_r = k(0, 0, 0, 0, 1)
    k_s = k(0, 1, 7, 8, 3)  # n = 8: k_S=0 no success, k_S=8 all-correct, k_R=1 not all-fail
    assert candidate_mask(k_r, k_s, n=8).tolist() == [F, T, T, F, F]
    assert candidate_mask(k_r, k_s, n=8, include_all_correct=True).tolist() == [F, T, T, T, F]


def test_top_with_ties_keeps_every_tie_at_the_boundary():
    ks, cand = k(5, 3, 3, 2), b(T, T, T, T)
    assert top_with_ties(ks, cand, 2).tolist() == [T, T, T, F]  # m-th is a 3, so both 3s: 3 prompts
    assert top_with_ties(ks, cand, 1).tolist() == [T, F, F, F]
    assert top_with_ties(ks, cand, 3).tolist() == [T, T, T, F]
    assert top_with_ties(ks, cand, 4).tolist() == [T, T, T, T]
    assert top_with_ties(ks, cand, 10).tolist() == [T, T, T, T]


def test_top_with_ties_m_zero_and_non_candidates():
    assert not top_with_ties(k(5, 3), b(T, T), 0).any()
    assert top_with_ties(k(9, 5, 3, 3), b(F, T, T, T), 1).tolist() == [F, T, F, F]
    assert not top_with_ties(k(9, 5), b(F, F), 3).any()


def test_balanced_min_ranks_and_ties():
    # |C_AB| = 4, |C_BA| = 2 -> m = 2; AB keeps 5 and both tied 3s, BA keeps both
    keep_ab, keep_ba, m = balanced_selection(k(5, 3, 3, 2, 0), b(T, T, T, T, F), k(2, 0, 0, 0, 4), b(T, F, F, F, T), "min")
    assert keep_ab.tolist() == [T, T, T, F, F]
    assert keep_ba.tolist() == [T, F, F, F, T]
    assert m == {"m_ab": 2, "m_ba": 2, "candidates_ab": 4, "candidates_ba": 2, "kept_ab": 3, "kept_ba": 2}


def test_balanced_min_with_empty_direction_exchanges_nothing():
    keep_ab, keep_ba, m = balanced_selection(k(5, 3), b(T, T), k(0, 0), b(F, F), "min")
    assert not keep_ab.any() and not keep_ba.any()
    assert m["m_ab"] == m["m_ba"] == 0 and m["candidates_ab"] == 2


def test_balance_none_keeps_all_candidates():
    keep_ab, keep_ba, m = balanced_selection(k(5, 3, 1), b(T, T, T), k(0, 0, 2), b(F, F, F), "none")
    assert keep_ab.tolist() == [T, T, T] and not keep_ba.any()
    assert (m["m_ab"], m["m_ba"], m["kept_ab"]) == (3, 0, 3)


def test_balance_asymmetric_counts():
    # |C_AB| = 6, |C_BA| = 1, ratio 2, floor 1: m_AB = min(6, ceil(2*1)+1) = 3; m_BA = min(1, 13) = 1
    assert balanced_targets(6, 1, "asymmetric", 2.0, 1) == (3, 1)
    # other side empty: m_AB = min(6, 0 + 1) = 1 (min-balancing would give 0)
    assert balanced_targets(6, 0, "asymmetric", 2.0, 1) == (1, 0)
    assert balanced_targets(6, 0, "min") == (0, 0)
    # ratio 1.5 * 3 = 4.5 -> ceil 5, + floor 0 = 5
    assert balanced_targets(9, 3, "asymmetric", 1.5, 0) == (5, 3)
    ks = k(8, 7, 6, 5, 4, 3, 0)
    cand_ab, cand_ba = b(T, T, T, T, T, T, F), b(F, F, F, F, F, F, T)
    keep_ab, keep_ba, m = balanced_selection(ks, cand_ab, k(0, 0, 0, 0, 0, 0, 2), cand_ba, "asymmetric", 2.0, 1)
    assert keep_ab.tolist() == [T, T, T, F, F, F, F] and keep_ba.tolist() == [F] * 6 + [T]
    assert (m["m_ab"], m["m_ba"], m["kept_ab"], m["kept_ba"]) == (3, 1, 3, 1)


def test_unknown_balance_raises():
    with pytest.raises(ValueError, match="min, none, asymmetric"):
        balanced_selection(k(1), b(T), k(1), b(T), "bogus")


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("balance", ["min", "none", "asymmetric"])
def test_swapping_directions_swaps_outputs(seed, balance):
    g = torch.Generator().manual_seed(seed)
    n, p = 8, 24
    k_a = torch.randint(0, n + 1, (p,), generator=g) * (torch.rand(p, generator=g) < 0.6)
    k_b = torch.randint(0, n + 1, (p,), generator=g) * (torch.rand(p, generator=g) < 0.6)
    c_ab, c_ba = candidate_mask(k_b, k_a, n), candidate_mask(k_a, k_b, n)
    ab, ba, m = balanced_selection(k_a, c_ab, k_b, c_ba, balance)
    ba2, ab2, m2 = balanced_selection(k_b, c_ba, k_a, c_ab, balance)
    assert torch.equal(ab, ab2) and torch.equal(ba, ba2)
    assert m == {key.replace("ab", "X").replace("ba", "ab").replace("X", "ba"): v for key, v in m2.items()}
    assert not (ab & ~c_ab).any() and not (ba & ~c_ba).any()
    if balance == "min":
        assert min(int(ab.sum()), int(ba.sum())) >= m["m_ab"]


def test_random_selection_draws_only_from_pool():
    pool = b(T, F, T, T, F, T)
    for seed in range(10):
        keep = random_selection(pool, 2, torch.Generator().manual_seed(seed))
        assert int(keep.sum()) == 2 and not (keep & ~pool).any()
    assert torch.equal(random_selection(pool, 10, torch.Generator()), pool)
    assert not random_selection(pool, 0, torch.Generator()).any()
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(random_selection(pool, 2, g1), random_selection(pool, 2, g2))


def test_random_selection_is_roughly_uniform():
    pool = b(T, T, T, T)
    g = torch.Generator().manual_seed(0)
    counts = sum(random_selection(pool, 1, g).long() for _ in range(400))
    assert counts.min() > 60  # expected 100 each


def test_capped_selection():
    ks, cand = k(5, 3, 3, 2), b(T, T, T, F)
    assert torch.equal(capped_selection(ks, cand, None), cand)
    assert capped_selection(ks, cand, 2).tolist() == [T, T, T, F]  # tie at the cap kept
    assert capped_selection(ks, cand, 1).tolist() == [T, F, F, F]
    assert not capped_selection(ks, cand, 0).any()


def test_resolve_conflicts_keys_and_ties():
    from graft.algos.selection import resolve_conflicts

    # sources S0, S1, S2 (model order) x prompts q0..q3
    keep = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0], [0, 1, 1, 0]], dtype=torch.bool)
    k = torch.tensor([[2, 3, 0, 1], [2, 1, 2, 0], [0, 3, 2, 0]])
    s = torch.tensor([[0.9, 0.8, 0.0, 0.7], [0.95, 0.99, 0.85, 0.0], [0.0, 0.9, 0.85, 0.0]])
    # q0: S0 (k2, s.9) vs S1 (k2, s.95): k ties -> s -> S1.   q1: S0 (3, .8), S1 (1, .99), S2 (3, .9): k -> S0|S2, s -> S2
    # q2: S1 (2, .85) vs S2 (2, .85): full tie -> earlier model S1.   q3: S0 alone.
    won = resolve_conflicts(keep, k, s, "most_successes")
    assert won.int().tolist() == [[0, 0, 0, 1], [1, 0, 1, 0], [0, 1, 0, 0]]
    # most_compatible: q0 -> S1 (.95), q1 -> S1 (.99), q2 -> tie on s and k -> S1
    assert resolve_conflicts(keep, k, s, "most_compatible").int().tolist() == [[0, 0, 0, 1], [1, 1, 1, 0], [0, 0, 0, 0]]
    assert resolve_conflicts(keep, k, s, "model_order").int().tolist() == [[1, 1, 0, 1], [0, 0, 1, 0], [0, 0, 0, 0]]
    one = keep[:1]
    assert torch.equal(resolve_conflicts(one, k[:1], s[:1]), one)   # a single source never conflicts
