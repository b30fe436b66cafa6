"""Policy losses: GRAFT (spec §3.5) and the LUFFY / SGT / HACPO update rules (spec §8).

Shape letters: ``B`` sequences of a minibatch, ``T`` tokens (right-padded). Every loss takes
per-token ``logp`` (current policy, with grad), ``old_logp`` (the receiver's behaviour
policy π_θold^R, for own and peer rows alike), per-sequence ``advantages``, ``weights``
(1 for own rows, the gate weight for peer rows) and ``is_peer``, and returns
``(loss, metrics)``; the loss is minimised. Masked positions may hold any value, NaN included.

Metrics are plain floats: additive totals (``tokens/*``, ``count/*``, ``sum/*``; ``max/*``) that a
trainer merges across micro-batches, minibatches and ranks with :func:`merge`, plus this call's
:func:`summarize` (``clip_frac/*``, ``ratio/mean|max``, ...), which the trainer recomputes from
the merged totals.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graft.registry import KL_ESTIMATORS, LOSS_AGGS, RATIO_LEVELS

LOG_RATIO_CLAMP = 20.0


def _check(logp: Tensor, old_logp: Tensor, advantages: Tensor, weights: Tensor, mask: Tensor, is_peer: Tensor) -> None:
    assert logp.dim() == 2, f"logp must be [B,T], got {tuple(logp.shape)}"
    b = logp.shape[0]
    assert old_logp.shape == logp.shape and mask.shape == logp.shape, "old_logp and mask must match logp [B,T]"
    for name, t in (("advantages", advantages), ("weights", weights), ("is_peer", is_peer)):
        assert t.shape == (b,), f"{name} must be [B]={b}, got {tuple(t.shape)}"
    assert is_peer.dtype == torch.bool, f"is_peer must be bool, got {is_peer.dtype}"


@LOSS_AGGS.register("token-mean")
def agg_token_mean(masked: Tensor, mask: Tensor, num_tokens: float | None, num_seqs: float | None) -> Tensor:
    """``token-mean``: Σ_{b,t} l·m / num_tokens, num_tokens = Σ m by default (DAPO, the paper's text)."""
    denom = mask.sum().clamp(min=1).item() if num_tokens is None else max(num_tokens, 1.0)
    return masked.sum() / denom


@LOSS_AGGS.register("seq-mean-token-mean")
def agg_seq_mean_token_mean(masked: Tensor, mask: Tensor, num_tokens: float | None, num_seqs: float | None) -> Tensor:
    """``seq-mean-token-mean``: Σ_b (Σ_t l·m / Σ_t m) / num_seqs, num_seqs = rows with a valid token by default
    (the paper's formula; HACPO's)."""
    lengths = mask.sum(dim=1)
    seq = masked.sum(dim=1) / lengths.clamp(min=1).to(masked.dtype)
    denom = (lengths > 0).sum().clamp(min=1).item() if num_seqs is None else max(num_seqs, 1.0)
    return seq.sum() / denom


def aggregate(
    loss_mat: Tensor, mask: Tensor, mode: str, num_tokens: float | None = None, num_seqs: float | None = None
) -> Tensor:
    """Reduce a [B,T] token loss to a scalar (spec §3.5; verl ``agg_loss``) by the rule ``mode`` of
    :data:`graft.registry.LOSS_AGGS` (:func:`agg_token_mean`, :func:`agg_seq_mean_token_mean`).

    Passing the GLOBAL count of a batch split across micro-batches or ranks makes the parts sum to the
    full-batch value.
    """
    assert loss_mat.dim() == 2 and mask.shape == loss_mat.shape, (
        f"expected [B,T] twice, got {tuple(loss_mat.shape)}, {tuple(mask.shape)}"
    )
    reduce = LOSS_AGGS[mode]  # unknown mode: UnknownName (a ValueError) listing the valid ones
    mask = mask.bool()
    return reduce(torch.where(mask, loss_mat, torch.zeros_like(loss_mat)), mask, num_tokens, num_seqs)


def _log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, logp - old_logp, torch.zeros_like(logp))


