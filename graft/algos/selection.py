"""Which prompts a receiver gets peer groups for: candidates, balancing, ablations (spec §3.2-3.3, §6, §8-9).

Shape letter ``P``: prompts of the step, in the same order for both models. A direction
S->R has ``k_source`` = k_S and ``candidates`` = C_{S->R} as BoolTensor[P].
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from graft.registry import BALANCES, CONFLICTS, SELECTIONS


def _check_pair(k: Tensor, mask: Tensor) -> None:
    assert k.dim() == 1 and mask.shape == k.shape, f"expected [P] and [P], got {tuple(k.shape)}, {tuple(mask.shape)}"
    assert mask.dtype == torch.bool, f"mask must be bool, got {mask.dtype}"


def candidate_mask(k_receiver: Tensor, k_source: Tensor, n: int, include_all_correct: bool = False) -> Tensor:
    """C_{S->R} = {q : k_R(q) = 0 and 1 <= k_S(q) < n} (spec §3.2). [P] -> Bool[P].

    The trigger is zero successes, not zero variance. ``include_all_correct`` (beyond the
    paper, §9) relaxes the upper bound to k_S <= n.
    """
    assert k_receiver.dim() == 1 and k_receiver.shape == k_source.shape, "k_receiver and k_source must both be [P]"
    upper = k_source <= n if include_all_correct else k_source < n
    return (k_receiver == 0) & (k_source >= 1) & upper


def top_with_ties(k_source: Tensor, candidates: Tensor, m: int) -> Tensor:
    """Top-m candidates by k_S, descending, plus every candidate tied with the m-th (spec §3.3).

    Equivalent to keeping candidates with k_S >= (m-th largest k_S among candidates), so
    more than m may be kept. m <= 0 keeps none; m >= |C| keeps all. [P] -> Bool[P].
    """
    _check_pair(k_source, candidates)
    count = int(candidates.sum())
    if m <= 0 or count == 0:
        return torch.zeros_like(candidates)
    if m >= count:
        return candidates.clone()
    threshold = torch.sort(k_source[candidates], descending=True).values[m - 1]
    return candidates & (k_source >= threshold)


@BALANCES.register("min")
def balance_min(size_ab: int, size_ba: int, ratio: float, floor: int) -> tuple[int, int]:
    """``min``: m = min(|C_AB|, |C_BA|) both ways (spec §3.3)."""
    m = min(size_ab, size_ba)
    return m, m


@BALANCES.register("none")
def balance_none(size_ab: int, size_ba: int, ratio: float, floor: int) -> tuple[int, int]:
    """``none``: every candidate both ways."""
    return size_ab, size_ba


@BALANCES.register("asymmetric")
def balance_asymmetric(size_ab: int, size_ba: int, ratio: float, floor: int) -> tuple[int, int]:
    """``asymmetric`` (beyond the paper, §9): m_dir = min(|C_dir|, ceil(ratio·|C_other|) + floor), so the richer
    direction may keep up to ratio times the poorer one plus ``floor``."""
    cap = lambda other: math.ceil(ratio * other) + floor  # noqa: E731
    return min(size_ab, cap(size_ba)), min(size_ba, cap(size_ab))


def balanced_targets(size_ab: int, size_ba: int, balance: str = "min", ratio: float = 2.0, floor: int = 1) -> tuple[int, int]:
    """Per-direction selection targets (m_AB, m_BA) from the candidate counts, by the rule ``balance`` of
    :data:`graft.registry.BALANCES` (:func:`balance_min`, :func:`balance_none`, :func:`balance_asymmetric`)."""
    return BALANCES[balance](size_ab, size_ba, ratio, floor)


def balanced_selection(
    k_src_ab: Tensor,
    cand_ab: Tensor,
    k_src_ba: Tensor,
    cand_ba: Tensor,
    balance: str = "min",
    ratio: float = 2.0,
    floor: int = 1,
) -> tuple[Tensor, Tensor, dict]:
    """Balanced two-way selection (spec §3.3): keep_dir = top_with_ties(k_S, C_dir, m_dir).

    ``k_src_ab`` are A's success counts (source of A->B), ``cand_ab`` = C_{A->B}; likewise BA.
    m_dir from :func:`balanced_targets`; with ``min`` and m = 0 nothing moves either way.
    Returns keep_ab [P], keep_ba [P] and metrics m_ab, m_ba, candidates_ab, candidates_ba,
    kept_ab, kept_ba (ints).
    """
    _check_pair(k_src_ab, cand_ab)
    _check_pair(k_src_ba, cand_ba)
    size_ab, size_ba = int(cand_ab.sum()), int(cand_ba.sum())
    m_ab, m_ba = balanced_targets(size_ab, size_ba, balance, ratio, floor)
    keep_ab = top_with_ties(k_src_ab, cand_ab, m_ab)
    keep_ba = top_with_ties(k_src_ba, cand_ba, m_ba)
    metrics = {
        "m_ab": m_ab,
        "m_ba": m_ba,
        "candidates_ab": size_ab,
        "candidates_ba": size_ba,
        "kept_ab": int(keep_ab.sum()),
        "kept_ba": int(keep_ba.sum()),
    }
    return keep_ab, keep_ba, metrics


def random_selection(pool: Tensor, count: int, generator: torch.Generator | None = None) -> Tensor:
    """Ablation "random prompt selection" (spec §8): ``count`` prompts drawn uniformly without
    replacement from ``pool`` (the receiver's all-fail prompts, k_R = 0); all of the pool if
    it is smaller. Bool[P] -> Bool[P].

    The paper does not say what happens when a drawn prompt's peer group has no success;
    that group then has all-zero advantages and adds no gradient (decided by the caller).
    """
    assert pool.dim() == 1 and pool.dtype == torch.bool, f"pool must be Bool[P], got {pool.dtype} {tuple(pool.shape)}"
    keep = torch.zeros_like(pool)
    idx = pool.nonzero().flatten()
    if count <= 0 or idx.numel() == 0:
        return keep
    perm = torch.randperm(idx.numel(), generator=generator)
    keep[idx[perm[:count]]] = True
    return keep


@SELECTIONS.register("ranked")
def select_ranked(keep: Tensor, pool: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """``ranked`` (the paper): the balanced selection as it is, the candidates with most source successes."""
    return keep


@SELECTIONS.register("random")
def select_random(keep: Tensor, pool: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """``random`` (ablation, spec §8): as many prompts as the balanced selection kept, drawn from ``pool``, the
    receiver's all-fail prompts (:func:`random_selection`). Bool[P], Bool[P] -> Bool[P]."""
    return random_selection(pool, int(keep.sum()), generator)


def capped_selection(k_source: Tensor, candidates: Tensor, cap: int | None) -> Tensor:
    """Stored-peer mode (spec §6), one direction: all candidates when ``cap`` is None, else
    top_with_ties(k_S, C, cap) (ties at the cap are kept, so more than ``cap`` may pass)."""
    _check_pair(k_source, candidates)
    return candidates.clone() if cap is None else top_with_ties(k_source, candidates, cap)


@CONFLICTS.register("most_successes")
def conflict_most_successes(k: int, s_mean: float, source: int) -> tuple:
    """``most_successes``: highest k_S, then highest mean s, then the earlier model."""
    return k, s_mean, -source


@CONFLICTS.register("most_compatible")
def conflict_most_compatible(k: int, s_mean: float, source: int) -> tuple:
    """``most_compatible``: highest mean s, then highest k_S, then the earlier model."""
    return s_mean, k, -source


@CONFLICTS.register("model_order")
def conflict_model_order(k: int, s_mean: float, source: int) -> tuple:
    """``model_order``: the earlier model."""
    return (-source,)


def resolve_conflicts(keep: Tensor, k_source: Tensor, s_mean: Tensor, rule: str = "most_successes") -> Tensor:
    """One receiver, several sources: at most one source per prompt (N-model exchange, beyond the paper).

    ``keep`` Bool[S,P]: prompts each source S hands to this receiver after balancing;
    ``k_source`` [S,P]: each source's success count; ``s_mean`` [S,P]: mean compatibility of
    the source's group under the receiver (any value where ``keep`` is False). Sources are
    rows in model order. Among the sources of a prompt, the winner has the largest key:

    - ``most_successes``: (k_S, mean s, earlier model)
    - ``most_compatible``: (mean s, k_S, earlier model)
    - ``model_order``: (earlier model)

    Returns Bool[S,P]: ``keep`` with every losing source's entry cleared. With a single
    source (two models) it returns ``keep`` unchanged.
    """
    assert keep.dim() == 2 and keep.dtype == torch.bool, f"keep must be Bool[S,P], got {keep.dtype} {tuple(keep.shape)}"
    assert k_source.shape == keep.shape and s_mean.shape == keep.shape, "k_source and s_mean must be [S,P] like keep"
    rank = CONFLICTS[rule]  # (k_S, mean s, source index) -> sort key; unknown rule: UnknownName (a ValueError)
    out = keep.clone()
    S = keep.shape[0]
    for p in torch.nonzero(keep.sum(0) > 1).flatten().tolist():

        def key(s: int, p: int = p) -> tuple:  # p bound now (B023); max() calls key within this iteration anyway
            return rank(int(k_source[s, p]), float(s_mean[s, p]), s)

        winner = max((s for s in range(S) if keep[s, p]), key=key)
        out[:, p] = False
        out[winner, p] = True
    return out
