"""Which peers a receiver draws from at a step (``exchange.pairing``; live exchange among three or more models).

Shape letters: ``W`` steps of the window (the current step and up to ``exchange.pairing_window - 1`` before it),
``S`` the receiver's peers (every other model, in ``models`` order), ``N`` responses.

The evidence of one step and one direction S -> R (:class:`graft.types.PairingEvidence`) is what the exchange measured anyway:

- ``solved``: how many of R's all-fail prompts (k_R = 0) S solved (k_S >= 1), spec §1's complementarity count;
- ``s``: the compatibility s of every response S handed to R (its balanced selection, before conflicts and
  pairing), as :func:`graft.exchange.handover.hand_over` scored it.

A pairing is a :class:`Pairing` registered in :data:`graft.registry.PAIRINGS`:

- ``all`` (:class:`EveryPeer`): every peer, nothing to decide, no audit record and no state (the exchange of before
  ``exchange.pairing``);
- ``complementary`` and ``compatible`` (:class:`ChoosePeer` over a pure scoring function ``(solved Int[W,S], s [S] of
  Float[N_S]) -> (chosen Bool[S], scores [S])``): the peer with the most solved prompts summed over the window
  (:func:`pair_complementary`), or with the highest median s (``torch.quantile`` 0.5, interpolated, like
  ``exchange/S->R/s_p50``) over all its responses handed to R in the window (:func:`pair_compatible`).

One peer is chosen; ties go to the earlier model in ``models`` (:func:`best`). A peer with no evidence scores 0
(``complementary``) or -inf (``compatible``, no response handed in the window; ``None`` in the audit log). Because
the window includes the current step there is evidence from the first step on; a receiver for which no peer has
any takes its first peer, which then has nothing to hand it this step (no candidate, or no selected prompt).

:class:`PairingWindow` keeps the evidence of the last W steps per direction (the live exchange's checkpointed state:
a resumed run decides as an uninterrupted one), and :func:`decide` turns it into each receiver's choice plus the
audit record of every direction, from which the decision re-derives (``docs/three-models.md``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import torch

from graft.config import Config, ConfigError
from graft.registry import PAIRINGS
from graft.types import PairingEvidence as Evidence, PairingRecord


def best(scores: torch.Tensor) -> torch.Tensor:
    """Bool[S]: True at the highest score only; ties go to the first (the earlier model in ``models``)."""
    assert scores.dim() == 1 and scores.numel() >= 1, scores.shape
    chosen = torch.zeros(scores.numel(), dtype=torch.bool)
    chosen[int(torch.argmax(scores))] = True  # argmax returns the first maximal index
    return chosen


def pair_complementary(solved: torch.Tensor, s: list[torch.Tensor]) -> tuple[torch.Tensor, list[float | None]]:
    """``complementary``: the peer that solved the most of the receiver's all-fail prompts over the window.

    ``solved`` Int[W,S]; score[S] = solved.sum over W."""
    W, S = solved.shape
    assert len(s) == S
    scores = solved.sum(0).double()
    return best(scores), [float(x) for x in scores]


def pair_compatible(solved: torch.Tensor, s: list[torch.Tensor]) -> tuple[torch.Tensor, list[float | None]]:
    """``compatible``: the peer whose responses handed to the receiver over the window have the highest median s.

    ``s`` [S] of Float[N_S] (every response of the window); a peer with N_S = 0 scores -inf (None)."""
    W, S = solved.shape
    assert len(s) == S and all(x.dim() == 1 for x in s)
    medians = [float(torch.quantile(x.double(), 0.5)) if x.numel() else None for x in s]
    scores = torch.tensor([float("-inf") if m is None else m for m in medians], dtype=torch.float64)
    return best(scores), medians


class PairingWindow:
    """The evidence of the last ``length`` steps of every direction S -> R (a deque per direction)."""

    def __init__(self, length: int) -> None:
        assert length >= 1, length
        self.length = length
        self.steps: dict[tuple[str, str], deque[Evidence]] = {}

    def push(self, evidence: dict[tuple[str, str], Evidence]) -> None:
        """Add one step's evidence of every direction ``(S, R)``."""
        for d, ev in evidence.items():
            self.steps.setdefault(d, deque(maxlen=self.length)).append(ev)

    def tensors(self, sources: list[str], receiver: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The window of ``receiver`` as a rule reads it: solved Int[W,S] and s [S] of Float[N_S]."""
        rows = [list(self.steps.get((src, receiver), ())) for src in sources]
        W = max(len(r) for r in rows)
        solved = torch.zeros(W, len(sources), dtype=torch.long)
        for j, r in enumerate(rows):
            for i, ev in enumerate(r):
                solved[W - len(r) + i, j] = ev["solved"]
        s = [torch.tensor([x for ev in r for x in ev["s"]], dtype=torch.float64) for r in rows]
        return solved, s

    def state_dict(self) -> dict:
        return {"length": self.length, "steps": [[src, recv, list(evs)] for (src, recv), evs in self.steps.items()]}

    def load_state_dict(self, state: dict) -> None:
        self.steps = {(src, recv): deque(evs, maxlen=self.length) for src, recv, evs in state.get("steps", [])}


Choice = tuple[dict[str, list[str]], dict[tuple[str, str], PairingRecord]]
"""``chosen[R]`` (the peers R draws from, in model order) and the audit record of every direction."""
ScoreFn = Callable[[torch.Tensor, list[torch.Tensor]], tuple[torch.Tensor, list[float | None]]]
"""``(solved Int[W,S], s [S] of Float[N_S]) -> (chosen Bool[S], scores [S])``."""


class Pairing:
    """One ``exchange.pairing`` rule: whom each receiver draws from, what it checks, states and records."""

    name: str
    """Its registry name, set by ``PAIRINGS.register``."""
    settings: tuple[str, ...] = ()
    """The ``exchange.<field>`` settings it reads beyond ``pairing`` (reported as effective settings)."""

    def check(self, kind: str, pairs: bool, cfg: Config) -> None:
        """Refuse a config it cannot run under exchange kind ``kind`` (``pairs``: a receiver there may have several
        peers): a :class:`ConfigError` naming ``exchange.pairing``."""

    def choose(self, window: PairingWindow, names: list[str], evidence: dict[tuple[str, str], Evidence]) -> Choice:
        raise NotImplementedError

    def phrase(self, cfg: Config) -> str:
        """What it adds to the exchange's one-sentence summary."""
        return ""

    def state(self, window: PairingWindow) -> dict[str, Any]:
        """What a checkpoint keeps of it (the live exchange's state)."""
        return {}


class EveryPeer(Pairing):
    """``all``: every peer; nothing decided, recorded or kept."""

    def choose(self, window: PairingWindow, names: list[str], evidence: dict[tuple[str, str], Evidence]) -> Choice:
        return {r: [s for s in names if s != r] for r in names}, {}


class ChoosePeer(Pairing):
    """The one peer a scoring function ranks first over the window (ties to the earlier model)."""

    settings = ("pairing_window",)

    def __init__(self, score: ScoreFn) -> None:
        self.score = score

    def check(self, kind: str, pairs: bool, cfg: Config) -> None:
        if not pairs:
            raise ConfigError(
                f"exchange.pairing: {self.name} chooses among a receiver's peers, which only exchange.kind=live "
                f"has (got exchange.kind={kind}); use exchange.pairing=all"
            )
        if len(cfg.models) < 3:
            raise ConfigError(
                f"exchange.pairing: {self.name} chooses among a receiver's peers, but with {len(cfg.models)} "
                "models each receiver has one; use exchange.pairing=all or three or more models"
            )

    def choose(self, window: PairingWindow, names: list[str], evidence: dict[tuple[str, str], Evidence]) -> Choice:
        return decide(self.score, self.name, window, names, evidence)

    def phrase(self, cfg: Config) -> str:
        return (
            f", each receiver from the one peer chosen by exchange.pairing={self.name} over {cfg.exchange.pairing_window} steps"
        )

    def state(self, window: PairingWindow) -> dict[str, Any]:
        return {"pairing": window.state_dict()}


PAIRINGS.register("all", EveryPeer())
PAIRINGS.register("complementary", ChoosePeer(pair_complementary))
PAIRINGS.register("compatible", ChoosePeer(pair_compatible))


def decide(
    rank: ScoreFn, rule: str, window: PairingWindow, names: list[str], evidence: dict[tuple[str, str], Evidence]
) -> Choice:
    """Push this step's ``evidence`` (every direction among ``names``) into ``window``, then choose per receiver by
    ``rank`` (the rule named ``rule`` in the audit records).

    Returns ``chosen[R]`` (the peers R draws from, in model order) and the audit record of every direction."""
    window.push(evidence)
    chosen: dict[str, list[str]] = {}
    records: dict[tuple[str, str], PairingRecord] = {}
    for r in names:
        sources = [s for s in names if s != r]
        mask, scores = rank(*window.tensors(sources, r))
        chosen[r] = [s for s, ok in zip(sources, mask.tolist(), strict=True) if ok]
        for s, score in zip(sources, scores, strict=True):
            records[s, r] = {
                "rule": rule,
                "window": window.length,
                "evidence": evidence[s, r],
                "score": score,
                "chosen": chosen[r],
            }
    return chosen, records
