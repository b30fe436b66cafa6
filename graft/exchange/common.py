"""What every exchange kind shares: success counts, complementarity, the receiver's batch with peer groups spliced
in, its re-verification of what it trains on, and the per-direction audit record and metrics (spec §3, §6, §8), with
the pairing's metrics (:mod:`graft.exchange.pairing`).

Pure functions of groups and tensors; :mod:`graft.exchange.live`, :mod:`graft.exchange.stored`,
:mod:`graft.exchange.hacpo` and the training loop import them from here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from graft.algos.advantages import success_counts
from graft.algos.gating import S_STATISTICS, gate_metrics
from graft.config import UpdateConfig
from graft.registry import ADV_STDS
from graft.success import succeeded
from graft.types import DirectionAudit, ExchangeResult, HandedRow, PairingRecord, RolloutGroup, TransferRow

Grade = Callable[[list[RolloutGroup]], None]
"""Fills ``rewards`` and ``status`` of groups in place (the receiver's re-verification)."""


def adv_norm(update: UpdateConfig) -> tuple[float, bool]:
    """``(eps, unbiased)`` of every GRPO normalisation of a run: ``update.adv_eps`` and ``update.adv_std``."""
    return update.adv_eps, ADV_STDS[update.adv_std]


def counts(groups: list[RolloutGroup], threshold: float) -> torch.Tensor:
    """k[P]: successes per group (rewards above ``threshold``, ``reward.success_threshold``)."""
    return success_counts(torch.stack([g.rewards_tensor() for g in groups]), threshold)


def solved_count(k_src: torch.Tensor, k_recv: torch.Tensor) -> int:
    """How many of the receiver's all-fail prompts (k_recv = 0) the source solved (k_src >= 1); k_src, k_recv Int[P]."""
    assert k_src.shape == k_recv.shape, (k_src.shape, k_recv.shape)
    return int(((k_recv == 0) & (k_src > 0)).sum())


def complementarity(k_src: torch.Tensor, k_recv: torch.Tensor) -> float:
    """Fraction of the receiver's all-fail prompts on which the source had >= 1 success (NaN if none)."""
    fail = k_recv == 0
    return float((k_src[fail] > 0).float().mean()) if bool(fail.any()) else float("nan")


def splice(
    own: list[RolloutGroup], peer: list[RolloutGroup], replaced: set[str], pooled_own_advantages: dict[str, list[float]]
) -> list[RolloutGroup]:
    """The receiver's batch: its own groups except those of ``replaced`` prompts, then ``peer``.

    A replaced prompt whose peer group had no admitted response contributes nothing (README,
    decisions). Under the pooled-rewards ablation the receiver keeps its own group of a prompt
    that received peer responses, with the jointly normalised advantages.
    """
    received = {g.prompt_id for g in peer}
    out = []
    for g in own:
        if g.prompt_id not in replaced:
            out.append(g)
        elif g.prompt_id in pooled_own_advantages and g.prompt_id in received:
            out.append(replace(g, advantages=pooled_own_advantages[g.prompt_id]))
    return out + peer


def direction_audit(
    step: int,
    src: str,
    recv: str,
    groups_src: list[RolloutGroup],
    k_src: torch.Tensor,
    k_recv: torch.Tensor,
    cand: torch.Tensor,
    keep: torch.Tensor,
    m: int,
    rows: list[TransferRow],
    conflicts: list[dict],
) -> DirectionAudit:
    return {
        "step": step,
        "source": src,
        "receiver": recv,
        "candidates": [
            {"prompt_id": groups_src[i].prompt_id, "k_source": int(k_src[i]), "k_receiver": int(k_recv[i])}
            for i in torch.nonzero(cand).flatten().tolist()
        ],
        "m": m,
        "selected": [groups_src[i].prompt_id for i in torch.nonzero(keep).flatten().tolist()],
        "responses": rows,
        "conflicts": conflicts,
    }


def direction_metrics(
    src: str,
    recv: str,
    cand: torch.Tensor,
    keep: torch.Tensor,
    m: int,
    rows: list[TransferRow],
    gate_metrics: dict,
    lost: int,
    threshold: float,
) -> dict:
    """A direction's ``exchange/S->R/*`` metrics; ``*_correct`` count the responses the source's grading rewarded above
    ``threshold`` (``reward.success_threshold``)."""
    pre = f"exchange/{src}->{recv}"
    admitted = sum(r["admitted"] for r in rows)
    return {
        f"{pre}/candidates": int(cand.sum()),
        f"{pre}/m": m,
        f"{pre}/kept_prompts": int(keep.sum()),
        f"{pre}/transferred": len(rows),
        f"{pre}/admitted": admitted,
        f"{pre}/transferred_correct": sum(succeeded(r["reward_source"], threshold) for r in rows),
        f"{pre}/admitted_correct": sum(r["admitted"] and succeeded(r["reward_source"], threshold) for r in rows),
        f"{pre}/admitted_frac": admitted / len(rows) if rows else float("nan"),
        f"{pre}/conflicts_lost": lost,
        **{f"{pre}/{k}": v for k, v in gate_metrics.items() if k.startswith("s_")},
    }


def pairing_metrics(src: str, recv: str, record: PairingRecord) -> dict:
    """``exchange/S->R/paired`` (1: the receiver draws from S this step) and ``exchange/S->R/pairing_score`` (the
    direction's score over the pairing window; NaN without evidence)."""
    pre = f"exchange/{src}->{recv}"
    score = record["score"]
    return {f"{pre}/paired": int(src in record["chosen"]), f"{pre}/pairing_score": float("nan") if score is None else score}


def regrade(grade: Grade, peers: list[RolloutGroup], rows: list[HandedRow]) -> list[TransferRow]:
    """The receiver re-verifies the transferred responses it trains on (``peers``, in place); ``rows`` with its
    verdict (``reward_receiver``; None for a response not admitted)."""
    grade(peers)
    verdict = {(g.prompt_id, i): r for g in peers for i, r in zip(g.index, g.rewards, strict=True)}
    return [{**row, "reward_receiver": verdict.get((row["prompt_id"], row["index"]))} for row in rows]


ROUND_COUNTS = (
    "candidates",
    "kept_prompts",
    "transferred",
    "admitted",
    "transferred_correct",
    "admitted_correct",
    "conflicts_lost",
)
"""The ``exchange/S->R/...`` metrics that count; :func:`merge_rounds` sums them over a step's sampling rounds."""


def merge_rounds(results: list[ExchangeResult]) -> tuple[list[DirectionAudit], dict]:
    """The audit records and metrics of a step's exchanges over its sampling rounds (``rollout.dynamic_sampling``;
    ``results`` [R], round 0 first) as those of one exchange, so that every reader of the audit log and the run
    summary counts every round. Per direction one record: every round's candidates, selected prompts, responses and
    conflicts, ``m`` their sum (-1 without balancing), round 0's ``pairing`` and ``rounds``: R. The metrics: the
    counts (:data:`ROUND_COUNTS`) and ``m`` the same way, ``admitted_frac`` and the ``s`` statistics over the
    responses of the merged record, every other key round 0's. One round: its own records and metrics."""
    first = results[0]
    if len(results) == 1:
        return first.audit, first.metrics
    by_direction: dict[tuple[str, str], list[DirectionAudit]] = {}
    for res in results:
        for rec in res.audit:
            by_direction.setdefault((rec["source"], rec["receiver"]), []).append(rec)
    records, metrics = [], dict(first.metrics)
    for (src, recv), recs in by_direction.items():
        ms = [r["m"] for r in recs]
        merged: DirectionAudit = {
            **recs[0],
            "candidates": [c for r in recs for c in r["candidates"]],
            "m": -1 if -1 in ms else sum(ms),
            "selected": [p for r in recs for p in r["selected"]],
            "responses": [x for r in recs for x in r["responses"]],
            "conflicts": [c for r in recs for c in r["conflicts"]],
            "rounds": len(results),
        }
        records.append(merged)
        pre = f"exchange/{src}->{recv}"
        for key in ROUND_COUNTS + ("m",):
            values = [res.metrics[f"{pre}/{key}"] for res in results if f"{pre}/{key}" in res.metrics]
            if values:
                metrics[f"{pre}/{key}"] = -1 if key == "m" and -1 in values else sum(values)
        rows = merged["responses"]
        stats = gate_metrics(
            torch.tensor([r["s"] for r in rows], dtype=torch.float64),
            torch.tensor([bool(r["admitted"]) for r in rows], dtype=torch.bool),
        )
        metrics |= {f"{pre}/{k}": stats[k] for k in ("admitted_frac", *S_STATISTICS) if f"{pre}/{k}" in metrics}
    return records, metrics
