"""Group advantages: GRPO (spec §3.1), pooled (ablation, §8), all-correct (beyond paper, §9), HACPO (§8).

Shape letters: ``P`` prompts, ``G`` samples per group. Nothing here assumes binary rewards; :func:`success_counts`
counts the responses that :func:`graft.types.succeeded` at the run's ``reward.success_threshold``.
"""

from __future__ import annotations

from collections import deque

import torch
from torch import Tensor

from graft.registry import ADV_STDS
from graft.success import succeeded

ADV_STDS.register("unbiased", True)
ADV_STDS.register("biased", False)


def success_counts(rewards: Tensor, threshold: float) -> Tensor:
    """k(q) = #{i : r_i > threshold} per prompt (:func:`graft.types.succeeded`). rewards [P,G] -> LongTensor [P]."""
    assert rewards.dim() == 2, f"rewards must be [P,G], got {tuple(rewards.shape)}"
    return succeeded(rewards, threshold).sum(dim=1)


def _normalise(rewards: Tensor, baseline: Tensor, eps: float, unbiased: bool) -> Tensor:
    """(r - b) / (std(r) + eps) along dim 1; rows whose rewards are all equal give exactly 0.

    The explicit zero avoids tiny float residues of r - mean being divided by eps.
    """
    g = rewards.shape[1]
    std = rewards.std(dim=1, correction=1 if unbiased and g > 1 else 0, keepdim=True)
    adv = (rewards - baseline) / (std + eps)
    constant = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(adv), adv)


def grpo_advantages(rewards: Tensor, eps: float = 1e-6, unbiased: bool = True) -> Tensor:
    """GRPO group advantage (spec §3.1): â_i = (r_i - mean(R)) / (std(R) + eps).

    ``unbiased`` uses Bessel's correction (verl, TRL); ``eps`` = 1e-6 is verl's value (TRL:
    1e-4). Zero-variance groups (all-fail, all-correct, and G = 1) get exactly 0.
    rewards [P,G] -> advantages [P,G].
    """
    assert rewards.dim() == 2, f"rewards must be [P,G], got {tuple(rewards.shape)}"
    rewards = rewards.float()
    if rewards.numel() == 0:
        return rewards.clone()
    return _normalise(rewards, rewards.mean(dim=1, keepdim=True), eps, unbiased)


def pooled_advantages(own: Tensor, peer: Tensor, eps: float = 1e-6, unbiased: bool = True) -> tuple[Tensor, Tensor]:
    """Ablation "pool peer and own rewards" (spec §8): GRPO normalisation over the joint group.

    R = own ⊕ peer; â = (R - mean(R)) / (std(R) + eps), split back. own [G1], peer [G2].
    GRAFT itself never pools: peer responses keep the source's frozen advantages (§3.4).
    """
    assert own.dim() == 1 and peer.dim() == 1, f"own/peer must be 1-D, got {tuple(own.shape)}, {tuple(peer.shape)}"
    joint = torch.cat([own.float(), peer.float()])[None]
    adv = grpo_advantages(joint, eps=eps, unbiased=unbiased)[0]
    return adv[: own.numel()], adv[own.numel() :]


def all_correct_advantages(G: int, value: float) -> Tensor:
    """Beyond the paper (``exchange.include_all_correct``, spec §9): a handed-over all-correct
    peer group (k_S = n) has zero variance, so GRPO would give 0; it gets the constant
    positive advantage ``value`` for every response instead. -> [G]."""
    assert G >= 0, f"G must be >= 0, got {G}"
    return torch.full((G,), float(value))


def _capability_ratio(p_learner: float, p_source: float, ratio_clamp: tuple[float, float]) -> float:
    lo, hi = ratio_clamp
    ratio = max(p_learner, 1e-8) / max(p_source, 1e-8)
    return min(max(ratio, lo), hi)


def hacpo_advantages(
    own_rewards: Tensor,
    peer_rewards: Tensor,
    p_learner: float,
    p_source: float,
    eps: float = 1e-6,
    ratio_clamp: tuple[float, float] = (0.1, 10.0),
    unbiased: bool = True,
) -> tuple[Tensor, Tensor]:
    """HACPO capability-aware advantage (arXiv 2603.02604 eqs. 5-6; spec §8).

    Joint group R = own ⊕ peer, weights ω_j = 1 for own and clamp(P_learner / P_source,
    *ratio_clamp) for peer responses, P = rolling success rates (:class:`RollingRate`).
    b = mean_j(r_j · ω_j); if all rewards are identical b = mean(R); if b > 1, b = mean(own).
    â_j = (r_j - b) / (std(R) + eps), std over the joint group (Bessel as in HACPO's code).
    Departure: rates are floored at 1e-8 before the ratio (HACPO's tracker floors each
    estimate the same way). Identical rewards give exactly 0. own [G1], peer [G2].
    """
    assert own_rewards.dim() == 1 and peer_rewards.dim() == 1, "own_rewards/peer_rewards must be 1-D"
    g1 = own_rewards.numel()
    joint = torch.cat([own_rewards.float(), peer_rewards.float()])
    if joint.numel() == 0:
        return joint.clone(), joint.clone()
    omega = torch.ones_like(joint)
    omega[g1:] = _capability_ratio(p_learner, p_source, ratio_clamp)
    baseline = (joint * omega).mean()
    if bool((joint == joint[0]).all()):
        baseline = joint.mean()
    elif baseline > 1.0 and g1 > 0:
        baseline = joint[:g1].mean()
    adv = _normalise(joint[None], baseline.reshape(1, 1), eps, unbiased)[0]
    return adv[:g1], adv[g1:]


class RollingRate:
    """Mean of the last ``window`` success rates (HACPO's capability P; window 5 in the paper).

    ``value`` is 1.0 before the first update, so the first capability ratio is 1.
    """

    def __init__(self, window: int = 5) -> None:
        assert window >= 1, f"window must be >= 1, got {window}"
        self.window = window
        self._rates: deque[float] = deque(maxlen=window)

    def update(self, rate: float) -> float:
        self._rates.append(float(rate))
        return self.value

    @property
    def value(self) -> float:
        return sum(self._rates) / len(self._rates) if self._rates else 1.0

    def state_dict(self) -> dict:
        return {"window": self.window, "rates": list(self._rates)}

    def load_state_dict(self, state: dict) -> None:
        self.window = int(state["window"])
        self._rates = deque((float(r) for r in state["rates"]), maxlen=self.window)
