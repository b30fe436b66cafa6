"""Pure evaluation statistics: pass@k, mean ± std over repeats, paired and unpaired comparisons (with a
cluster-robust interval, an exact sign-flip test and the power a design has), complementarity.

Everything here takes plain Python numbers and returns plain numbers (no files, no
models), so it can be checked by hand.

Conventions
-----------
* A response is *correct* when its reward is above the run's ``reward.success_threshold``
  (:func:`graft.success.succeeded`; with 0/1 rewards any threshold in [0, 1) gives the same counts).
* pass@1 of one repeat = mean over prompts of (c_p / n_p), c_p correct out of n_p
  samples of prompt p. With several repeats the protocol reports mean ± std of the
  per-repeat pass@1 (spec §5).
* ``std`` is the **sample** standard deviation (ddof = 1, Bessel-corrected), the usual
  choice when R independent evaluation runs estimate run-to-run spread; with a single
  value it is reported as 0.0 (there is no spread to estimate), with none as NaN.
* A paired comparison over seeds (arm minus baseline, same seed) is summarised by the mean of the
  per-seed differences and its Student-t 95 % interval, ``mean ± t(0.975, n-1) · sd / sqrt(n)``; beside it,
  every seed of one arm against every seed of the other (pairing ignored): Welch's interval and an exact rank-sum p.
  Values that are not independent (several measurements of one seed) get the cluster-robust interval
  (:func:`clustered_interval`) and the exact sign-flip p (:func:`sign_flip_p`); a power figure computed from the
  observed spread is given with the range its SD's chi-square interval implies (:func:`detectable_range`).
* Complementarity of direction S->R (design.md, ``complementarity/S->R``) = fraction of
  R's all-fail prompts (k_R = 0) on which S had at least one success (k_S >= 1); NaN
  when R has no all-fail prompt.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from graft.success import succeeded


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator of Chen et al. (2021), ``1 - C(n-c, k) / C(n, k)``.

    ``n`` samples of which ``c`` are correct; the probability that at least one of
    ``k`` samples drawn without replacement from the ``n`` is correct. Computed as the
    numerically stable product ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``.
    """
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        n, c, k = int(n), int(c), int(k)
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n, 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def num_correct(rewards: Sequence[float], threshold: float) -> int:
    """Number of successes (reward above ``threshold``) in one prompt's samples."""
    return sum(succeeded(r, threshold) for r in rewards)


def pass_at_k_from_rewards(rewards: Sequence[Sequence[float]], k: int, threshold: float) -> float:
    """Mean over prompts of the unbiased pass@k, a success being a reward above ``threshold``; ``rewards`` is [P][n]
    (n may vary per prompt).

    NaN when there are no prompts. Every prompt must have at least ``k`` samples.
    """
    if len(rewards) == 0:
        return math.nan
    return sum(pass_at_k(len(r), num_correct(r, threshold), k) for r in rewards) / len(rewards)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample std with ddof=1). One value: std 0.0; no values: (nan, nan).

    NaN entries are ignored (a repeat with no prompts contributes nothing).
    """
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not vals:
        return math.nan, math.nan
    mean = sum(vals) / len(vals)
    if len(vals) == 1:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return mean, math.sqrt(var)


_T975 = (
    12.7062,
    4.3027,
    3.1824,
    2.7764,
    2.5706,
    2.4469,
    2.3646,
    2.3060,
    2.2622,
    2.2281,
    2.2010,
    2.1788,
    2.1604,
    2.1448,
    2.1314,
    2.1199,
    2.1098,
    2.1009,
    2.0930,
    2.0860,
    2.0796,
    2.0739,
    2.0687,
    2.0639,
    2.0595,
    2.0555,
    2.0518,
    2.0484,
    2.0452,
    2.0423,
)
"""Student-t 0.975 quantiles for 1..30 degrees of freedom."""


_T80 = (
    1.3764,
    1.0607,
    0.9785,
    0.9410,
    0.9195,
    0.9057,
    0.8960,
    0.8889,
    0.8834,
    0.8791,
    0.8755,
    0.8726,
    0.8702,
    0.8681,
    0.8662,
    0.8647,
    0.8633,
    0.8620,
    0.8610,
    0.8600,
    0.8591,
    0.8583,
    0.8575,
    0.8569,
    0.8562,
    0.8557,
    0.8551,
    0.8546,
    0.8542,
    0.8538,
)
"""Student-t 0.8 quantiles for 1..30 degrees of freedom."""


def _t_quantile(table: tuple[float, ...], z: float, df: int) -> float:
    """Student's t quantile with ``df`` degrees of freedom: tabulated to 30, beyond it the Cornish-Fisher
    expansion around the normal quantile ``z`` to second order (within 1e-4 of the exact value)."""
    assert df >= 1, df
    if df <= len(table):
        return table[df - 1]
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    return _t_quantile(_T975, 1.959964, df)


def t80(df: int) -> float:
    """The 0.8 quantile of Student's t with ``df`` degrees of freedom."""
    return _t_quantile(_T80, 0.841621, df)


