"""Compatibility score, gate and weights of transferred responses (spec §3.4, §8-9).

Shape letters: ``B`` sequences, ``T`` tokens, ``N`` a flat list of transferred responses.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graft.registry import ADMISSIONS, WEIGHTINGS

LOG_S_CLAMP = 20.0
HACPO_LOG_S_CLAMP = 10.0


def compatibility_scores(mean_logp_receiver: Tensor, mean_logp_source: Tensor) -> Tensor:
    """s(o|q) = exp(ℓ̄_{π_θold^R}(o^R|q) − ℓ̄_{π_φ}(o^S|q)) (spec §3.4). [N], [N] -> [N].

    Each ℓ̄ is a mean per-token log-likelihood over its own tokenization. With one shared
    tokenizer s is the length-normalised likelihood ratio; with different tokenizers it is an
    empirical compatibility proxy, not a density ratio. The log difference is clamped to
    ±20 (as the PPO log ratio) so s stays finite; identical inputs give exactly 1.
    """
    assert mean_logp_receiver.dim() == 1 and mean_logp_receiver.shape == mean_logp_source.shape, "expected [N] and [N]"
    return torch.exp((mean_logp_receiver - mean_logp_source).clamp(-LOG_S_CLAMP, LOG_S_CLAMP))


def length_deltas(lengths: Tensor, buckets: dict[int, float], default: float) -> Tensor:
    """Per-response gate thresholds (beyond the paper, ``exchange.delta_by_length``, spec §9).

    δ(L) = buckets[min{b : b >= L}], or ``default`` when L exceeds every bound. [N] -> [N].
    """
    assert lengths.dim() == 1, f"lengths must be [N], got {tuple(lengths.shape)}"
    out = torch.full(lengths.shape, float(default))
    if not buckets or lengths.numel() == 0:
        return out
    bounds = torch.tensor(sorted(buckets), dtype=torch.long)
    values = torch.tensor([float(buckets[b]) for b in sorted(buckets)])
    idx = torch.searchsorted(bounds, lengths.long().cpu(), right=False)
    inside = idx < bounds.numel()
    out[inside] = values[idx[inside]]
    return out.to(lengths.device)


S_STATISTICS = ("s_mean", "s_p10", "s_p50", "s_p90", "s_p50_admitted")
"""The statistics of ``s`` :func:`gate_metrics` reports (each per direction and step in metrics.jsonl)."""


def gate_metrics(s: Tensor, admitted: Tensor) -> dict:
    """Count, admitted share, mean and p10/p50/p90 of the scores ``s`` [N] of every transferred response (admitted
    or dropped) given the admitted mask [N], and ``s_p50_admitted``: the median of the admitted responses' scores.

    A statistic with no score to read is NaN (``null`` in JSON): with nothing transferred the share and every
    statistic of ``s``, with nothing admitted ``s_p50_admitted`` -- no score was observed, which a 0 would
    misreport as "every response scored 0"."""
    n = s.numel()
    nan = float("nan")
    if n == 0:
        return {"transferred": 0, "admitted": 0, "admitted_frac": nan, **dict.fromkeys(S_STATISTICS, nan)}
    q = torch.quantile(s.double().cpu(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
    kept = s[admitted].double().cpu()
    return {
        "transferred": n,
        "admitted": int(admitted.sum()),
        "admitted_frac": float(admitted.float().mean()),
        "s_mean": float(s.double().mean()),
        "s_p10": float(q[0]),
        "s_p50": float(q[1]),
        "s_p90": float(q[2]),
        "s_p50_admitted": float(torch.quantile(kept, 0.5)) if kept.numel() else nan,
    }


@ADMISSIONS.register("gate")
def admit_gate(passes: Tensor, generator: torch.Generator | None) -> Tensor:
    """``gate``: admit the responses with s > δ (``passes``)."""
    return passes


@ADMISSIONS.register("random")
def admit_random(passes: Tensor, generator: torch.Generator | None) -> Tensor:
    """``random``: admit as many responses as the gate would, drawn uniformly."""
    admitted = torch.zeros_like(passes)
    pick = torch.randperm(passes.numel(), generator=generator)[: int(passes.sum())]
    admitted[pick.to(passes.device)] = True
    return admitted


@ADMISSIONS.register("all")
def admit_all(passes: Tensor, generator: torch.Generator | None) -> Tensor:
    """``all``: admit every response."""
    return torch.ones_like(passes)


@WEIGHTINGS.register("compat")
def weight_compat(s: Tensor, admitted: Tensor, cap: float) -> Tensor:
    """``compat``: w = min(s, cap) if admitted else 0."""
    return torch.where(admitted, s.clamp(max=cap), torch.zeros_like(s))


@WEIGHTINGS.register("none")
def weight_none(s: Tensor, admitted: Tensor, cap: float) -> Tensor:
    """``none``: w = 1 if admitted else 0."""
    return admitted.to(s.dtype)


def gate(
    s: Tensor,
    delta: float | Tensor,
    cap: float = 1.0,
    admission: str = "gate",
    weighting: str = "compat",
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, dict]:
    """Admission and weights of transferred responses (spec §3.4; ablations §8).

    ``admission`` (:data:`graft.registry.ADMISSIONS`): ``gate`` admits s > δ (s <= δ dropped; δ a scalar or
    per-response [N]); ``random`` as many responses as the gate would, drawn uniformly (``generator``); ``all``
    every response. ``weighting`` (:data:`graft.registry.WEIGHTINGS`): ``compat`` w = min(s, cap) if admitted
    else 0; ``none`` w = 1 if admitted.
    Random admission keeps the compat weight of whatever it admits, so only the choice of
    responses differs from the gate. Returns admitted Bool[N], weights [N], metrics
    (transferred, admitted, admitted_frac, s_mean, s_p10/50/90 of every transferred response, s_p50_admitted;
    :func:`gate_metrics`).
    """
    assert s.dim() == 1, f"s must be [N], got {tuple(s.shape)}"
    delta = torch.as_tensor(delta, dtype=s.dtype, device=s.device)
    assert delta.dim() == 0 or delta.shape == s.shape, f"delta must be scalar or [N], got {tuple(delta.shape)}"
    admit, weigh = ADMISSIONS[admission], WEIGHTINGS[weighting]  # unknown names: UnknownName (a ValueError)
    admitted = admit(s > delta, generator)
    return admitted, weigh(s, admitted, cap), gate_metrics(s, admitted)


def hacpo_peer_weights(s: Tensor, delta: float, delta_step: float, k: int, capability_ratio: float = 1.0) -> Tensor:
    """HACPO stepwise-clipped peer weight (arXiv 2603.02604 eq. 57; spec §8).

    w = clip(s', min(1, 1 − δ + k·δ_step), 1) · capability_ratio, s' = s with |log s| <= 10,
    k = minibatch index (0-based). ``capability_ratio`` (P_source / P_learner, clamped) is
    HACPO's extra factor on peer terms; the default 1 gives spec §8's plain weight.
    Departure: HACPO recomputes s from the current policy inside the loss and applies
    sg(clip)^α (α = 1); here s is the behaviour-time score and the weight is a constant.
    [N] -> [N].
    """
    assert s.dim() == 1, f"s must be [N], got {tuple(s.shape)}"
    lower = min(1.0, 1.0 - delta + k * delta_step)
    s = torch.exp(torch.log(s).clamp(-HACPO_LOG_S_CLAMP, HACPO_LOG_S_CLAMP))
    return s.clamp(min=lower, max=1.0) * capability_ratio
