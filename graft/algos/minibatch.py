"""Minibatch planning over whole groups (spec §3.5: peer-last; ablations §8: peer-first, random)."""

from __future__ import annotations

import torch

ORDERS = ("peer_last", "peer_first", "random")


def _ordered(group_is_peer: list[bool], order: str, generator: torch.Generator | None) -> list[int]:
    own = [i for i, p in enumerate(group_is_peer) if not p]
    peer = [i for i, p in enumerate(group_is_peer) if p]
    if order == "peer_last":
        return own + peer
    if order == "peer_first":
        return peer + own
    if order == "random":
        return torch.randperm(len(group_is_peer), generator=generator).tolist()
    raise ValueError(f"unknown minibatch order {order!r}; valid: {', '.join(ORDERS)}")


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
    seq = _ordered(list(group_is_peer), order, generator)
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