def paired_interval(diffs: Sequence[float | None]) -> dict:
    """Mean of paired differences (None: a pair not run yet, left out) with its Student-t 95 % interval, and
    ``detectable``: the smallest true mean difference a two-sided paired t-test at α = 0.05 finds with 80 %
    power at this many pairs and this spread, (t(0.975, n-1) + t(0.8, n-1)) · sd / sqrt(n).

    Hand-worked: ``[0.02, -0.01, 0.05]`` -> mean 0.02, sd 0.03, se 0.03 / sqrt(3) = 0.01732,
    half-width 4.3027 * 0.01732 = 0.07452 -> ci95 [-0.0545, 0.0945], detectable (4.3027 + 1.0607) * 0.01732
    = 0.09290, n 3. One pair: no interval.
    """
    xs = [float(d) for d in diffs if d is not None]
    if not xs:
        return {"mean": None, "ci95": [None, None], "sd": None, "detectable": None, "n": 0}
    mean, sd = mean_std(xs)
    if len(xs) == 1:
        return {"mean": mean, "ci95": [None, None], "sd": None, "detectable": None, "n": 1}
    se = sd / math.sqrt(len(xs))
    half = t975(len(xs) - 1) * se
    return {
        "mean": mean,
        "ci95": [mean - half, mean + half],
        "sd": sd,
        "detectable": (t975(len(xs) - 1) + t80(len(xs) - 1)) * se,
        "n": len(xs),
    }


def unpaired_interval(xs: Sequence[float | None], ys: Sequence[float | None]) -> dict:
    """Every run of one arm against every run of another, pairing ignored: mean(xs) − mean(ys) with Welch's 95 %
    interval (Welch–Satterthwaite df, rounded down: a slightly wider interval), and the exact two-sided p of the
    rank-sum (Mann–Whitney) statistic: the share of all C(m + n, m) splits of the pooled values' mid-ranks whose
    rank sum for ``xs`` lies at least as far from its mean as the observed one (None beyond 10^6 splits).
    None values (runs not in yet) are left out.

    Hand-worked: xs [3, 5, 7] (mean 5, var 4), ys [1, 2, 3] (mean 2, var 1) -> diff 3, se sqrt(4/3 + 1/3) =
    1.2910, df (5/3)^2 / ((4/3)^2/2 + (1/3)^2/2) = 2.7778/0.9444 = 2.94 -> 2, half-width 4.3027 * 1.2910 =
    5.5547 -> [-2.5547, 8.5547]. Mid-ranks: 1, 2, 3.5, 3.5, 5, 6 (the two 3s tie); xs' rank sum 3.5 + 5 + 6 =
    14.5, mean 3 · 7 / 2 = 10.5, distance 4; of the 20 splits, {3.5, 5, 6} (14.5), {5, 6, 3.5'} (14.5) and
    their mirrors {1, 2, 3.5} (6.5) twice lie 4 or more away -> p = 4/20 = 0.2.
    """
    a, b = [float(x) for x in xs if x is not None], [float(y) for y in ys if y is not None]
    out: dict = {"diff": None, "ci95": [None, None], "df": None, "p_rank_sum": None, "n": [len(a), len(b)]}
    if not a or not b:
        return out
    out["diff"] = sum(a) / len(a) - sum(b) / len(b)
    if len(a) >= 2 and len(b) >= 2:
        va, vb = mean_std(a)[1] ** 2 / len(a), mean_std(b)[1] ** 2 / len(b)
        if va + vb > 0:
            df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
            half = t975(max(1, math.floor(df))) * math.sqrt(va + vb)
            out |= {"ci95": [out["diff"] - half, out["diff"] + half], "df": df}
    out["p_rank_sum"] = _rank_sum_p(a, b)
    return out


