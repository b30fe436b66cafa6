"""Handing a source group to a receiver: re-tokenize, score, gate, weight (spec §3.4).

This is the only place where a peer's response meets the receiver's model. The math
(compatibility score, gate, weights) is in :mod:`graft.algos.gating`; this module
does the plumbing around it and returns the audit rows that justify each decision.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch

from graft.algos import gating
from graft.algos.advantages import all_correct_advantages, pooled_advantages
from graft.config import Config, ExchangeConfig
from graft.console import bars
from graft.policy.codec import TextCodec
from graft.success import succeeded
from graft.types import HandedRow, RolloutGroup


class Receiver(Protocol):
    """What a receiver must offer to score peer text (a Learner, local or remote)."""

    name: str
    codec: TextCodec
    """How the receiver writes a prompt and tokenizes a response."""

    def token_logprobs(
        self,
        prompt_ids: list[list[int]],
        response_ids: list[list[int]],
        chunk: int,
        micro_batch: int,
        temperature: float,
        progress: bool = False,
    ) -> list[torch.Tensor]: ...


@dataclass(frozen=True)
class Scoring:
    """How a receiver scores peer text: its behaviour policy, forwarded as in its own update."""

    temperature: float = 1.0
    """The rollout temperature: the receiver's behaviour policy is its tempered distribution, the same one
    its own rollouts were sampled from, so peer old log-probs and ``s`` are on the source's scale."""
    chunk: int = 1024
    """``update.logprob_chunk``."""
    micro_batch: int = 8
    """``update.micro_batch_size``."""
    progress: bool = False
    """Show a progress bar while the receiver scores the peer responses (``progress`` and stderr a terminal)."""

    @classmethod
    def of(cls, cfg: Config) -> "Scoring":
        return cls(cfg.rollout.temperature, cfg.update.logprob_chunk, cfg.update.micro_batch_size, bars(cfg.progress))


@dataclass
class HandOver:
    """The result of handing source groups to one receiver."""

    groups: list[RolloutGroup]
    """[P'] peer groups held by the receiver: the admitted responses of each handed-over group
    (a group none of whose responses was admitted is absent)."""
    rows: list[HandedRow]
    """One audit row per transferred response (admitted or not)."""
    metrics: dict
    """Gate metrics over all transferred responses (:func:`gating.gate_metrics`)."""
    s_mean: dict[str, float]
    """prompt id -> mean ``s`` of its transferred group (conflict resolution among several sources)."""
    own_advantages: dict[str, list[float]]
    """Pooled-rewards ablation: prompt id -> the receiver's own advantages, normalised jointly with the
    source group's rewards (empty otherwise)."""


def _mean_or_neg_inf(values: list[float] | torch.Tensor) -> float:
    t = torch.as_tensor(values, dtype=torch.float64)
    return float(t.mean()) if t.numel() else float("-inf")


def hand_over(
    groups: list[RolloutGroup],
    receiver: Receiver,
    ex: ExchangeConfig,
    scoring: Scoring,
    generator: torch.Generator | None = None,
    own: dict[str, RolloutGroup] | None = None,
    adv_norm: tuple[float, bool] = (1e-6, True),
    *,
    threshold: float,
) -> HandOver:
    """Turn source groups into peer groups held by ``receiver``; ``threshold`` (``reward.success_threshold``) says
    which responses are successes (``ex.successes_only``) and which groups all-correct (``ex.include_all_correct``).

    Every response of every group is scored in one batch (N responses in all):
    ``s = exp(mean logp_R(o^R|q) - mean logp_phi(o^S|q))``, dropped when ``s <= delta``,
    weighted ``min(s, cap)``. Advantages are the source's, frozen; a handed-over all-correct
    group (only with ``ex.include_all_correct``) gets ``ex.all_correct_advantage``. Under the
    pooled-rewards ablation (``ex.pooled_rewards``, with the receiver's ``own`` groups by prompt)
    both sides' advantages are normalised over own rewards + the whole source group, before any
    response is dropped. Rewards are left for the receiver's grader to fill (``rewards`` holds the
    source's verdict until then). ``adv_norm`` = (``update.adv_eps``, unbiased std) for pooling.
    """
    if not groups:
        return HandOver([], [], gating.gate(torch.zeros(0), ex.delta)[2], {}, {})
    prompt_ids = [receiver.codec.encode_prompt(g.problem, g.messages) for g in groups]
    resp_ids = [receiver.codec.encode_responses(g.responses, g.finished) for g in groups]
    recv_lp = _receiver_logprobs(receiver, prompt_ids, resp_ids, scoring)  # [N] of [T_n]
    mean_r = torch.tensor([_mean_or_neg_inf(lp) for lp in recv_lp], dtype=torch.float64)
    mean_s = torch.tensor([_mean_or_neg_inf(lp) for g in groups for lp in g.gen_logprobs], dtype=torch.float64)
    s = torch.nan_to_num(gating.compatibility_scores(mean_r, mean_s), nan=0.0, posinf=0.0).float()  # [N]
    lengths = torch.tensor([len(r) for resp in resp_ids for r in resp], dtype=torch.long)
    delta = gating.length_deltas(lengths, ex.delta_by_length, ex.delta) if ex.delta_by_length else ex.delta
    admitted, weights, metrics = gating.gate(s, delta, ex.weight_cap, ex.admission, ex.weighting, generator)

    out, s_mean, own_adv, offset = [], {}, {}, 0
    rows: list[HandedRow] = []
    for g, p_ids, r_ids in zip(groups, prompt_ids, resp_ids, strict=True):
        sl = slice(offset, offset + g.size)
        offset += g.size
        advantages, mine = _peer_advantages(g, ex, own, adv_norm, threshold)
        if mine is not None:
            own_adv[g.prompt_id] = mine
        peer = _held(g, receiver, p_ids, r_ids, recv_lp[sl], advantages, weights[sl], s[sl])
        keep = [
            i for i in range(g.size) if bool(admitted[sl][i]) and (not ex.successes_only or succeeded(g.rewards[i], threshold))
        ]
        rows += _audit_rows(g, r_ids, advantages, keep, mean_r[sl], mean_s[sl], s[sl], weights[sl])
        s_mean[g.prompt_id] = float(s[sl].double().mean())
        if keep:
            out.append(peer.subset(keep))
    return HandOver(out, rows, metrics, s_mean, own_adv)


