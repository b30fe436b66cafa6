"""Update rules: one object per rule, everything a rule changes around the shared loop.

GRAFT, LUFFY, SGT and HACPO share rollout, scoring and the update loop; a rule supplies
its loss (a pure function of :mod:`graft.algos.losses`) and, where it needs them, hooks:

- ``prepare(groups)``: a learner's training groups before minibatch planning;
- ``minibatch_weights(k, groups)``: re-weighting of the groups of minibatch k;
- ``supervised(group, i)``: rows trained with a supervised NLL instead of the policy gradient;
- ``state_dict`` / ``load_state_dict``: state carried across steps and checkpoints.

Adding a rule = one subclass registered with ``@RULES.register("name")`` (:data:`graft.registry.RULES`, whose names
``update.rule`` takes).

- ``graft``: spec §3.5.
- ``luffy``: peer tokens use f(pi) = pi / (pi + gamma), no clipping.
- ``sgt``: token-mean NLL (weight ``sgt_coef``) on peer *successes* only; peer failures are
  not trained on. Full SGT baseline: also ``exchange.balance=none exchange.admission=all
  exchange.weighting=none exchange.include_all_correct=true`` (configs/baselines/sgt.yaml).
- ``hacpo``: stepwise-clipped sequence weights of the peer rows per minibatch index, loss aggregated
  seq-mean-token-mean as in HACPO (``graft.exchange.hacpo.HACPO_UPDATE``, in place of ``update.loss_agg``); it
  runs with its exchange (every prompt shared, capability-aware advantages), ``exchange.kind=hacpo``
  (:class:`graft.exchange.kinds.HacpoExchange`, which states both overrides).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from graft.algos import losses
from graft.algos.gating import hacpo_peer_weights
from graft.config import UpdateConfig
from graft.exchange.hacpo import HACPO_UPDATE
from graft.registry import RULES
from graft.success import succeeded
from graft.types import RolloutGroup


@RULES.register("graft")
class UpdateRule:
    """GRAFT's update (spec §3.5); the base of every rule."""

    name: str
    """The registry name (``update.rule``)."""
    summary = "GRAFT: admitted peer tokens in the clipped token-level ratio, each response weighted min(s, cap) (spec §3.5)"
    """One line for model cards and reports."""
    loss: Callable = staticmethod(losses.policy_loss)
    """``(logp, old_logp, advantages, weights, mask, is_peer, ..., **loss_kwargs) -> (loss, metrics)``."""

    def __init__(self, uc: UpdateConfig, success_threshold: float) -> None:
        self.uc = uc
        self.success_threshold = success_threshold
        """``reward.success_threshold``: a peer response above it is a success (the SGT rule's NLL rows)."""

    def loss_kwargs(self) -> dict:
        """Extra keyword arguments of :attr:`loss`."""
        return {}

    def prepare(self, groups: list[RolloutGroup]) -> list[RolloutGroup]:
        return groups

    def minibatch_weights(self, k: int, groups: list[RolloutGroup]) -> list[RolloutGroup]:
        return groups

    def supervised(self, group: RolloutGroup, i: int) -> bool:
        """Is response ``i`` of ``group`` a supervised (NLL) row rather than a policy-gradient row?"""
        return False

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@RULES.register("hacpo")
class HacpoRule(UpdateRule):
    summary = "HACPO: peer responses of every prompt, capability-aware advantages, stepwise-clipped sequence weights"
    loss = staticmethod(losses.hacpo_loss)

    def loss_kwargs(self) -> dict:
        return {"agg": HACPO_UPDATE["loss_agg"]}  # in place of update.loss_agg; the exchange's description says so

    def minibatch_weights(self, k: int, groups: list[RolloutGroup]) -> list[RolloutGroup]:
        uc = self.uc
        return [
            replace(g, weights=hacpo_peer_weights(torch.tensor(g.compat), uc.hacpo_delta, uc.hacpo_delta_step, k).tolist())
            if g.is_peer
            else g
            for g in groups
        ]


@RULES.register("luffy")
class LuffyRule(UpdateRule):
    summary = "LUFFY-style: peer tokens shaped by f(p) = p / (p + gamma), unclipped"
    loss = staticmethod(losses.luffy_loss)

    def loss_kwargs(self) -> dict:
        return {"gamma": self.uc.luffy_gamma}


@RULES.register("sgt")
class SgtRule(UpdateRule):
    summary = "SGT: supervised NLL on peer successes"
    loss = staticmethod(losses.sgt_loss)

    def loss_kwargs(self) -> dict:
        return {"coef": self.uc.sgt_coef}

    def prepare(self, groups: list[RolloutGroup]) -> list[RolloutGroup]:
        """Peer groups keep their successes only (the NLL rows)."""
        out = []
        for g in groups:
            keep = [i for i in range(g.size) if self.supervised(g, i)] if g.is_peer else list(range(g.size))
            if keep:
                out.append(g.subset(keep) if g.is_peer else g)
        return out

    def supervised(self, group: RolloutGroup, i: int) -> bool:
        return group.is_peer and succeeded(group.rewards[i], self.success_threshold)


def make_rule(uc: UpdateConfig, success_threshold: float) -> UpdateRule:
    """The update rule ``uc.rule`` (a fresh object: rules may carry state); ``success_threshold``:
    ``reward.success_threshold``."""
    return RULES[uc.rule](uc, success_threshold)