def _rank_sum_p(a: list[float], b: list[float]) -> float | None:
    """Exact two-sided permutation p of the rank-sum statistic of ``a`` among ``a + b`` (mid-ranks for ties)."""
    if math.comb(len(a) + len(b), len(a)) > 10**6:
        return None
    pooled = sorted(a + b)
    rank = {v: sum(i + 1 for i, w in enumerate(pooled) if w == v) / pooled.count(v) for v in set(pooled)}
    ranks = [rank[v] for v in a + b]
    centre = len(a) * (len(pooled) + 1) / 2
    observed = abs(sum(rank[v] for v in a) - centre)
    extreme = sum(abs(sum(s) - centre) >= observed - 1e-9 for s in itertools.combinations(ranks, len(a)))
    return extreme / math.comb(len(pooled), len(a))


def paired_verdict(diffs: Sequence[float | None], pairs: int) -> dict:
    """The verdict of a pre-registered paired test of a gain: ``paired_interval(diffs)`` plus ``verdict`` --
    ``waits`` until ``pairs`` pairs are in (a partial set is not read), then ``confirmed`` when the Student-t 95 %
    interval lies above 0, ``not confirmed`` otherwise, whatever the mean -- and ``pairs_required``.

    Hand-worked (pairs 3): ``[0.02, -0.01, 0.05]`` -> ci95 [-0.0545, 0.0945] (see :func:`paired_interval`): not
    confirmed; ``[0.06, 0.07, 0.08]`` -> mean 0.07, sd 0.01, half-width 4.3027 * 0.01 / sqrt(3) = 0.0248 -> [0.0452,
    0.0948]: confirmed; ``[0.06, None, 0.08]`` -> 2 of 3 pairs: waits.
    """
    assert pairs >= 2, pairs
    s = paired_interval(diffs)
    verdict = "waits" if s["n"] < pairs else "confirmed" if s["ci95"][0] > 0 else "not confirmed"
    return {**s, "verdict": verdict, "pairs_required": pairs}


def chi2_cdf(x: float, df: int) -> float:
    """P(X <= x) for X chi-square with ``df`` degrees of freedom: the regularized lower incomplete gamma
    P(df/2, x/2), by its power series x'^a e^-x' / Γ(a + 1) · Σ_k x'^k / ((a + 1) ... (a + k)), x' = x/2, a = df/2
    (converges for every x; used here for df up to ~100 and x up to a few hundred).

    Hand-worked: df 2 is the exponential with mean 2, P = 1 − e^(−x/2): x = 2 -> 1 − e^-1 = 0.632121."""
    assert df >= 1, df
    if x <= 0:
        return 0.0
    a, h = df / 2, x / 2
    term = total = 1.0
    k = 0
    while term > 1e-17 * total:
        k += 1
        term *= h / (a + k)
        total += term
    return min(1.0, math.exp(a * math.log(h) - h - math.lgamma(a + 1)) * total)


