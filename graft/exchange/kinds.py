"""Which exchange a run performs, decided in one place, and one object per kind that performs it.

:func:`exchange_kind` reads the three settings that decide it (``peer.source``, ``exchange.mode``,
``update.rule``); :func:`make_exchange` builds the object (a kind of :data:`graft.registry.EXCHANGES`).
Every kind is called the same way, ``exchange(groups, step) -> ExchangeResult``, and says what it does
with :meth:`Exchange.describe` -- the run summary, the model card, ``graft analyze`` and the report all
print that description. A kind that replaces configured settings (HACPO's sharing) lists them there.

Adding a kind = one :class:`Exchange` subclass (any module) registered in :data:`graft.registry.EXCHANGES`,
plus its case in :func:`exchange_kind`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import torch

from graft.algos.advantages import RollingRate
from graft.config import Config
from graft.exchange.hacpo import HACPO_SHARING, hacpo_exchange
from graft.exchange.handover import Receiver, Scoring
from graft.exchange.live import Grade, exchange_live
from graft.exchange.stored import exchange_stored, stored_peer_groups
from graft.registry import EXCHANGES
from graft.seeds import step_seed
from graft.storage.trajectory_store import StoredGroup, StoreError, TrajectoryStore
from graft.types import ExchangeResult, RolloutGroup


def exchange_kind(cfg: Config) -> str:
    """The exchange ``cfg`` runs: ``stored`` (``peer.source: store``), ``none`` (``exchange.mode: grpo``),
    ``hacpo`` (``update.rule: hacpo``: HACPO shares every prompt) or ``live`` (GRAFT among the co-trained models)."""
    if cfg.peer.source == "store":
        return "stored"
    if cfg.exchange.mode == "grpo":
        return "none"
    return "hacpo" if cfg.update.rule == "hacpo" else "live"


@dataclass(frozen=True)
class ExchangeDescription:
    """What an exchange does, for people: summaries, model cards, reports."""

    kind: str
    method: str
    """The method's name (``GRPO``, ``GRAFT``, ``GRAFT (stored peer)``, ``HACPO``)."""
    summary: str
    """One sentence: who hands what to whom."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The exchange settings in force (``exchange.<field>`` -> value); empty when nothing is exchanged."""
    replaced: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """Configured settings this kind does not use: ``exchange.<field>`` -> (configured, used instead)."""

    def lines(self) -> list[str]:
        """The description as text lines (``exchange: ...``)."""
        out = [f"exchange: {self.method} -- {self.summary}"]
        out += [f"  {k} = {v!r} (configured {c!r}: not used by {self.method})" for k, (c, v) in self.replaced.items()]
        return out


@dataclass
class StoredPeer:
    """A stored peer (``peer.source: store``): its groups by prompt and its model name in the store."""

    groups: dict[str, list[StoredGroup]]
    name: str


def open_peer_store(cfg: Config) -> StoredPeer | None:
    """The stored peer's groups (read before any model loads), or None when the peer is live."""
    if exchange_kind(cfg) != "stored":
        return None
    try:
        store = TrajectoryStore(cfg.peer.store_path)
        name = store.resolve_model(cfg.peer.store_model, exclude=cfg.models[0].name)
        return StoredPeer(store.iter_groups(name), name)
    except StoreError as e:
        raise StoreError(f"peer.store_path: {e}") from None


GATE_SETTINGS = ("delta", "delta_by_length", "weight_cap", "admission", "weighting", "balance", "selection",
                 "successes_only", "include_all_correct", "pooled_rewards")


class Exchange:
    """One kind of exchange; ``exchange(groups, step)`` with ``groups`` = every model's scored groups of the step."""

    kind: ClassVar[str]

    def __init__(self, cfg: Config, receivers: Mapping[str, Receiver], grade: Grade,
                 peer: StoredPeer | None = None) -> None:
        self.cfg, self.receivers, self.grade, self.peer = cfg, receivers, grade, peer

    def __call__(self, groups: dict[str, list[RolloutGroup]], step: int) -> ExchangeResult:
        raise NotImplementedError

    @classmethod
    def describe_config(cls, cfg: Config) -> ExchangeDescription:
        raise NotImplementedError

    def describe(self) -> ExchangeDescription:
        return self.describe_config(self.cfg)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    # ------------------------------------------------------------------ shared by the kinds
    @property
    def scoring(self) -> Scoring:
        return Scoring.of(self.cfg)

    @property
    def adv_norm(self) -> tuple[float, bool]:
        return self.cfg.update.adv_eps, self.cfg.update.adv_std == "unbiased"

    def generator(self, step: int) -> torch.Generator:
        """The step's random stream of the exchange (random selection / admission ablations)."""
        return torch.Generator().manual_seed(step_seed(self.cfg.seed, step, "exchange"))


