"""HACPO's sharing (arXiv 2603.02604; spec §8): every prompt's peer responses join the learner's group.

No failure gate and no balancing: on every prompt the receiver trains on its own group plus the
whole peer group, scored like a GRAFT hand-over (``s``, weight ``min(s, 1)``, nothing dropped),
with HACPO's capability-aware advantages over the joint group. The per-minibatch stepwise clip
of the peer weights is the HACPO update rule's (:mod:`graft.trainer.rules`). Defined for a pair.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, TypedDict

import torch

from graft.algos.advantages import RollingRate, hacpo_advantages
from graft.config import ExchangeConfig
from graft.exchange.common import Grade, direction_metrics, regrade
from graft.exchange.handover import Receiver, Scoring, hand_over
from graft.types import ExchangeResult, RolloutGroup, TransferRow


class HacpoSharing(TypedDict):
    """The ``exchange.<field>`` values of :data:`HACPO_SHARING` (typed as the fields of :class:`ExchangeConfig`)."""

    delta: float
    delta_by_length: dict[int, float]
    admission: str
    weighting: str
    successes_only: bool
    pooled_rewards: bool
    include_all_correct: bool


HACPO_SHARING: HacpoSharing = {
    "delta": 0.0,
    "delta_by_length": {},
    "admission": "all",
    "weighting": "compat",
    "successes_only": False,
    "pooled_rewards": False,
    "include_all_correct": False,
}
"""The exchange settings HACPO's sharing uses in place of the configured ones (``exchange.<field>``): every
response of every prompt joins the receiver, weighted ``min(s, 1)``, none dropped."""
HACPO_UPDATE = {"rule": "hacpo", "loss_agg": "seq-mean-token-mean"}
"""The update HACPO trains with (``update.<field>``): its rule (:class:`graft.trainer.rules.HacpoRule`, which the
config must name: ``update.rule=hacpo``) and the loss aggregation that rule uses in place of ``update.loss_agg``."""


def hacpo_exchange(
    step: int,
    groups: dict[str, list[RolloutGroup]],
    receivers: Mapping[str, Receiver],
    rates: dict[str, RollingRate],
    ex: ExchangeConfig,
    scoring: Scoring,
    grade: Grade,
    adv_norm: tuple[float, bool] = (1e-6, True),
    *,
    threshold: float,
) -> ExchangeResult:
    """Share every group both ways between the two models of ``groups``; ``rates`` (each model's share of responses
    above ``threshold``, ``reward.success_threshold``) are updated in place.

    The models' own groups are not modified (the trajectory store keeps their GRPO advantages);
    the receiver trains on copies carrying the HACPO advantages.
    """
    assert len(groups) == 2, "HACPO sharing is defined for a pair of models"
    for name, gs in groups.items():
        rates[name].update(sum(g.successes(threshold) for g in gs) / max(sum(g.size for g in gs), 1))
    share = replace(ex, **HACPO_SHARING)
    (a, ga), (b, gb) = groups.items()
    result = ExchangeResult({})
    for src, recv, g_src, g_recv in ((a, b, ga, gb), (b, a, gb, ga)):
        ho = hand_over(g_src, receivers[recv], share, scoring, threshold=threshold)
        graded = regrade(grade, ho.groups, ho.rows)
        own = {g.prompt_id: g for g in g_recv}
        train_own, peer = dict(own), []
        for pg in ho.groups:
            adv_own, adv_peer = hacpo_advantages(
                own[pg.prompt_id].rewards_tensor(),
                pg.rewards_tensor(),
                rates[recv].value,
                rates[src].value,
                adv_norm[0],
                unbiased=adv_norm[1],
            )
            train_own[pg.prompt_id] = replace(own[pg.prompt_id], advantages=adv_own.tolist())
            peer.append(replace(pg, advantages=adv_peer.tolist()))
        adv = {(p.prompt_id, i): x for p in peer for i, x in zip(p.index, p.advantages, strict=True)}
        rows: list[TransferRow] = [{**row, "advantage": adv[row["prompt_id"], row["index"]]} for row in graded]
        result.train_groups[recv] = list(train_own.values()) + peer
        selected = torch.ones(len(g_src), dtype=torch.bool)
        result.audit.append(
            {
                "step": step,
                "source": src,
                "receiver": recv,
                "candidates": [],
                "m": -1,
                "selected": [g.prompt_id for g in peer],
                "responses": rows,
                "conflicts": [],
            }
        )
        result.metrics |= direction_metrics(src, recv, torch.zeros_like(selected), selected, -1, rows, ho.metrics, 0, threshold)
    return result
