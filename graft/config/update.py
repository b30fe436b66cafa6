"""``update.*``: the policy update (clipping, aggregation, minibatches, the baselines' rules)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from graft.config.checks import check, check_choices
from graft.registry import ADV_STDS, LOSS_AGGS, ORDERS, RATIO_LEVELS, RULES


@dataclass
class UpdateConfig:
    rule: Annotated[str, RULES] = "graft"
    """Update rule for peer data: GRAFT (weighted clipped token ratio), HACPO, LUFFY shaping or SGT NLL
    (formulas in graft/algos/losses.py). configs/baselines/ has the matching selection settings of each
    baseline (e.g. HACPO shares every prompt and aggregates seq-mean-token-mean)."""
    clip_low: float = 0.2
    """Lower clip: ratios below 1 - clip_low are clipped."""
    clip_high: float = 0.28
    """Upper clip: ratios above 1 + clip_high are clipped."""
    loss_agg: Annotated[str, LOSS_AGGS] = "token-mean"
    """``token-mean``: sum of weighted token losses over all valid tokens of the minibatch (the paper's text, DAPO, verl's
    default); ``seq-mean-token-mean``: per-sequence token mean, then mean over sequences (the paper's formula)."""
    ratio_level: Annotated[str, RATIO_LEVELS] = "token"
    """``token``: per-token ratio (paper); ``sequence``: exp(mean_t log ratio) per sequence (ablation)."""
    num_minibatches: int = 4
    """Optimiser steps per rollout batch; a prompt's group never straddles minibatches."""
    epochs: int = 1
    """Passes over the rollout batch."""
    order: Annotated[str, ORDERS] = "peer_last"
    """Minibatch order: peer-containing minibatches after the receiver's own (paper), before, or shuffled."""
    adv_eps: float = 1e-6
    """epsilon in (r - mean) / (std + eps); verl uses 1e-6, TRL 1e-4."""
    adv_std: Annotated[str, ADV_STDS] = "unbiased"
    """Group std with Bessel's correction (verl, TRL) or without."""
    logprob_chunk: int = 1024
    """Tokens per chunk when computing log-probs; the full-vocabulary log-softmax never exceeds chunk x V."""
    micro_batch_size: int = 8
    """Sequences per forward/backward inside a minibatch (gradient accumulation; memory knob)."""
    recompute_old_logprobs: bool = False
    """Recompute the receiver's own behaviour log-probs with a forward pass instead of using the sampler's."""
    luffy_gamma: float = 0.1
    """LUFFY shaping f(p) = p / (p + gamma) for off-policy tokens."""
    sgt_coef: float = 1.0
    """SGT: weight of the supervised NLL on peer successes."""
    hacpo_delta: float = 0.2
    """HACPO stepwise clip: peer weight clip(s, 1 - delta + k * delta_step, 1)."""
    hacpo_delta_step: float = 0.025
    """HACPO stepwise clip increment per minibatch index k."""
    hacpo_window: int = 5
    """HACPO rolling window (steps) of success rates for the capability ratio."""
    max_nonfinite_steps: int = 3
    """A minibatch whose loss or gradient norm is NaN/inf takes no optimiser step (counted in
    ``M/update/skipped_nonfinite``); after this many consecutive training steps with such a skip for one
    model the run stops (exit 3), keeping its last checkpoint."""

    def __post_init__(self) -> None:
        check_choices(self)
        check(0 <= self.clip_low < 1, "clip_low", f"must be in [0, 1), got {self.clip_low}")
        check(self.clip_high >= 0, "clip_high", f"must be >= 0, got {self.clip_high}")
        check(self.num_minibatches >= 1, "num_minibatches", f"must be >= 1, got {self.num_minibatches}")
        check(self.epochs >= 1, "epochs", f"must be >= 1, got {self.epochs}")
        check(self.adv_eps >= 0, "adv_eps", f"must be >= 0, got {self.adv_eps}")
        check(self.logprob_chunk >= 1, "logprob_chunk", f"must be >= 1, got {self.logprob_chunk}")
        check(self.micro_batch_size >= 1, "micro_batch_size", f"must be >= 1, got {self.micro_batch_size}")
        check(self.luffy_gamma > 0, "luffy_gamma", f"must be > 0, got {self.luffy_gamma}")
        check(self.sgt_coef >= 0, "sgt_coef", f"must be >= 0, got {self.sgt_coef}")
        check(0 <= self.hacpo_delta <= 1, "hacpo_delta", f"must be in [0, 1], got {self.hacpo_delta}")
        check(self.hacpo_delta_step >= 0, "hacpo_delta_step", f"must be >= 0, got {self.hacpo_delta_step}")
        check(self.hacpo_window >= 1, "hacpo_window", f"must be >= 1, got {self.hacpo_window}")
        check(self.max_nonfinite_steps >= 1, "max_nonfinite_steps", f"must be >= 1, got {self.max_nonfinite_steps}")
