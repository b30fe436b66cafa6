"""Dynamic sampling (DAPO): keep only the groups that carry gradient, and sample more prompts until the batch is full.

Shape letters: ``P`` groups of one sampling round, ``G`` responses of the largest of them. A group whose
advantages are all 0 -- its rewards all equal (all fail, all succeed, one continuous value repeated) and no peer
group took its place -- adds nothing to the update; dynamic sampling drops it and draws the next prompts instead,
round after round, until ``target`` groups are kept or the rounds run out (``rollout.dynamic_sampling``).
"""

from __future__ import annotations

import torch
from torch import Tensor


def carries_gradient(advantages: Tensor, mask: Tensor) -> Tensor:
    """Bool[P]: the groups with a nonzero advantage among their responses. advantages [P,G] and mask Bool[P,G]
    (a group of fewer than G responses is padded; padding is ignored)."""
    assert advantages.dim() == 2 and mask.shape == advantages.shape, (tuple(advantages.shape), tuple(mask.shape))
    return ((advantages != 0) & mask.bool()).any(dim=1)


def fill(keep: Tensor, kept: int, target: int) -> Tensor:
    """Bool[P]: of one round's groups marked ``keep`` [P], the first ones in order that fit into a batch that already
    holds ``kept`` of its ``target`` groups."""
    assert keep.dim() == 1 and keep.dtype == torch.bool, f"keep must be Bool[P], got {keep.dtype} {tuple(keep.shape)}"
    take = keep.clone()
    take[keep.cumsum(0) > max(target - kept, 0)] = False
    return take


def round_metrics(sampled: int, kept: int, rounds: int) -> dict[str, float]:
    """``dynamic/rounds`` (sampling rounds this step), ``dynamic/sampled`` (groups sampled), ``dynamic/kept`` (groups
    the batch kept; 0: no update) and ``dynamic/kept_frac`` (the share of the sampled ones the batch kept)."""
    return {
        "dynamic/rounds": rounds,
        "dynamic/sampled": sampled,
        "dynamic/kept": kept,
        "dynamic/kept_frac": kept / sampled if sampled else 0.0,
    }
