"""One minibatch of the update, from rollout groups to a micro-batch loss.

Below both sides of a model: the driver's :class:`graft.trainer.learner.Learner` flattens groups into
:class:`Sequence` rows and splits a minibatch into :class:`Shard` s, and every rank's
:class:`graft.trainer.workers.PolicyWorker` computes :func:`micro_loss` on its share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from graft.algos.losses import kl_loss
from graft.config import UpdateConfig
from graft.types import RolloutGroup


@dataclass
class Sequence:
    """One response flattened for the update: holder-tokenized ids, behaviour log-probs, scalars."""

    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    weight: float
    is_peer: bool
    sgt: bool = False


def never(group: RolloutGroup, i: int) -> bool:
    return False


def flatten(groups: list[RolloutGroup], supervised=never) -> list[Sequence]:
    """All responses of ``groups`` as update sequences; ``supervised(group, i)`` marks SGT (NLL) rows."""
    return [
        Sequence(
            g.prompt_token_ids, g.token_ids[i], g.old_logprobs[i], g.advantages[i], g.weights[i], g.is_peer, sgt=supervised(g, i)
        )
        for g in groups
        for i in range(g.size)
    ]


def prepare_minibatch(
    mb_groups: list[RolloutGroup], supervised=never, zero_advantage: bool = False
) -> tuple[list[Sequence], tuple[float, float, float]]:
    """The rows of one minibatch that are forwarded, and the minibatch's normalisers
    (policy-gradient tokens, sequences, SGT tokens) -- shared with the Ray backend, which
    splits the rows across ranks and keeps these GLOBAL counts. Rows with zero advantage are
    forwarded only with ``zero_advantage`` (the KL penalty acts on them too)."""
    seqs = flatten(mb_groups, supervised)
    pg_rows = [s for s in seqs if not s.sgt]  # SGT rows are normalised separately
    counts = (
        float(sum(len(s.response_ids) for s in pg_rows)),
        float(len(pg_rows)),
        float(sum(len(s.response_ids) for s in seqs if s.sgt)),
    )
    active = [s for s in seqs if (s.advantage != 0.0 or s.sgt or zero_advantage) and s.weight != 0.0 and s.response_ids]
    return active, counts


def forwarded_positions(rows: list[Sequence], micro_batch: int) -> dict:
    """Decoder positions an update forwards for ``rows`` (unpadded): with shared prefixes, each distinct
    prompt once per micro-batch plus every response (``tokens/forwarded``); with one sequence per row,
    every row's prompt + response (``tokens/forwarded_per_sequence``, the cost before shared prefixes)."""
    shared = per_seq = 0
    for j in range(0, len(rows), micro_batch):
        micro = rows[j : j + micro_batch]
        shared += sum(len(p) for p in {tuple(s.prompt_ids) for s in micro}) + sum(len(s.response_ids) for s in micro)
        per_seq += sum(len(s.prompt_ids) + len(s.response_ids) for s in micro)
    return {"tokens/forwarded": shared, "tokens/forwarded_per_sequence": per_seq}


def _pad(rows: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
    return out


def micro_loss(
    policy,
    micro: list[Sequence],
    loss_fn,
    uc: UpdateConfig,
    temperature: float,
    counts: tuple[float, float, float],
    loss_kwargs: dict,
    reference=None,
):
    """Loss of one micro-batch, normalised by the whole minibatch's counts (policy-gradient tokens,
    sequences, SGT tokens) so micro-batch (and rank) gradients add up exactly; plus
    ``kl_coef`` times the KL penalty to ``reference`` (a frozen policy) when one is given."""
    num_tokens, num_seqs, num_sgt_tokens = counts
    logp, mask = policy.forward_logprobs(
        [s.prompt_ids for s in micro], [s.response_ids for s in micro], chunk=uc.logprob_chunk, temperature=temperature
    )  # [B,T]
    old = _pad([s.old_logprobs for s in micro], logp.shape[1]).to(logp.device)
    f = lambda xs, dt=torch.float32: torch.tensor(xs, dtype=dt, device=logp.device)  # noqa: E731
    kwargs = dict(
        logp=logp,
        old_logp=old,
        advantages=f([s.advantage for s in micro]),
        weights=f([s.weight for s in micro]),
        mask=mask,
        is_peer=f([s.is_peer for s in micro], torch.bool),
        clip_low=uc.clip_low,
        clip_high=uc.clip_high,
        agg=uc.loss_agg,
        ratio_level=uc.ratio_level,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
    )
    if any(s.sgt for s in micro) or num_sgt_tokens:
        kwargs |= {"sgt_mask": f([s.sgt for s in micro], torch.bool), "num_sgt_tokens": num_sgt_tokens}
    kwargs |= loss_kwargs  # a rule's own settings win (HACPO's aggregation: graft.exchange.hacpo.HACPO_UPDATE)
    loss, metrics = loss_fn(**kwargs)
    if reference is None:
        return loss, metrics
    kl, km = _kl_term(policy, reference, micro, logp, mask, kwargs["agg"], uc, temperature, counts)
    return loss + policy.cfg.kl_coef * kl, metrics | km


def _kl_term(
    policy,
    reference,
    micro: list[Sequence],
    logp: torch.Tensor,
    mask: torch.Tensor,
    agg: str,
    uc: UpdateConfig,
    temperature: float,
    counts: tuple[float, float, float],
) -> tuple[torch.Tensor, dict]:
    """:func:`~graft.algos.losses.kl_loss` of ``micro``'s policy-gradient rows (SGT rows excluded) against
    ``reference``'s log-probs, one more forward pass without gradients, aggregated by ``agg`` as the policy loss."""
    with torch.no_grad():
        ref, _ = reference.forward_logprobs(
            [s.prompt_ids for s in micro], [s.response_ids for s in micro], chunk=uc.logprob_chunk, temperature=temperature
        )
    pg = mask.bool() & ~torch.tensor([s.sgt for s in micro], dtype=torch.bool, device=mask.device)[:, None]
    return kl_loss(logp, ref.to(logp.device, logp.dtype), pg, policy.cfg.kl_loss_type, agg, counts[0], counts[1])


@dataclass
class Shard:
    """One rank's rows of one minibatch, with the minibatch's global normalisers."""

    rows: list
    """``Sequence`` rows to forward (non-zero advantage or supervised)."""
    counts: tuple[float, float, float]
    """(policy-gradient tokens, sequences, SGT tokens) of the WHOLE minibatch: every rank divides by these."""
    num_micro: int
    """Micro-batches every rank runs (the maximum over ranks; a rank with fewer runs zero-weight dummies)."""
    loss: Callable
    """The update rule's loss (a pure function of :mod:`graft.algos.losses`)."""
    loss_kwargs: dict
    """Its rule-specific keyword arguments (``UpdateRule.loss_kwargs``)."""
