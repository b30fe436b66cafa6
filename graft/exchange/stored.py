"""Exchange with a stored peer (spec §6): one receiver, peer groups replayed from a trajectory store."""

from __future__ import annotations

import torch

from graft.algos.selection import candidate_mask, capped_selection
from graft.config import ExchangeConfig
from graft.exchange.common import Grade, complementarity, counts, direction_audit, direction_metrics, regrade, splice
from graft.exchange.handover import Receiver, Scoring, hand_over
from graft.registry import PICKS
from graft.storage.trajectory_store import StoredGroup
from graft.types import ExchangeResult, RolloutGroup


def stored_peer_groups(
    stored: dict[str, list[StoredGroup]],
    own: list[RolloutGroup],
    step: int,
    pick: str,
    include_all_correct: bool,
    threshold: float,
) -> list[RolloutGroup | None]:
    """The stored group that plays the peer for each of ``own``'s prompts at ``step`` (None: nothing stored).

    ``pick`` (``PICKS``: :mod:`graft.storage.trajectory_store`) is given the candidate rule (1 <= k < n, or k = n
    with ``include_all_correct``; k counts the rewards above ``threshold``, this run's ``reward.success_threshold``)
    as its notion of eligible: ``latest`` / ``same_step`` ignore it (the candidate rule decides afterwards, so an
    all-fail latest group means "the peer fails too", never an older success); ``any`` prefers the eligible group
    with most successes.
    """

    def eligible(g: StoredGroup) -> bool:
        k = g.successes(threshold)
        return 1 <= k < g.size or (include_all_correct and k == g.size)

    out = []
    for g in own:
        pool = stored.get(g.prompt_id, [])
        chosen = PICKS[pick](pool, step, eligible, lambda g: g.successes(threshold))
        out.append(None if chosen is None else as_rollout_group(chosen))
    return out


def as_rollout_group(stored: StoredGroup) -> RolloutGroup:
    """A stored group as the source-side RolloutGroup it was when written (its own tokenization)."""
    G = len(stored.responses)
    return RolloutGroup(
        prompt_id=stored.prompt_id,
        problem=stored.problem,
        answer=stored.answer,
        source=stored.model,
        holder=stored.model,
        prompt_text="",
        prompt_token_ids=[],
        responses=list(stored.responses),
        token_ids=[list(t) for t in stored.token_ids],
        old_logprobs=[list(lp) for lp in stored.gen_logprobs],
        gen_token_ids=[list(t) for t in stored.token_ids],
        gen_logprobs=[list(lp) for lp in stored.gen_logprobs],
        finished=list(stored.finished),
        rewards=list(stored.rewards),
        status=list(stored.statuses),
        advantages=list(stored.advantages),
        weights=[1.0] * G,
        compat=[1.0] * G,
        step=stored.step,
        messages=stored.messages,
    )


def exchange_stored(
    step: int,
    own: list[RolloutGroup],
    stored: list[RolloutGroup | None],
    receiver: Receiver,
    n: int,
    ex: ExchangeConfig,
    scoring: Scoring,
    grade: Grade,
    *,
    cap: int | None,
    balance: bool,
    source_name: str,
    generator: torch.Generator | None = None,
    adv_norm: tuple[float, bool] = (1e-6, True),
    threshold: float,
) -> ExchangeResult:
    """One-direction exchange from stored peer groups (``stored[p]`` aligned with ``own``, None = no stored group).

    Candidates are the receiver's all-fail prompts whose stored group has 1 <= k < n_stored.
    There is no live partner direction: by default every candidate is kept (up to ``cap``,
    ties kept); with ``balance`` the reverse direction is read from the store too (prompts whose
    stored group is all-fail while the receiver has 1 <= k < n) and m = min of the two counts. Both sides' k count
    the rewards above ``threshold`` (this run's ``reward.success_threshold``; the receiver re-grades what it admits).
    """
    k_recv = counts(own, threshold)
    k_src = torch.tensor([g.successes(threshold) if g is not None else 0 for g in stored])
    n_src = torch.tensor([g.size if g is not None else n for g in stored])
    has = torch.tensor([g is not None for g in stored])
    upper = (k_src <= n_src) if ex.include_all_correct else (k_src < n_src)
    cand = has & (k_recv == 0) & (k_src >= 1) & upper
    m = -1
    if balance:
        reverse = has & candidate_mask(k_src, k_recv, n, False)
        m = min(int(cand.sum()), int(reverse.sum()))
        cap = m if cap is None else min(cap, m)
    keep = capped_selection(k_src, cand, cap)
    chosen = [stored[i] for i in torch.nonzero(keep).flatten().tolist()]
    ho = hand_over(
        chosen, receiver, ex, scoring, generator, own={g.prompt_id: g for g in own}, adv_norm=adv_norm, threshold=threshold
    )
    rows = regrade(grade, ho.groups, ho.rows)
    replaced = {own[i].prompt_id for i in torch.nonzero(keep).flatten().tolist()}
    src_groups = [g if g is not None else own[i] for i, g in enumerate(stored)]
    name = receiver.name
    metrics = direction_metrics(source_name, name, cand, keep, m, rows, ho.metrics, 0, threshold)
    metrics[f"complementarity/{source_name}->{name}"] = complementarity(k_src[has], k_recv[has])
    return ExchangeResult(
        {name: splice(own, ho.groups, replaced, ho.own_advantages)},
        [direction_audit(step, source_name, name, src_groups, k_src, k_recv, cand, keep, m, rows, [])],
        metrics,
    )