def _receiver_logprobs(
    receiver: Receiver, prompt_ids: list[list[int]], resp_ids: list[list[list[int]]], scoring: Scoring
) -> list[torch.Tensor]:
    """The receiver's token log-probs of every response of every group, in one batch (``[N]`` of ``[T_n]``)."""
    flat_prompts = [p for p, resp in zip(prompt_ids, resp_ids, strict=True) for _ in resp]
    flat_resp = [r for resp in resp_ids for r in resp]
    return receiver.token_logprobs(
        flat_prompts,
        flat_resp,
        chunk=scoring.chunk,
        micro_batch=scoring.micro_batch,
        temperature=scoring.temperature,
        progress=scoring.progress,
    )


def _held(
    g: RolloutGroup,
    receiver: Receiver,
    p_ids: list[int],
    r_ids: list[list[int]],
    recv_lp: list[torch.Tensor],
    advantages: list[float],
    weights: torch.Tensor,
    s: torch.Tensor,
) -> RolloutGroup:
    """``g`` as ``receiver`` holds it: in its prompt format and tokens, with its log-probs as the old ones, and
    the peer advantages, weights and ``s`` of the responses."""
    return replace(
        g,
        holder=receiver.name,
        prompt_text=receiver.codec.render_prompt(g.problem, g.messages),
        prompt_token_ids=p_ids,
        token_ids=r_ids,
        old_logprobs=[lp.tolist() for lp in recv_lp],
        advantages=advantages,
        weights=weights.tolist(),
        compat=s.tolist(),
    )


def _peer_advantages(
    g: RolloutGroup, ex: ExchangeConfig, own: dict[str, RolloutGroup] | None, adv_norm: tuple[float, bool], threshold: float
) -> tuple[list[float], list[float] | None]:
    """The advantages of ``g``'s responses in the receiver's hands, and the receiver's own advantages of the
    prompt where they change (the pooled-rewards ablation; else None): the source's advantages, a handed-over
    all-correct group's ``ex.all_correct_advantage``, or under ``ex.pooled_rewards`` both sides normalised jointly."""
    advantages = list(g.advantages)
    if ex.include_all_correct and g.successes(threshold) == g.size:
        advantages = all_correct_advantages(g.size, ex.all_correct_advantage).tolist()
    if ex.pooled_rewards and own and g.prompt_id in own:
        mine, theirs = pooled_advantages(own[g.prompt_id].rewards_tensor(), g.rewards_tensor(), *adv_norm)
        return theirs.tolist(), mine.tolist()
    return advantages, None


def _audit_rows(
    g: RolloutGroup,
    r_ids: list[list[int]],
    advantages: list[float],
    keep: list[int],
    mean_r: torch.Tensor,
    mean_s: torch.Tensor,
    s: torch.Tensor,
    weights: torch.Tensor,
) -> list[HandedRow]:
    """One audit row per response of ``g`` (``mean_r``, ``mean_s``, ``s``, ``weights``: the group's slices)."""
    return [
        {
            "prompt_id": g.prompt_id,
            "index": g.index[i],
            "reward_source": g.rewards[i],
            "advantage": advantages[i],
            "mean_logp_receiver": float(mean_r[i]),
            "mean_logp_source": float(mean_s[i]),
            "s": float(s[i]),
            "admitted": i in keep,
            "weight": float(weights[i]) if i in keep else 0.0,
            "receiver_tokens": len(r_ids[i]),
            "source_tokens": len(g.gen_token_ids[i]),
        }
        for i in range(g.size)
    ]