@RATIO_LEVELS.register("token")
def token_log_ratio(lr: Tensor, mask: Tensor) -> Tensor:
    """``token`` (spec §3.5, verl): each token's own log ratio. [B,T], Bool[B,T] -> [B,T]."""
    return lr


@RATIO_LEVELS.register("sequence")
def sequence_log_ratio(lr: Tensor, mask: Tensor) -> Tensor:
    """``sequence`` (ablation, §8; GSPO/TRL ``importance_sampling_level``): the row's mean log ratio over its valid
    tokens, broadcast to every token. [B,T], Bool[B,T] -> [B,T]."""
    seq = lr.sum(dim=1) / mask.sum(dim=1).clamp(min=1).to(lr.dtype)
    return seq[:, None].expand_as(lr)


def importance_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, level: str = "token") -> Tensor:
    """ρ [B,T] = exp(clamp(log ratio, ±20)), the log ratio of ``level`` (:data:`graft.registry.RATIO_LEVELS`:
    :func:`token_log_ratio`, :func:`sequence_log_ratio`) over logp_t − old_t. Masked positions never influence ρ of
    valid ones."""
    mask = mask.bool()
    lr = RATIO_LEVELS[level](_log_ratio(logp, old_logp, mask), mask)
    return torch.exp(lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _clipped_objective(ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float) -> Tensor:
    return torch.minimum(ratio * adv, ratio.clamp(1 - clip_low, 1 + clip_high) * adv)


ADDITIVE = ("tokens/", "count/", "sum/")
"""Metric prefixes that add up over micro-batches, minibatches and ranks (``max/`` keys take the max)."""


def summarize(totals: dict) -> dict:
    """Per-call or per-update summary metrics from additive totals (one place for every fraction).

    ``clip_frac/{own,peer}_{low,high}`` = clipped tokens / tokens of that population;
    ``ratio/mean`` (over valid tokens), ``ratio/max``; ``luffy/peer_prob_mean`` (over peer
    tokens), ``sgt/nll`` (token-mean over SGT rows) and ``kl`` (token-mean of :func:`kl_loss`'s estimate)
    when the loss reports them.
    """
    t = totals
    frac = lambda num, den: t.get(num, 0.0) / t[den] if t.get(den) else 0.0  # noqa: E731
    out = {
        f"clip_frac/{pop}_{side}": frac(f"count/{pop}_clip_{side}", f"tokens/{pop}")
        for pop in ("own", "peer")
        for side in ("low", "high")
    }
    valid = t.get("tokens/own", 0.0) + t.get("tokens/peer", 0.0)
    if "sum/ratio" in t:
        out["ratio/mean"] = t["sum/ratio"] / valid if valid else 1.0
        out["ratio/max"] = t["max/ratio"] if valid else 1.0
    if "sum/peer_prob" in t:
        out["luffy/peer_prob_mean"] = frac("sum/peer_prob", "tokens/peer")
    if "sum/sgt_nll" in t:
        out["sgt/nll"] = frac("sum/sgt_nll", "tokens/sgt")
    if "sum/kl" in t:
        out["kl"] = frac("sum/kl", "tokens/kl")
    return out


def merge(totals: dict, part: dict) -> dict:
    """Add ``part``'s additive metrics into ``totals`` (``max/`` keys: maximum); other keys are ignored."""
    for key, v in part.items():
        if key.startswith(ADDITIVE):
            totals[key] = totals.get(key, 0.0) + float(v)
        elif key.startswith("max/"):
            totals[key] = max(totals.get(key, float("-inf")), float(v))
    return totals


def _clip_metrics(
    ratio: Tensor, adv: Tensor, mask: Tensor, is_peer: Tensor, clip_low: float, clip_high: float, peer_clipped: bool
) -> dict:
    """Token counts where clipping is ACTIVE (TRL convention): low = ρ < 1−ε_low and Â < 0,
    high = ρ > 1+ε_high and Â > 0; per population (own / peer rows); the ratio's sum and max
    over valid tokens; and their :func:`summarize`. One host sync."""
    ratio = ratio.detach()
    low = (ratio < 1 - clip_low) & (adv < 0) & mask
    high = (ratio > 1 + clip_high) & (adv > 0) & mask
    rows = torch.stack([~is_peer, is_peer])[:, :, None]  # [2,B,1]: own, peer
    counts = torch.stack([(mask & rows).sum((1, 2)), (low & rows).sum((1, 2)), (high & rows).sum((1, 2))])
    ratio_sum = torch.where(mask, ratio, torch.zeros_like(ratio)).sum()
    ratio_max = torch.where(mask, ratio, torch.full_like(ratio, -torch.inf)).max() if mask.numel() else ratio_sum
    n, (ratio_sum, ratio_max) = counts.tolist(), torch.stack([ratio_sum, ratio_max]).tolist()  # n: [3][2] ints
    out: dict = {"sum/ratio": ratio_sum, "max/ratio": ratio_max}
    for i, pop in enumerate(("own", "peer")):
        active = peer_clipped or pop == "own"
        out[f"tokens/{pop}"] = n[0][i]
        out[f"count/{pop}_clip_low"] = n[1][i] if active else 0
        out[f"count/{pop}_clip_high"] = n[2][i] if active else 0
    return out | summarize(out)


def _ppo_parts(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_low: float, clip_high: float, ratio_level: str
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(bool mask, ρ, Â broadcast to [B,T], min(ρÂ, clip(ρ)Â))."""
    mask = mask.bool()
    ratio = importance_ratio(logp, old_logp, mask, ratio_level)
    adv = advantages.to(ratio.dtype)[:, None].expand_as(ratio)
    return mask, ratio, adv, _clipped_objective(ratio, adv, clip_low, clip_high)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    weights: Tensor,
    mask: Tensor,
    is_peer: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: str = "token-mean",
    ratio_level: str = "token",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[Tensor, dict]:
    """GRAFT objective (spec §3.5), as a loss:

    L = agg_{j,t}[ −w_j · min(ρ_{j,t} Â_j, clip(ρ_{j,t}, 1−ε_low, 1+ε_high) Â_j) ],
    ρ = π_θ / π_θold^R (the receiver's own behaviour policy, own and peer rows alike), w = 1
    for own rows and min(s, cap) for admitted peer rows. No KL, no entropy term; no dual clip.
    ``is_peer`` only splits the clip metrics. Returns (scalar loss, metrics).
    """
    _check(logp, old_logp, advantages, weights, mask, is_peer)
    mask, ratio, adv, obj = _ppo_parts(logp, old_logp, advantages, mask, clip_low, clip_high, ratio_level)
    loss_mat = -weights.to(obj.dtype)[:, None] * obj
    loss = aggregate(loss_mat, mask, agg, num_tokens, num_seqs)
    return loss, _clip_metrics(ratio, adv, mask, is_peer, clip_low, clip_high, peer_clipped=True)


def luffy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    weights: Tensor,
    mask: Tensor,
    is_peer: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: str = "token-mean",
    ratio_level: str = "token",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    gamma: float = 0.1,
) -> tuple[Tensor, dict]:
    """LUFFY-style update (arXiv 2504.14945; spec §8).

    Own (on-policy) rows: the clipped PPO term of :func:`policy_loss`. Peer (off-policy)
    rows: −w · Â · f(π_θ), f(π) = π / (π + γ), π = exp(logp) per token, no ratio, no clipping.
    Departures from LUFFY: LUFFY has no behaviour log-probs (it assumes π_φ = 1) and no
    sequence weights; here the gate weights w still multiply peer rows, advantages are the
    caller's (GRAFT's frozen source advantages, not LUFFY's mixed-group Dr.GRPO ones), and
    whole peer groups replace all-fail groups instead of one off-policy trace per group.
    Peer clip counts are 0 (nothing is clipped there).
    """
    _check(logp, old_logp, advantages, weights, mask, is_peer)
    mask, ratio, adv, obj = _ppo_parts(logp, old_logp, advantages, mask, clip_low, clip_high, ratio_level)
    prob = torch.exp(torch.where(mask, logp, torch.zeros_like(logp)))
    shaped = prob / (prob + gamma) * adv
    obj = torch.where(is_peer[:, None], shaped, obj)
    loss = aggregate(-weights.to(obj.dtype)[:, None] * obj, mask, agg, num_tokens, num_seqs)
    metrics = _clip_metrics(ratio, adv, mask, is_peer, clip_low, clip_high, peer_clipped=False)
    peer_tok = mask & is_peer[:, None]
    metrics["sum/peer_prob"] = float(torch.where(peer_tok, prob.detach(), torch.zeros_like(prob)).sum())
    return loss, metrics | summarize(metrics)


def sgt_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    weights: Tensor,
    mask: Tensor,
    is_peer: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: str = "token-mean",
    ratio_level: str = "token",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    coef: float = 1.0,
    sgt_mask: Tensor | None = None,
    num_sgt_tokens: float | None = None,
) -> tuple[Tensor, dict]:
    """SGT baseline (Mutual RL, arXiv 2605.07244; spec §8) **[unverified] reconstruction**:

    L = L_GRAFT-clip(rows ∉ sgt_mask) + coef · Σ_{sgt rows, t} −logp / num_sgt_tokens.
    ``sgt_mask`` [B] marks peer successes on the receiver's all-fail prompts (default:
    ``is_peer``, i.e. the caller hands over only successes). SGT rows get no advantage, no
    ratio and no weight; the NLL is token-mean over SGT tokens (LUFFY's RL+SFT template).
    ``num_tokens``/``num_seqs`` count the non-SGT (policy-gradient) rows only,
    ``num_sgt_tokens`` the SGT tokens (defaults: this call's counts).
    The exact λ and normalisation of SGT are not public; λ = 1 follows LUFFY's sft_loss_coef.
    """
    _check(logp, old_logp, advantages, weights, mask, is_peer)
    sgt = is_peer if sgt_mask is None else sgt_mask
    assert sgt.shape == is_peer.shape and sgt.dtype == torch.bool, "sgt_mask must be Bool[B]"
    mask = mask.bool()
    pg_mask = mask & ~sgt[:, None]
    sgt_tok = mask & sgt[:, None]
    pg, metrics = policy_loss(
        logp, old_logp, advantages, weights, pg_mask, is_peer, clip_low, clip_high, agg, ratio_level, num_tokens, num_seqs
    )
    nll_sum = torch.where(sgt_tok, -logp, torch.zeros_like(logp)).sum()
    denom = sgt_tok.sum().clamp(min=1).item() if num_sgt_tokens is None else max(num_sgt_tokens, 1.0)
    nll = nll_sum / denom
    metrics["sum/sgt_nll"] = float(nll_sum.detach())
    metrics["tokens/sgt"] = int(sgt_tok.sum())
    return pg + coef * nll, metrics | summarize(metrics)


def hacpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    weights: Tensor,
    mask: Tensor,
    is_peer: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: str = "seq-mean-token-mean",
    ratio_level: str = "token",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[Tensor, dict]:
    """HACPO update (arXiv 2603.02604 eqs. 56-59; spec §8), simplified:

    own rows: −min(ρÂ, clip(ρ, 1−ε_low, 1+ε_high)Â) (w = 1);
    peer rows: −w · ρ · Â with no clipping, w = :func:`gating.hacpo_peer_weights`
    (stepwise clip of s, optionally times the capability ratio). Aggregation defaults to
    ``seq-mean-token-mean`` as HACPO requires.
    Departures: HACPO clips own rows at the sequence level (GSPO, radii 3e-4 / 4e-4) and
    recomputes s from the current policy inside the loss, so its peer gradient vanishes
    when s leaves [1−δ+kδ_step, 1]; here the stepwise-clipped s is a constant weight and
    the receiver's token ratio carries the gradient (equal to HACPO's with α = 0 while s
    lies inside the clip range).
    """
    _check(logp, old_logp, advantages, weights, mask, is_peer)
    mask, ratio, adv, obj = _ppo_parts(logp, old_logp, advantages, mask, clip_low, clip_high, ratio_level)
    obj = torch.where(is_peer[:, None], ratio * adv, obj)
    loss = aggregate(-weights.to(obj.dtype)[:, None] * obj, mask, agg, num_tokens, num_seqs)
    return loss, _clip_metrics(ratio, adv, mask, is_peer, clip_low, clip_high, peer_clipped=False)


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "low_var_kl") -> Tensor:
    """Per-token estimate [B,T] of KL(π_θ || π_ref) from ``logp`` and ``ref_logp`` [B,T], with d = logp − ref_logp
    (Schulman's k1/k2/k3; verl's ``kl_penalty``): ``k1``/``kl`` d; ``k2``/``mse`` d²/2; ``k3``/``low_var_kl``
    exp(−d) + d − 1 with d clamped to ±20 and the result to [−10, 10]; ``abs`` |d|. Masked positions hold garbage."""
    assert logp.dim() == 2 and ref_logp.shape == logp.shape, (
        f"expected [B,T] twice, got {tuple(logp.shape)}, {tuple(ref_logp.shape)}"
    )
    return KL_ESTIMATORS[kind](logp - ref_logp)


@KL_ESTIMATORS.register("k1")
@KL_ESTIMATORS.register("kl")
def kl_k1(d: Tensor) -> Tensor:
    """``k1`` / ``kl``: d."""
    return d


@KL_ESTIMATORS.register("k2")
@KL_ESTIMATORS.register("mse")
def kl_k2(d: Tensor) -> Tensor:
    """``k2`` / ``mse``: d² / 2."""
    return 0.5 * d.square()


@KL_ESTIMATORS.register("k3")
@KL_ESTIMATORS.register("low_var_kl")
def kl_k3(d: Tensor) -> Tensor:
    """``k3`` / ``low_var_kl``: exp(−d) + d − 1, d clamped to ±20 and the estimate to [−10, 10]."""
    d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(-d) + d - 1).clamp(-10.0, 10.0)


@KL_ESTIMATORS.register("abs")
def kl_abs(d: Tensor) -> Tensor:
    """``abs``: |d|."""
    return torch.abs(d)


def kl_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    kind: str = "low_var_kl",
    agg: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[Tensor, dict]:
    """The KL penalty of a micro-batch: :func:`kl_penalty` [B,T] over the valid tokens of ``mask`` [B,T],
    reduced by :func:`aggregate` (``agg``, the minibatch's global ``num_tokens``/``num_seqs``, as the policy loss).
    Unweighted by advantages or gate weights. Metrics: ``sum/kl``, ``tokens/kl`` and their :func:`summarize`
    (``kl``, the token mean)."""
    mask = mask.bool()
    assert logp.dim() == 2 and ref_logp.shape == logp.shape, (
        f"expected [B,T] twice, got {tuple(logp.shape)}, {tuple(ref_logp.shape)}"
    )
    assert mask.shape == logp.shape, f"mask must match logp [B,T], got {tuple(mask.shape)}, {tuple(logp.shape)}"
    zero = torch.zeros_like(logp)
    kl = torch.where(mask, kl_penalty(torch.where(mask, logp, zero), torch.where(mask, ref_logp, zero), kind), zero)
    metrics = {"sum/kl": float(kl.detach().sum()), "tokens/kl": int(mask.sum())}
    return aggregate(kl, mask, agg, num_tokens, num_seqs), metrics | summarize(metrics)