def _settings(cfg: Config) -> dict[str, Any]:
    return {f"exchange.{k}": getattr(cfg.exchange, k) for k in GATE_SETTINGS}


class NoExchange(Exchange):
    """GRPO: every model trains on its own groups."""

    kind = "none"

    def __call__(self, groups, step):
        return ExchangeResult.unchanged(groups)

    @classmethod
    def describe_config(cls, cfg):
        return ExchangeDescription(cls.kind, "GRPO", "none: every model trains on its own groups (exchange.mode=grpo)")


class LiveExchange(Exchange):
    """GRAFT among the co-trained models (spec §3)."""

    kind = "live"

    def __call__(self, groups, step):
        return exchange_live(step, groups, self.receivers, self.cfg.rollout.n, self.cfg.exchange, self.scoring, self.grade,
                             self.generator(step), self.adv_norm)

    @classmethod
    def describe_config(cls, cfg):
        names = [m.name for m in cfg.models]
        return ExchangeDescription(cls.kind, "GRAFT", f"whole groups among {', '.join(names)} on the prompts where a "
                                   f"receiver fails every sample, gated at s > {cfg.exchange.delta}", _settings(cfg))


class StoredExchange(Exchange):
    """One receiver; the peer's groups are replayed from a trajectory store (spec §6)."""

    kind = "stored"

    def __init__(self, cfg: Config, receivers: Mapping[str, Receiver], grade: Grade,
                 peer: StoredPeer | None = None) -> None:
        super().__init__(cfg, receivers, grade, peer if peer is not None else open_peer_store(cfg))

    def __call__(self, groups, step):
        (name, own), = groups.items()
        cfg = self.cfg
        stored = stored_peer_groups(self.peer.groups, own, step, cfg.peer.pick, cfg.exchange.include_all_correct)
        return exchange_stored(step, own, stored, self.receivers[name], cfg.rollout.n, cfg.exchange, self.scoring,
                               self.grade, cap=cfg.peer.max_replacements, balance=cfg.peer.balance,
                               source_name=self.peer.name, generator=self.generator(step), adv_norm=self.adv_norm)

    @classmethod
    def describe_config(cls, cfg):
        return ExchangeDescription(cls.kind, "GRAFT (stored peer)", f"groups of the peer stored in {cfg.peer.store_path} "
                                   f"replace {cfg.models[0].name}'s all-fail groups (peer.pick={cfg.peer.pick}), gated at "
                                   f"s > {cfg.exchange.delta}", _settings(cfg) | {"peer.balance": cfg.peer.balance})


class HacpoExchange(Exchange):
    """HACPO's sharing (spec §8): every prompt's peer responses join the receiver, with capability-aware advantages."""

    kind = "hacpo"

    def __init__(self, cfg: Config, receivers: Mapping[str, Receiver], grade: Grade,
                 peer: StoredPeer | None = None) -> None:
        super().__init__(cfg, receivers, grade, peer)
        self.rates = {m.name: RollingRate(cfg.update.hacpo_window) for m in cfg.models}
        """Per model: the rolling success rate over ``update.hacpo_window`` steps (HACPO's capability P)."""

    def __call__(self, groups, step):
        return hacpo_exchange(step, groups, self.receivers, self.rates, self.cfg.exchange, self.scoring, self.grade,
                              self.adv_norm)

    @classmethod
    def describe_config(cls, cfg):
        configured = _settings(cfg)
        used = configured | {f"exchange.{k}": v for k, v in HACPO_SHARING.items()}
        replaced = {k: (configured[k], used[k]) for k in used if k in configured and configured[k] != used[k]}
        return ExchangeDescription(cls.kind, "HACPO", "every prompt's whole group both ways, weighted min(s, 1), with "
                                   "capability-aware advantages (update.rule=hacpo)", used, replaced)

    def state_dict(self) -> dict:
        return {"rates": {n: r.state_dict() for n, r in self.rates.items()}}

    def load_state_dict(self, state: dict) -> None:
        for name, st in state.get("rates", {}).items():
            self.rates.setdefault(name, RollingRate(self.cfg.update.hacpo_window)).load_state_dict(st)


def make_exchange(cfg: Config, receivers: Mapping[str, Receiver], grade: Grade, peer: StoredPeer | None = None) -> Exchange:
    """The exchange ``cfg`` runs (:func:`exchange_kind`) over ``receivers`` (the learners), re-verifying peer
    responses with ``grade``; ``peer``: the stored peer already read by :func:`open_peer_store`."""
    return EXCHANGES[exchange_kind(cfg)](cfg, receivers, grade, peer)


def describe_exchange(cfg: Config) -> ExchangeDescription:
    """What the exchange of ``cfg`` does, without building it (no models needed)."""
    return EXCHANGES[exchange_kind(cfg)].describe_config(cfg)
