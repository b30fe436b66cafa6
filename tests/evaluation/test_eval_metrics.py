"""pass@k, mean ± std and complementarity against hand-computed values."""
import math

import pytest

from graft.evaluation.metrics import (chi2_cdf, chi2_quantile, clustered_interval, detectable_range, sign_flip_p,
                                      paired_interval, paired_verdict, t80, t975, unpaired_interval, complementarity, complementarity_counts, mean_std,
                                      pass_at_k, pass_at_k_from_rewards)


def comb_pass_at_k(n, c, k):
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize("n,c,k,expected", [
    (5, 2, 1, 0.4),          # c / n
    (5, 2, 2, 0.7),          # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (8, 1, 8, 1.0),          # k = n and one success
    (4, 0, 2, 0.0),          # no success
    (4, 3, 2, 1.0),          # n - c < k: every draw of 2 holds a success
    (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
])
def test_pass_at_k_known_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_combinatorial_formula():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = 1.0 if n - c < k else comb_pass_at_k(n, c, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_bad_arguments():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 2, 5)


def test_pass_at_1_from_rewards_hand_computed():
    rewards = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0]]
    # (2/4 + 0 + 4/4 + 1/4) / 4 = 1.75 / 4
    assert pass_at_k_from_rewards(rewards, 1, 0.5) == pytest.approx(0.4375)
    # pass@2: 1 - C(2,2)/C(4,2) = 5/6; 0; 1; 1 - C(3,2)/C(4,2) = 1/2  -> (5/6 + 0 + 1 + 1/2) / 4
    assert pass_at_k_from_rewards(rewards, 2, 0.5) == pytest.approx((5 / 6 + 1 + 0.5) / 4)
    assert math.isnan(pass_at_k_from_rewards([], 1, 0.5))


def test_mean_std_sample_std():
    m, s = mean_std([0.2, 0.4, 0.6])
    assert m == pytest.approx(0.4)
    assert s == pytest.approx(0.2)  # sqrt((0.04 + 0 + 0.04) / (3 - 1))
    m, s = mean_std([0.5, 0.25])
    assert (m, s) == pytest.approx((0.375, math.sqrt(2 * 0.125 ** 2)))
    assert mean_std([0.3]) == (0.3, 0.0)
    assert all(math.isnan(x) for x in mean_std([]))
    assert mean_std([0.1, float("nan"), 0.3]) == pytest.approx((0.2, math.sqrt(0.02)))


def test_complementarity_both_directions():
    k_a = [0, 0, 3, 0, 8]
    k_b = [2, 1, 0, 0, 1]
    # A all-fail: prompts 0, 1, 3; B solved 0 and 1 -> 2/3
    # B all-fail: prompts 2, 3; A solved 2 -> 1/2
    b_solves_a, a_solves_b = complementarity(k_a, k_b)
    assert b_solves_a == pytest.approx(2 / 3)
    assert a_solves_b == pytest.approx(1 / 2)
    assert complementarity_counts(k_b, k_a) == (1, 2)


def test_complementarity_nan_without_all_fail():
    x, y = complementarity([1, 2], [0, 0])
    assert math.isnan(x) and y == 1.0
    with pytest.raises(ValueError):
        complementarity([0], [0, 1])


def test_paired_interval_hand_worked():
    """[0.02, -0.01, 0.05]: mean 0.02, sd sqrt((0 + 0.0009 + 0.0009) / 2) = 0.03, se 0.03 / sqrt(3) = 0.017321,
    half-width t(0.975, 2) = 4.3027 times it = 0.074525; detectable at 80 % power (4.3027 + t(0.8, 2) = 1.0607)
    times it = 0.092897."""
    s = paired_interval([0.02, None, -0.01, 0.05])   # None: a pair not run yet
    assert s["n"] == 3 and s["mean"] == pytest.approx(0.02) and s["sd"] == pytest.approx(0.03)
    assert s["ci95"] == pytest.approx([0.02 - 0.074525, 0.02 + 0.074525], abs=1e-6)
    assert s["detectable"] == pytest.approx(0.092897, abs=1e-6)
    assert paired_interval([0.1]) == {"mean": 0.1, "ci95": [None, None], "sd": None, "detectable": None, "n": 1}
    assert paired_interval([None, None])["mean"] is None


