"""One exchange step between co-trained models, and with a stored peer (spec §3.2–3.4, §6).

``exchange_pair`` decides which prompts each direction hands over (pure selection from
:mod:`graft.algos.selection`), hands the source groups to the receiver
(:func:`graft.exchange.handover.hand_over`) and splices the peer groups into the
receiver's batch in place of its all-fail groups.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from graft.algos.advantages import pooled_advantages, success_counts
from graft.algos.selection import balanced_selection, candidate_mask, capped_selection, random_selection
from graft.exchange.handover import GateSettings, Receiver, hand_over
from graft.types import RolloutGroup


def counts(groups: list[RolloutGroup]) -> torch.Tensor:
    """k[P]: successes per group."""
    return success_counts(torch.stack([g.rewards_tensor() for g in groups]))


def complementarity(k_src: torch.Tensor, k_recv: torch.Tensor) -> float:
    """Fraction of the receiver's all-fail prompts on which the source had >= 1 success (NaN if none)."""
    fail = k_recv == 0
    return float((k_src[fail] > 0).float().mean()) if bool(fail.any()) else float("nan")


def select_prompts(k_a: torch.Tensor, k_b: torch.Tensor, n: int, *, balance: str, selection: str,
                   include_all_correct: bool, ratio: float, floor: int,
                   generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """keep_ab[P], keep_ba[P]: prompts A hands to B and B hands to A."""
    cand_ab = candidate_mask(k_b, k_a, n, include_all_correct)
    cand_ba = candidate_mask(k_a, k_b, n, include_all_correct)
    keep_ab, keep_ba, metrics = balanced_selection(k_a, cand_ab, k_b, cand_ba, balance, ratio, floor)
    if selection == "random":
        keep_ab = random_selection(k_b == 0, int(keep_ab.sum()), generator)
        keep_ba = random_selection(k_a == 0, int(keep_ba.sum()), generator)
    return keep_ab, keep_ba, {"cand_ab": cand_ab, "cand_ba": cand_ba, **metrics}


def splice(own: list[RolloutGroup], peer: list[RolloutGroup], pooled: bool, eps: float, unbiased: bool) -> list[RolloutGroup]:
    """The receiver's batch: own groups, with each prompt that received a peer group replaced by it.

    Under the pooled-rewards ablation the receiver keeps its own group too, with
    advantages normalised jointly with the peer's rewards.
    """
    by_prompt = {g.prompt_id: g for g in peer}
    out = []
    for g in own:
        if g.prompt_id not in by_prompt:
            out.append(g)
        elif pooled:
            own_adv, _ = pooled_advantages(g.rewards_tensor(), by_prompt[g.prompt_id].rewards_tensor(), eps, unbiased)
            out.append(replace(g, advantages=own_adv.tolist()))
    return out + peer


def direction_audit(step: int, src: str, recv: str, groups_src: list[RolloutGroup], k_src: torch.Tensor,
                    k_recv: torch.Tensor, cand: torch.Tensor, keep: torch.Tensor, m: int, responses: list[dict]) -> dict:
    return {
        "step": step, "source": src, "receiver": recv,
        "candidates": [{"prompt_id": groups_src[i].prompt_id, "k_source": int(k_src[i]), "k_receiver": int(k_recv[i])}
                       for i in torch.nonzero(cand).flatten().tolist()],
        "m": m,
        "selected": [groups_src[i].prompt_id for i in torch.nonzero(keep).flatten().tolist()],
        "responses": responses,
    }


def direction_metrics(src: str, recv: str, cand: torch.Tensor, keep: torch.Tensor, m: int,
                      audit_rows: list[dict], gate_metrics: dict) -> dict:
    pre = f"exchange/{src}->{recv}"
    admitted = sum(r["admitted"] for r in audit_rows)
    return {
        f"{pre}/candidates": int(cand.sum()), f"{pre}/m": m, f"{pre}/kept_prompts": int(keep.sum()),
        f"{pre}/transferred": len(audit_rows), f"{pre}/admitted": admitted,
        f"{pre}/admitted_frac": admitted / len(audit_rows) if audit_rows else float("nan"),
        **{f"{pre}/{k}": v for k, v in gate_metrics.items() if k.startswith("s_")},
    }


def exchange_pair(step: int, groups: dict[str, list[RolloutGroup]], receivers: dict[str, Receiver], n: int,
                  settings: GateSettings, *, balance: str, selection: str, include_all_correct: bool,
                  ratio: float, floor: int, generator: torch.Generator | None):
    """Exchange between exactly two models A and B on the same prompts (same order).

    Returns (new groups per model, audit records [2], metrics, peer groups per receiver).
    """
    (a, ga), (b, gb) = groups.items()
    assert [g.prompt_id for g in ga] == [g.prompt_id for g in gb], "both models must see the same prompts in the same order"
    k_a, k_b = counts(ga), counts(gb)
    keep_ab, keep_ba, sel = select_prompts(k_a, k_b, n, balance=balance, selection=selection,
                                           include_all_correct=include_all_correct, ratio=ratio, floor=floor,
                                           generator=generator)
    out, audit, metrics, peers = {}, [], {}, {}
    for src, recv, g_src, g_recv, k_src, k_recv, keep, cand, m in (
        (a, b, ga, gb, k_a, k_b, keep_ab, sel["cand_ab"], sel["m_ab"]),
        (b, a, gb, ga, k_b, k_a, keep_ba, sel["cand_ba"], sel["m_ba"]),
    ):
        chosen = [g_src[i] for i in torch.nonzero(keep).flatten().tolist()]
        own_by_prompt = {g.prompt_id: g for g in g_recv}
        peer, rows, gate_m = hand_over(chosen, receivers[recv], own_by_prompt, settings, generator)
        peers[recv] = peer
        out[recv] = splice(g_recv, peer, settings.pooled_rewards, settings.adv_eps, settings.adv_unbiased)
        audit.append(direction_audit(step, src, recv, g_src, k_src, k_recv, cand, keep, int(m), rows))
        metrics |= direction_metrics(src, recv, cand, keep, int(m), rows, gate_m)
        metrics[f"complementarity/{src}->{recv}"] = complementarity(k_src, k_recv)
    return out, audit, metrics, peers


def exchange_stored(step: int, own: list[RolloutGroup], stored: list[RolloutGroup | None], receiver: Receiver,
                    n: int, settings: GateSettings, *, cap: int | None, balance: bool, source_name: str,
                    include_all_correct: bool, generator: torch.Generator | None):
    """One-direction exchange from stored peer groups (``stored[p]`` aligned with ``own``, None = no stored group).

    Candidates are the receiver's all-fail prompts whose stored group has 1 <= k < n
    (its own group size n). There is no live partner direction: by default every
    candidate is kept (up to ``cap``); with ``balance`` the reverse direction is read from
    the store too (prompts where the stored group is all-fail and the receiver has
    1 <= k < n) and m = min of the two counts, ties kept, as online.
    """
    k_recv = counts(own)
    k_src = torch.tensor([g.num_correct if g is not None else 0 for g in stored])
    n_src = torch.tensor([g.size if g is not None else n for g in stored])
    upper_ok = (k_src <= n_src) if include_all_correct else (k_src < n_src)
    cand = (k_recv == 0) & (k_src >= 1) & upper_ok
    m = -1
    if balance:
        has = torch.tensor([g is not None for g in stored])
        reverse = has & (k_src == 0) & (k_recv >= 1) & (k_recv < n)
        m = min(int(cand.sum()), int(reverse.sum()))
        cap = m if cap is None else min(cap, m)
    keep = capped_selection(k_src, cand, cap)
    chosen = [stored[i] for i in torch.nonzero(keep).flatten().tolist()]
    peer, rows, gate_m = hand_over(chosen, receiver, {g.prompt_id: g for g in own}, settings, generator)
    new = splice(own, peer, settings.pooled_rewards, settings.adv_eps, settings.adv_unbiased)
    src_groups = [g if g is not None else own[i] for i, g in enumerate(stored)]
    audit = [direction_audit(step, source_name, receiver.name, src_groups, k_src, k_recv, cand, keep, m, rows)]
    metrics = direction_metrics(source_name, receiver.name, cand, keep, int(keep.sum()), rows, gate_m)
    metrics[f"complementarity/{source_name}->{receiver.name}"] = complementarity(k_src, k_recv)
    return {receiver.name: new}, audit, metrics, {receiver.name: peer}
