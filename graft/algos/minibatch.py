"""Minibatch planning over whole groups (spec §3.5: peer-last; ablations §8: peer-first, random)."""

from __future__ import annotations

import torch

from graft.registry import ORDERS


def _split(group_is_peer: list[bool]) -> tuple[list[int], list[int]]:
    return [i for i, p in enumerate(group_is_peer) if not p], [i for i, p in enumerate(group_is_peer) if p]


@ORDERS.register("peer_last")
def peer_last(group_is_peer: list[bool], generator: torch.Generator | None) -> list[int]:
    """``peer_last`` (spec §3.5): own groups, then peer groups, each in input order."""
    own, peer = _split(group_is_peer)
    return own + peer


@ORDERS.register("peer_first")
def peer_first(group_is_peer: list[bool], generator: torch.Generator | None) -> list[int]:
    """``peer_first`` (ablation): peer groups, then own groups."""
    own, peer = _split(group_is_peer)
    return peer + own


@ORDERS.register("random")
def random_order(group_is_peer: list[bool], generator: torch.Generator | None) -> list[int]:
    """``random`` (ablation): a permutation drawn from ``generator``."""
    return torch.randperm(len(group_is_peer), generator=generator).tolist()


def plan_minibatches(
    group_is_peer: list[bool], num_minibatches: int, order: str = "peer_last", generator: torch.Generator | None = None
) -> list[list[int]]:
    """Group indices per minibatch, in processing order.

    Groups are ordered (``peer_last``: own groups then peer groups, each in input order;
    ``peer_first``: the reverse; ``random``: a permutation drawn from ``generator``) and cut
    into k = min(num_minibatches, #groups) contiguous chunks whose sizes differ by at most
    1 (the first chunks are the larger). A group never straddles two minibatches, and with
    ``peer_last`` every own-only minibatch precedes every peer-containing one: before the
    first optimiser step ρ = 1 and clipping is inactive, so peer data seen later meets an
    already-active clip (spec §3.5, paper Table 9).
    """
    assert num_minibatches >= 1, f"num_minibatches must be >= 1, got {num_minibatches}"
    seq = ORDERS[order](list(group_is_peer), generator)
    k = min(num_minibatches, len(seq))
    if k == 0:
        return []
    size, extra = divmod(len(seq), k)
    out, start = [], 0
    for i in range(k):
        end = start + size + (1 if i < extra else 0)
        out.append(seq[start:end])
        start = end
    return out