def test_paired_verdict_waits_for_every_pair_then_reads_the_interval():
    """pairs 3: [0.02, -0.01, 0.05] -> [-0.0545, +0.0945] (above): not confirmed, though the mean is +0.02;
    [0.06, 0.07, 0.08] -> mean 0.07, sd 0.01, half-width 4.3027 * 0.01 / sqrt(3) = 0.024842 -> [0.045158,
    0.094842]: confirmed; [0.06, None, 0.08]: 2 of 3 pairs, waits (even with a positive two-pair interval-free mean)."""
    assert paired_verdict([0.02, -0.01, 0.05], 3)["verdict"] == "not confirmed"
    v = paired_verdict([0.06, 0.07, 0.08], 3)
    assert v["verdict"] == "confirmed" and v["pairs_required"] == 3 and v["n"] == 3
    assert v["ci95"] == pytest.approx([0.045158, 0.094842], abs=1e-6)
    assert paired_verdict([0.06, None, 0.08], 3)["verdict"] == "waits"
    assert paired_verdict([], 8)["verdict"] == "waits"
    assert paired_verdict([-0.06, -0.07, -0.08], 3)["verdict"] == "not confirmed"    # a loss is not a gain


def test_unpaired_interval_hand_worked():
    """xs [3, 5, 7] (mean 5, var 4), ys [1, 2, 3] (mean 2, var 1): diff 3, se sqrt(4/3 + 1/3) = 1.29099,
    Welch df (5/3)^2 / ((4/3)^2 / 2 + (1/3)^2 / 2) = 2.7778 / 0.9444 = 2.941 -> t(0.975, 2) = 4.3027, half-width
    5.55476. Mid-ranks 1, 2, 3.5, 3.5, 5, 6; xs' rank sum 14.5 vs its mean 10.5; 4 of the 20 splits lie >= 4 away
    ({3.5, 5, 6} twice, {1, 2, 3.5} twice) -> p 0.2."""
    s = unpaired_interval([3, None, 5, 7], [1, 2, 3])   # None: a run not in yet
    assert s["diff"] == pytest.approx(3.0) and s["n"] == [3, 3] and s["df"] == pytest.approx(2.941176, abs=1e-6)
    assert s["ci95"] == pytest.approx([3 - 5.554762, 3 + 5.554762], abs=1e-6)
    assert s["p_rank_sum"] == pytest.approx(0.2)
    # arms swapped: the difference flips, the p does not
    r = unpaired_interval([1, 2, 3], [3, 5, 7])
    assert r["diff"] == pytest.approx(-3.0) and r["p_rank_sum"] == pytest.approx(0.2)
    # complete separation of 4 vs 4: 2 of C(8, 4) = 70 splits are as extreme -> p = 2/70
    assert unpaired_interval([5, 6, 7, 8], [1, 2, 3, 4])["p_rank_sum"] == pytest.approx(2 / 70)
    assert unpaired_interval([1], [2]) == {"diff": -1.0, "ci95": [None, None], "df": None, "p_rank_sum": 1.0, "n": [1, 1]}
    assert unpaired_interval([], [1, 2])["diff"] is None


def test_unpaired_interval_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    xs, ys = [0.42, 0.36, 0.40, 0.38, 0.45, 0.33, 0.41, 0.39], [0.35, 0.37, 0.31, 0.36, 0.34, 0.38, 0.30, 0.36]
    s = unpaired_interval(xs, ys)
    w = stats.ttest_ind(xs, ys, equal_var=False)
    assert s["df"] == pytest.approx(w.df, rel=1e-9)
    half = stats.t.ppf(0.975, math.floor(w.df)) * (s["diff"] / w.statistic)
    assert s["ci95"] == pytest.approx([s["diff"] - half, s["diff"] + half], abs=1e-4)
    assert s["p_rank_sum"] == pytest.approx(stats.permutation_test(
        (xs, ys), lambda a, b: sum(stats.rankdata(list(a) + list(b))[: len(a)]), permutation_type="independent",
        n_resamples=math.inf, alternative="two-sided").pvalue, abs=1e-9)


def test_t_quantiles_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 4, 9, 30, 31, 60, 200):
        assert t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-4), df
        assert t80(df) == pytest.approx(stats.t.ppf(0.8, df), abs=1e-4), df