def chi2_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of chi-square with ``df`` degrees of freedom (bisection on :func:`chi2_cdf` to 1e-12
    relative). Hand-worked: df 2 -> −2 ln(1 − p); p 0.975 -> 7.377759."""
    assert 0 < p < 1 and df >= 1, (p, df)
    lo, hi = 0.0, max(1.0, 2.0 * df)
    while chi2_cdf(hi, df) < p:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def detectable_range(sd: float, n: int) -> dict:
    """The smallest true mean a two-sided paired t-test at α = 0.05 detects with 80 % power over ``n`` pairs,
    ``(t(0.975, n-1) + t(0.8, n-1)) · σ / sqrt(n)`` (:func:`paired_interval`'s ``detectable``), at the observed
    ``sd`` and at both ends of the SD's 95 % chi-square interval, σ in [sd · sqrt((n-1) / χ²(0.975, n-1)),
    sd · sqrt((n-1) / χ²(0.025, n-1))]: how far an after-the-fact power figure could be off by its own SD.

    Hand-worked, n 3 (df 2): χ²(0.975, 2) = 7.377759, χ²(0.025, 2) = −2 ln 0.975 = 0.050636; sd 1 -> σ in
    [sqrt(2 / 7.377759), sqrt(2 / 0.050636)] = [0.52066, 6.28473]; factor (4.3027 + 1.0607) / sqrt(3) = 3.09656
    -> detectable 3.09656, range [1.61225, 19.4611]."""
    assert n >= 2 and sd >= 0, (sd, n)
    factor = (t975(n - 1) + t80(n - 1)) / math.sqrt(n)
    sd_lo = sd * math.sqrt((n - 1) / chi2_quantile(0.975, n - 1))
    sd_hi = sd * math.sqrt((n - 1) / chi2_quantile(0.025, n - 1))
    return {"detectable": factor * sd, "sd_ci95": [sd_lo, sd_hi], "detectable_range": [factor * sd_lo, factor * sd_hi]}


def clustered_interval(values: Sequence[float], clusters: Sequence[object]) -> dict:
    """The mean of ``values`` with a 95 % interval that lets values of one cluster be correlated: the
    cluster-robust (CR1) standard error sqrt(G / (G − 1) · Σ_g (Σ_{i in g} (x_i − mean))²) / N over G clusters and
    N values, and Student-t with G − 1 degrees of freedom. One value per cluster gives the ordinary t interval.

    Hand-worked: values [1, 3, 2, 6] in clusters [a, a, b, c] -> mean 3, residuals −2, 0, −1, 3; cluster sums
    a −2, b −1, c 3; Σ squares 14; se sqrt(3/2 · 14) / 4 = 1.14564; t(0.975, 2) = 4.3027 -> [−1.92936, 7.92936]."""
    xs = [float(v) for v in values]
    assert len(xs) == len(clusters), (len(xs), len(clusters))
    groups = sorted(set(clusters), key=list(clusters).index)
    n, g = len(xs), len(groups)
    if n == 0:
        return {"mean": None, "ci95": [None, None], "se": None, "clusters": 0, "n": 0}
    mean = sum(xs) / n
    if g < 2:
        return {"mean": mean, "ci95": [None, None], "se": None, "clusters": g, "n": n}
    sums = [sum(x - mean for x, c in zip(xs, clusters, strict=True) if c == k) for k in groups]
    se = math.sqrt(g / (g - 1) * sum(s * s for s in sums)) / n
    half = t975(g - 1) * se
    return {"mean": mean, "ci95": [mean - half, mean + half], "se": se, "clusters": g, "n": n}


def sign_flip_p(values: Sequence[float]) -> float:
    """Exact two-sided sign-flip p of the mean of ``values`` against 0: the share of the 2^n sign assignments
    whose |Σ ±x_i| is at least the observed |Σ x_i| (valid when, without an effect, each value is as likely
    negative as positive; zeros flip to themselves). The smallest attainable p is 2 / 2^n (n ≤ 20).

    Hand-worked: [1, 2, 3] -> sums of the 8 assignments ±1 ±2 ±3: 6, 4, 2, 0, 0, −2, −4, −6; |sum| >= 6 in 2
    -> p 0.25; [1, −1] -> |sum| >= 0 in all 4 -> 1."""
    xs = [float(v) for v in values]
    assert len(xs) <= 20, len(xs)
    observed = abs(sum(xs))
    hits = sum(
        abs(sum(s * x for s, x in zip(signs, xs, strict=True))) >= observed - 1e-12
        for signs in itertools.product((1, -1), repeat=len(xs))
    )
    return hits / 2 ** len(xs)


def complementarity_counts(k_receiver: Sequence[int], k_source: Sequence[int]) -> tuple[int, int]:
    """(receiver all-fail prompts on which the source had >= 1 success, receiver all-fail prompts).

    The lists are aligned by prompt (same length).
    """
    if len(k_receiver) != len(k_source):
        raise ValueError(f"success-count lists must be aligned by prompt, got {len(k_receiver)} and {len(k_source)}")
    fail = [i for i, k in enumerate(k_receiver) if k == 0]
    solved = sum(1 for i in fail if k_source[i] >= 1)
    return solved, len(fail)


def complementarity(k_a: Sequence[int], k_b: Sequence[int]) -> tuple[float, float]:
    """Both directions of complementarity from per-prompt success counts aligned by prompt.

    Returns ``(frac of A's all-fail prompts that B solved, frac of B's all-fail prompts that A
    solved)``, i.e. ``(complementarity/B->A, complementarity/A->B)`` in metric-key terms. Each
    is NaN when that model has no all-fail prompt.
    """
    b_solves, a_fail = complementarity_counts(k_a, k_b)
    a_solves, b_fail = complementarity_counts(k_b, k_a)
    return (b_solves / a_fail if a_fail else math.nan, a_solves / b_fail if b_fail else math.nan)
