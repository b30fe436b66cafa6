"""One exchange step among N >= 2 co-trained models on the same prompts (spec §3.2-3.4).

For every ordered pair (S, R) the candidates are C_{S->R} = {q : k_R(q) = 0, 1 <= k_S(q) < n};
every unordered pair {A, B} is balanced on its own with ``balanced_selection`` (m = min of the
two directions' candidate counts, ties kept). A receiver prompt kept by several sources goes
to one of them (``exchange.conflict``, :func:`graft.algos.selection.resolve_conflicts`); the
others' groups for it are dropped and the conflict is written into every contender's audit
record. With two models there are no conflicts and this is exactly the paper's exchange.

The kept groups are handed to their receivers (:func:`graft.exchange.handover.hand_over`),
re-verified by the receiver's grader, and spliced into the receiver's batch in place of its
own groups of those prompts.

``exchange.pairing`` (:mod:`graft.exchange.pairing`) chooses, per receiver and step, the peers it draws
from, after every direction is selected and scored (so each rule sees every peer's evidence, ``s``
included); the groups of the other peers are dropped like a lost conflict, and conflicts arise only among
the chosen. ``all`` (every peer) is the exchange of before the key, bit for bit, and writes no ``pairing``
field into the audit log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from graft.algos.selection import balanced_selection, candidate_mask, resolve_conflicts
from graft.config import ExchangeConfig
from graft.exchange.common import (
    Grade,
    counts,
    direction_audit,
    direction_metrics,
    pairing_metrics,
    regrade,
    solved_count,
    splice,
)
from graft.exchange.handover import HandOver, Receiver, Scoring, hand_over
from graft.exchange.pairing import PairingWindow
from graft.registry import PAIRINGS, SELECTIONS
from graft.types import ExchangeResult, HandedRow, PairingEvidence, PairingRecord, RolloutGroup


def select(k: dict[str, torch.Tensor], n: int, ex: ExchangeConfig, generator: torch.Generator | None):
    """Candidates, kept prompts and balanced targets m of every ordered pair (S, R), models in order.

    Returns ``cand[(S, R)]`` Bool[P], ``keep[(S, R)]`` Bool[P], ``m[(S, R)]`` (-1 without balancing).
    """
    names = list(k)
    cand = {(s, r): candidate_mask(k[r], k[s], n, ex.include_all_correct) for s in names for r in names if s != r}
    keep, m = {}, {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            keep[a, b], keep[b, a], sel = balanced_selection(
                k[a], cand[a, b], k[b], cand[b, a], ex.balance, ex.balance_ratio, ex.balance_floor
            )
            keep[a, b] = SELECTIONS[ex.selection](keep[a, b], k[b] == 0, generator)
            keep[b, a] = SELECTIONS[ex.selection](keep[b, a], k[a] == 0, generator)
            unbalanced = ex.balance == "none"
            m[a, b], m[b, a] = (-1, -1) if unbalanced else (int(sel["m_ab"]), int(sel["m_ba"]))
    return cand, keep, m


def exchange_live(
    step: int,
    groups: dict[str, list[RolloutGroup]],
    receivers: Mapping[str, Receiver],
    n: int,
    ex: ExchangeConfig,
    scoring: Scoring,
    grade: Grade,
    generator: torch.Generator | None = None,
    adv_norm: tuple[float, bool] = (1e-6, True),
    window: PairingWindow | None = None,
    *,
    threshold: float,
) -> ExchangeResult:
    """Exchange among the models of ``groups`` (same prompts, same order for every model); a response succeeds above
    ``threshold`` (``reward.success_threshold``), which decides the all-fail groups (k = 0) and so the candidates.

    ``window``: the pairing evidence of earlier steps (``exchange.pairing`` other than ``all``; updated in place;
    None: this step's evidence alone)."""
    names = list(groups)
    order = [g.prompt_id for g in groups[names[0]]]
    assert all([g.prompt_id for g in gs] == order for gs in groups.values()), "every model must see the same prompts in order"
    k = {name: counts(gs, threshold) for name, gs in groups.items()}
    cand, keep, m = select(k, n, ex, generator)
    handed: dict[tuple[str, str], HandOver] = {}
    for s in names:
        for r in names:
            if s != r:
                chosen = [groups[s][i] for i in torch.nonzero(keep[s, r]).flatten().tolist()]
                handed[s, r] = hand_over(
                    chosen,
                    receivers[r],
                    ex,
                    scoring,
                    generator,
                    own={g.prompt_id: g for g in groups[r]},
                    adv_norm=adv_norm,
                    threshold=threshold,
                )
    peers, pairing = pair(ex, window, names, k, handed)
    sel = Selection(k, cand, keep, m, handed, order, threshold)
    result = ExchangeResult({})
    for r in names:
        _receive(step, r, peers[r], groups, sel, pairing, ex.conflict, grade, result)
    result.audit.sort(key=lambda rec: (names.index(rec["source"]), names.index(rec["receiver"])))
    return result


def pair(
    ex: ExchangeConfig,
    window: PairingWindow | None,
    names: list[str],
    k: dict[str, torch.Tensor],
    handed: dict[tuple[str, str], HandOver],
) -> tuple[dict[str, list[str]], dict[tuple[str, str], PairingRecord]]:
    """The peers each receiver draws from at this step (``exchange.pairing``) and each direction's audit record."""
    evidence: dict[tuple[str, str], PairingEvidence] = {
        (s, r): {"solved": solved_count(k[s], k[r]), "s": [row["s"] for row in ho.rows]} for (s, r), ho in handed.items()
    }
    return PAIRINGS[ex.pairing].choose(window if window is not None else PairingWindow(ex.pairing_window), names, evidence)


@dataclass
class Selection:
    """One step's selection: ``k[M]`` Int[P], ``cand``/``keep[(S, R)]`` Bool[P], ``m[(S, R)]``, the hand-overs and
    the prompt ids in order [P]."""

    k: dict[str, torch.Tensor]
    cand: dict[tuple[str, str], torch.Tensor]
    keep: dict[tuple[str, str], torch.Tensor]
    m: dict[tuple[str, str], int]
    handed: dict[tuple[str, str], HandOver]
    order: list[str]
    threshold: float
    """``reward.success_threshold``."""


def _receive(
    step: int,
    r: str,
    sources: list[str],
    groups: dict[str, list[RolloutGroup]],
    sel: Selection,
    pairing: dict[tuple[str, str], PairingRecord],
    conflict: str,
    grade: Grade,
    result: ExchangeResult,
) -> None:
    """Receiver ``r``'s batch, audit records and metrics: the groups of ``sources`` (its paired peers) after conflicts."""
    k, keep, handed, order = sel.k, sel.keep, sel.handed, sel.order
    peers = [s for s in groups if s != r]
    won = _resolve(sources, r, keep, k, handed, order, conflict)
    conflicts = _conflict_records(sources, r, keep, won, k, handed, order)
    peer: list[RolloutGroup] = []
    pooled: dict[str, list[float]] = {}
    kept_rows: dict[str, list[HandedRow]] = {s: [] for s in peers}
    for s in sources:
        ho, lost_ids = handed[s, r], {order[i] for i in torch.nonzero(keep[s, r] & ~won[s]).flatten().tolist()}
        peer += [g for g in ho.groups if g.prompt_id not in lost_ids]
        pooled |= {p: a for p, a in ho.own_advantages.items() if p not in lost_ids}
        kept_rows[s] = [row for row in ho.rows if row["prompt_id"] not in lost_ids]
    graded = iter(regrade(grade, peer, [row for s in sources for row in kept_rows[s]]))
    rows = {s: [next(graded) for _ in kept_rows[s]] for s in peers}
    replaced = {order[i] for s in sources for i in torch.nonzero(won[s]).flatten().tolist()}
    result.train_groups[r] = splice(groups[r], peer, replaced, pooled)
    for s in peers:
        mine = [c for c in conflicts if s in c["contenders"]]
        rec = direction_audit(step, s, r, groups[s], k[s], k[r], sel.cand[s, r], keep[s, r], sel.m[s, r], rows[s], mine)
        result.metrics |= direction_metrics(
            s,
            r,
            sel.cand[s, r],
            keep[s, r],
            sel.m[s, r],
            rows[s],
            handed[s, r].metrics,
            sum(c["winner"] != s for c in mine),
            sel.threshold,
        )
        if pairing:
            rec["pairing"] = pairing[s, r]
            result.metrics |= pairing_metrics(s, r, pairing[s, r])
        result.audit.append(rec)


def _resolve(
    sources: list[str], r: str, keep: dict, k: dict, handed: dict, order: list[str], rule: str
) -> dict[str, torch.Tensor]:
    """Per source: the prompts it actually hands to ``r`` once conflicts among sources are resolved."""
    keep_m = torch.stack([keep[s, r] for s in sources])
    k_m = torch.stack([k[s] for s in sources])
    s_m = torch.tensor([[handed[s, r].s_mean.get(p, 0.0) for p in order] for s in sources])
    won = resolve_conflicts(keep_m, k_m, s_m, rule)
    return dict(zip(sources, won, strict=True))  # won: [S,P], a row per source


def _conflict_records(sources: list[str], r: str, keep: dict, won: dict, k: dict, handed: dict, order: list[str]) -> list[dict]:
    out = []
    for i, pid in enumerate(order):
        contenders = [s for s in sources if keep[s, r][i]]
        if len(contenders) > 1:
            out.append(
                {
                    "prompt_id": pid,
                    "winner": next(s for s in contenders if won[s][i]),
                    "contenders": {s: {"k_source": int(k[s][i]), "s_mean": handed[s, r].s_mean[pid]} for s in contenders},
                }
            )
    return out
