"""Update rules: what each one changes around the shared loop, in one table.

GRAFT, LUFFY, SGT and HACPO share rollout, scoring and the update loop; they differ in the
loss (``graft.algos.losses.POLICY_LOSSES``) and in a few hooks listed here, so the loop
never branches on the rule name.

- ``graft``: spec §3.5.
- ``luffy``: peer tokens use f(pi) = pi / (pi + gamma), no clipping.
- ``sgt``: token-mean NLL (weight ``sgt_coef``) on peer *successes* only; peer failures are
  not trained on. Full SGT baseline: also ``exchange.balance=none exchange.admission=all
  exchange.weighting=none exchange.include_all_correct=true`` (configs/baselines/sgt.yaml).
- ``hacpo``: peer responses of *every* prompt join the learner (no failure gate), capability-
  aware advantages, stepwise-clipped sequence weights per minibatch index, loss aggregated
  seq-mean-token-mean as in HACPO.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from graft.algos.gating import hacpo_peer_weights
from graft.config import UpdateConfig
from graft.types import RolloutGroup


@dataclass(frozen=True)
class Rule:
    loss_kwargs: Callable[[UpdateConfig], dict]
    """Extra keyword arguments of the rule's loss."""
    prepare: Callable[[list[RolloutGroup]], list[RolloutGroup]] = lambda groups: groups
    """Applied to a learner's training groups before minibatch planning."""
    minibatch_weights: Callable[[UpdateConfig], Callable | None] = lambda uc: None
    """Factory of a ``(k, groups) -> groups`` re-weighting for minibatch index k."""
    shares_every_prompt: bool = False
    """Bypass GRAFT's selection: every prompt's peer group joins the learner."""
    sgt: bool = False
    """Mark peer successes as supervised (NLL) rows."""


def _peer_successes_only(groups: list[RolloutGroup]) -> list[RolloutGroup]:
    out = []
    for g in groups:
        if g.is_peer:
            keep = [i for i in range(g.size) if g.rewards[i] > 0.5]
            if keep:
                out.append(g.subset(keep))
        else:
            out.append(g)
    return out


def _hacpo_stepwise(uc: UpdateConfig):
    def apply(k: int, groups: list[RolloutGroup]) -> list[RolloutGroup]:
        return [replace(g, weights=hacpo_peer_weights(torch.tensor(g.compat), uc.hacpo_delta, uc.hacpo_delta_step, k).tolist())
                if g.is_peer else g for g in groups]
    return apply


RULES: dict[str, Rule] = {
    "graft": Rule(loss_kwargs=lambda uc: {}),
    "luffy": Rule(loss_kwargs=lambda uc: {"gamma": uc.luffy_gamma}),
    "sgt": Rule(loss_kwargs=lambda uc: {"coef": uc.sgt_coef}, prepare=_peer_successes_only, sgt=True),
    "hacpo": Rule(loss_kwargs=lambda uc: {"agg": "seq-mean-token-mean"}, minibatch_weights=_hacpo_stepwise,
                  shares_every_prompt=True),
}


def get_rule(name: str) -> Rule:
    if name not in RULES:
        raise ValueError(f"unknown update rule {name!r}; valid: {', '.join(RULES)}")
    return RULES[name]