def test_detectable_effect_matches_the_study_plans_power_statement():
    """STUDY.md §4: 5 pairs detect (t(0.975, 4) + t(0.8, 4)) · sd / sqrt(5) = (2.7764 + 0.9410) / 2.2361 · sd
    = 1.6625 · sd. Any five differences with sd 1 give that factor."""
    xs = [-1.0, -0.5, 0.0, 0.5, 1.0]
    sd = math.sqrt(sum(x * x for x in xs) / 4)
    assert paired_interval([x / sd for x in xs])["detectable"] == pytest.approx(1.6625, abs=1e-4)


def test_chi2_against_its_closed_form_and_scipy():
    """df 2 is the exponential with mean 2: P(X <= x) = 1 - e^(-x/2), quantile -2 ln(1 - p)."""
    assert chi2_cdf(2.0, 2) == pytest.approx(1 - math.exp(-1), abs=1e-12) and chi2_cdf(0.0, 3) == 0.0
    assert chi2_quantile(0.975, 2) == pytest.approx(-2 * math.log(0.025), rel=1e-10)
    assert chi2_quantile(0.025, 2) == pytest.approx(-2 * math.log(0.975), rel=1e-10)
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 3, 4, 7, 8, 30, 100):
        for p in (0.025, 0.5, 0.975):
            assert chi2_quantile(p, df) == pytest.approx(stats.chi2.ppf(p, df), rel=1e-9), (p, df)


def test_detectable_range_hand_worked():
    """n 3 (df 2), sd 1: sd in [sqrt(2 / 7.377759), sqrt(2 / 0.050636)] = [0.52066, 6.28473]; factor
    (4.3027 + 1.0607) / sqrt(3) = 3.09656 -> detectable 3.09656, range [1.61225, 19.4611]. Scales with sd."""
    r = detectable_range(1.0, 3)
    assert r["detectable"] == pytest.approx(3.09656, abs=1e-5)
    assert r["sd_ci95"] == pytest.approx([0.52066, 6.28473], abs=1e-5)
    assert r["detectable_range"] == pytest.approx([1.61225, 19.4611], abs=1e-4)
    assert detectable_range(2.0, 3)["detectable_range"] == pytest.approx([3.2245, 38.9222], abs=1e-3)
    # the same detectable as paired_interval's at the observed sd
    diffs = [0.02, -0.01, 0.05]
    assert detectable_range(paired_interval(diffs)["sd"], 3)["detectable"] == pytest.approx(paired_interval(diffs)["detectable"])


def test_clustered_interval_hand_worked_and_one_value_per_cluster_is_the_t_interval():
    """[1, 3, 2, 6] in clusters a, a, b, c: mean 3, residuals -2, 0, -1, 3, cluster sums -2, -1, 3, squares 14;
    se sqrt(3/2 * 14) / 4 = 1.14564, t(0.975, 2) 4.3027 -> [-1.92936, 7.92936]."""
    c = clustered_interval([1, 3, 2, 6], ["a", "a", "b", "c"])
    assert c["mean"] == 3 and c["clusters"] == 3 and c["n"] == 4
    assert c["se"] == pytest.approx(1.14564, abs=1e-5) and c["ci95"] == pytest.approx([-1.92936, 7.92936], abs=1e-5)
    xs = [0.02, -0.01, 0.05]
    assert clustered_interval(xs, [1, 2, 3])["ci95"] == pytest.approx(paired_interval(xs)["ci95"])
    assert clustered_interval([1.0, 2.0], ["a", "a"])["ci95"] == [None, None]    # one cluster: no interval


def test_sign_flip_p_hand_worked():
    """[1, 2, 3]: the 8 assignments sum to 6, 4, 2, 0, 0, -2, -4, -6; |sum| >= 6 twice -> 0.25. Zeros flip to
    themselves: [0, 1, 2] -> sums 3, 1, -1, -3 (each twice) -> 2 of 4 -> 0.5. Nine values of one sign: 2 of 512."""
    assert sign_flip_p([1, 2, 3]) == 0.25 and sign_flip_p([1, -1]) == 1.0 and sign_flip_p([0, 1, 2]) == 0.5
    assert sign_flip_p([1] * 9) == pytest.approx(2 / 512)
