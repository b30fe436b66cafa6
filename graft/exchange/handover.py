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
from graft.types import RolloutGroup


class Receiver(Protocol):
    """What a receiver must offer to score peer text (a Learner, local or remote)."""

    name: str

    def encode_prompt(self, problem: str) -> list[int]: ...
    def render_prompt(self, problem: str) -> str: ...
    def encode_responses(self, texts: list[str], finished: list[bool]) -> list[list[int]]: ...
    def token_logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]], chunk: int, micro_batch: int,
                       temperature: float, progress: bool = False) -> list[torch.Tensor]: ...


@dataclass
class GateSettings:
    """The knobs of one hand-over (copied from ExchangeConfig by the caller)."""

    delta: float = 0.8
    weight_cap: float = 1.0
    admission: str = "gate"
    weighting: str = "compat"
    delta_by_length: dict | None = None
    successes_only: bool = False
    pooled_rewards: bool = False
    all_correct_advantage: float = 1.0
    adv_eps: float = 1e-6
    adv_unbiased: bool = True
    temperature: float = 1.0
    """The rollout temperature: the receiver's behaviour policy is its tempered distribution, the same one
    its own rollouts were sampled from, so peer old log-probs and ``s`` are on the source's scale."""
    logprob_chunk: int = 1024
    micro_batch: int = 8
    progress: bool = False
    """Show a progress bar while the receiver scores the peer responses."""


def _mean_or_neg_inf(values: list[float] | torch.Tensor) -> float:
    t = torch.as_tensor(values, dtype=torch.float64)
    return float(t.mean()) if t.numel() else float("-inf")


def receiver_view(group: RolloutGroup, receiver: Receiver) -> tuple[list[int], list[list[int]]]:
    """The receiver's prompt ids and its tokenization of each of the group's responses."""
    return receiver.encode_prompt(group.problem), receiver.encode_responses(group.responses, group.finished)


def hand_over(
    groups: list[RolloutGroup],
    receiver: Receiver,
    own_groups: dict[str, RolloutGroup],
    settings: GateSettings,
    generator: torch.Generator | None = None,
) -> tuple[list[RolloutGroup], list[dict], dict]:
    """Turn source groups into peer groups held by ``receiver``.

    Every response of every group is scored in one batch (N responses in all):
    ``s = exp(mean logp_R(o^R|q) - mean logp_phi(o^S|q))``, dropped when ``s <= delta``,
    weighted ``min(s, cap)``. Advantages are the source's, frozen (or pooled with the
    receiver's own group under the ``pooled_rewards`` ablation). Rewards are left for the
    receiver's grader to fill (``rewards`` holds the source's verdict until then).

    Returns (peer groups with dropped responses removed, audit rows, gate metrics).
    """
    if not groups:
        return [], [], gating.gate(torch.zeros(0), settings.delta)[2]
    views = [receiver_view(g, receiver) for g in groups]
    prompt_ids = [p for (p, resp), g in zip(views, groups) for _ in resp]
    resp_ids = [r for _, resp in views for r in resp]
    recv_lp = receiver.token_logprobs(prompt_ids, resp_ids, chunk=settings.logprob_chunk,    # [N] of [T_n]
                                      micro_batch=settings.micro_batch, temperature=settings.temperature,
                                      progress=settings.progress)
    mean_r = torch.tensor([_mean_or_neg_inf(lp) for lp in recv_lp], dtype=torch.float64)
    mean_s = torch.tensor([_mean_or_neg_inf(lp) for g in groups for lp in g.gen_logprobs], dtype=torch.float64)
    s = torch.nan_to_num(gating.compatibility_scores(mean_r, mean_s), nan=0.0, posinf=0.0).float()   # [N]
    lengths = torch.tensor([len(r) for r in resp_ids], dtype=torch.long)
    delta = gating.length_deltas(lengths, settings.delta_by_length, settings.delta) if settings.delta_by_length else settings.delta
    admitted, weights, metrics = gating.gate(s, delta, settings.weight_cap, settings.admission, settings.weighting, generator)

    out, audit, offset = [], [], 0
    for g, (p_ids, r_ids) in zip(groups, views):
        sl = slice(offset, offset + g.size)
        offset += g.size
        peer = _peer_group(g, receiver, p_ids, r_ids, recv_lp[sl], s[sl], weights[sl], own_groups.get(g.prompt_id), settings)
        keep = [i for i in range(g.size) if bool(admitted[sl][i]) and (not settings.successes_only or g.rewards[i] > 0.5)]
        audit += [
            {"prompt_id": g.prompt_id, "index": i, "reward_source": g.rewards[i], "advantage": peer.advantages[i],
             "mean_logp_receiver": float(mean_r[sl][i]), "mean_logp_source": float(mean_s[sl][i]),
             "s": float(s[sl][i]), "admitted": i in keep, "weight": float(weights[sl][i]) if i in keep else 0.0,
             "receiver_tokens": len(r_ids[i]), "source_tokens": len(g.gen_token_ids[i])}
            for i in range(g.size)
        ]
        if keep:
            out.append(peer.subset(keep))
    return out, audit, metrics


def _peer_group(src: RolloutGroup, receiver: Receiver, prompt_ids: list[int], resp_ids: list[list[int]],
                recv_lp: list[torch.Tensor], s: torch.Tensor, weights: torch.Tensor,
                own: RolloutGroup | None, st: GateSettings) -> RolloutGroup:
    advantages = list(src.advantages)
    if src.num_correct == src.size:
        advantages = all_correct_advantages(src.size, st.all_correct_advantage).tolist()
    if st.pooled_rewards and own is not None:
        _, peer_adv = pooled_advantages(own.rewards_tensor(), src.rewards_tensor(), st.adv_eps, st.adv_unbiased)
        advantages = peer_adv.tolist()
    return replace(
        src,
        holder=receiver.name,
        prompt_text=receiver.render_prompt(src.problem),
        prompt_token_ids=prompt_ids,
        token_ids=resp_ids,
        old_logprobs=[lp.tolist() for lp in recv_lp],
        advantages=advantages,
        weights=weights.tolist(),
        compat=s.tolist(),
    )
