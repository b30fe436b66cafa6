"""Dynamic sampling (DAPO's; verl's ``algorithm.filter_groups``) in the training loop: after the step's first
sampling round, more rounds on fresh prompts until every model's batch holds ``batch_prompts`` prompts that carry
gradient, or ``rollout.max_rounds`` rounds ran (``rollout.dynamic_sampling``).

A round is rollout -> score -> exchange on one batch of prompts, so the exchange sees every all-fail group first;
only what still carries no gradient for a model afterwards (:func:`graft.algos.dynamic.carries_gradient`) is
dropped, for that model. The unit is the prompt: a model keeps a prompt, with every group it trains on for it (its
own, a peer's, or both), when one of those groups carries gradient. Each model fills its own batch, with the first
such prompts that fit, in the order the rounds drew them (:func:`graft.algos.dynamic.fill`). Every model samples in
every round (the exchange needs every model's groups of the same prompts); a model whose batch is full keeps
nothing more. An extra round skips the prompts the step already drew (the sampler still counts them as drawn), so
a prompt is never twice in a model's batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from graft.algos.dynamic import carries_gradient, fill, round_metrics
from graft.exchange.common import merge_rounds
from graft.trainer.metrics import prefixed
from graft.types import ExchangeResult, Prompt, RolloutGroup


@dataclass
class Round:
    """One sampling round of a step."""

    prompts: list[Prompt]
    """[P] the prompts it sampled (fewer than ``batch_prompts`` where the step had drawn some already)."""
    groups: dict[str, list[RolloutGroup]]
    """Per model: its scored own groups, one per prompt."""
    exchange: ExchangeResult | None
    """The exchange's result (None: no prompt was left to sample)."""
    rollout: dict
    """The rollout's metrics, per model (``M/tokens/generated``, ...)."""


@dataclass
class Batch:
    """One model's batch as the rounds fill it."""

    groups: list[RolloutGroup] = field(default_factory=list)
    kept: int = 0
    """Prompts kept."""
    sampled: int = 0
    """Prompts sampled in the rounds that ran while the batch was not full."""
    rounds: int = 0
    """Those rounds."""
    tokens: int = 0
    """Response tokens the model generated in every round of the step."""


def carrying(prompts: list[str], groups: list[RolloutGroup]) -> torch.Tensor:
    """Bool[P]: which of the prompt ids ``prompts`` [P] carry gradient in ``groups`` (one model's training groups of
    a round): one of the prompt's groups has a nonzero advantage on a response of nonzero weight."""
    G = max((g.size for g in groups), default=0)
    adv = torch.zeros(len(groups), G, dtype=torch.float64)
    mask = torch.zeros(len(groups), G, dtype=torch.bool)
    for i, g in enumerate(groups):
        adv[i, : g.size] = torch.tensor(g.advantages, dtype=torch.float64)
        mask[i, : g.size] = torch.tensor([w != 0 for w in g.weights] if g.weights else [True] * g.size)
    ids = {g.prompt_id for g, c in zip(groups, carries_gradient(adv, mask).tolist(), strict=True) if c}
    return torch.tensor([p in ids for p in prompts], dtype=torch.bool)


def take(batches: dict[str, Batch], rnd: Round, target: int) -> None:
    """Every model's batch takes what it can use of round ``rnd``: the first prompts that carry gradient and fit."""
    ids = [p.id for p in rnd.prompts]
    for name, b in batches.items():
        b.tokens += int(rnd.rollout.get(f"{name}/tokens/generated", 0))
        if b.kept >= target:
            continue
        b.rounds, b.sampled = b.rounds + 1, b.sampled + len(ids)
        if rnd.exchange is None:
            continue
        train = rnd.exchange.train_groups[name]
        chosen = {p for p, c in zip(ids, fill(carrying(ids, train), b.kept, target).tolist(), strict=True) if c}
        b.groups += [g for g in train if g.prompt_id in chosen]
        b.kept += len(chosen)


def fill_batches(
    first: Round, draw: Callable[[], list[Prompt]], sample: Callable[[list[Prompt], int], Round], target: int, max_rounds: int
) -> tuple[dict[str, list[RolloutGroup]], ExchangeResult, dict]:
    """Round ``first`` (the step's round 0, already exchanged), then rounds ``sample(prompts, r)`` on the prompts of
    ``draw()`` not drawn yet this step, until every model keeps ``target`` prompts or ``max_rounds`` rounds ran.

    Returns every round's own groups per model (for the trajectory store), the exchange as the update and the logs
    see it (each model's kept groups; the rounds' audit records and metrics merged,
    :func:`graft.exchange.common.merge_rounds`) and the per-model ``M/dynamic/...`` metrics."""
    batches = {name: Batch() for name in first.groups}
    rounds, drawn = [first], {p.id for p in first.prompts}
    take(batches, first, target)
    while len(rounds) < max_rounds and any(b.kept < target for b in batches.values()):
        fresh = [p for p in draw() if p.id not in drawn]
        drawn |= {p.id for p in fresh}
        rounds.append(sample(fresh, len(rounds)) if fresh else Round([], {n: [] for n in batches}, None, {}))
        take(batches, rounds[-1], target)
    audit, metrics = merge_rounds([r.exchange for r in rounds if r.exchange is not None])
    every = {name: [g for r in rounds for g in r.groups[name]] for name in batches}
    out: dict = {}
    for name, b in batches.items():
        out |= prefixed(name, round_metrics(b.sampled, b.kept, b.rounds) | {"dynamic/tokens_generated": b.tokens})
    return every, ExchangeResult({n: b.groups for n, b in batches.items()}, audit, metrics), out
