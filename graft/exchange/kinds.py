"""Which exchange a run performs, and one object per kind that performs it.

``exchange.kind`` names the kind, a name of :data:`graft.registry.EXCHANGES`; :func:`exchange_kind` is the one
place that reads it, :func:`make_exchange` builds the object. Every kind is called the same way,
``exchange(groups, step) -> ExchangeResult``, and per kind (class methods, no model needed):

- :meth:`Exchange.check` refuses, when the config loads, settings the kind cannot run (one line naming the
  field: how many models, the stored peer's store, the update rule it trains with);
- :meth:`Exchange.effective` gives the settings it actually uses, ``section.field -> value``: the exchange
  settings (HACPO's sharing replaces δ, admission ...), ``update.rule`` and ``update.loss_agg`` (HACPO's rule
  aggregates seq-mean-token-mean whatever ``update.loss_agg`` says);
- :meth:`Exchange.describe_config` says it for people: the method, one sentence, the effective settings and every
  configured value they override ("overridden by hacpo"). The run's ``config.yaml`` starts with these lines as
  comments, and the run summary, the model card, ``graft analyze`` and the report read them from here.

Adding a kind = one :class:`Exchange` subclass registered with ``@EXCHANGES.register("name")``
(:data:`graft.registry.EXCHANGES`) in any module of graft/exchange/, or from your own code before the config loads;
``exchange.kind: name`` selects it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import torch

from graft.algos.advantages import RollingRate
from graft.config import Config, ConfigError
from graft.exchange.common import Grade, adv_norm
from graft.exchange.hacpo import HACPO_SHARING, HACPO_UPDATE, hacpo_exchange
from graft.exchange.handover import Receiver, Scoring
from graft.exchange.live import exchange_live
from graft.exchange.pairing import PairingWindow
from graft.exchange.stored import exchange_stored, stored_peer_groups
from graft.registry import EXCHANGES, PAIRINGS
from graft.seeds import round_seed
from graft.storage.trajectory_store import StoredGroup, StoreError, TrajectoryStore
from graft.types import ExchangeResult, RolloutGroup


def exchange_kind(cfg: Config) -> str:
    """The exchange ``cfg`` runs: ``exchange.kind`` (read here and nowhere else)."""
    return cfg.exchange.kind


def _show(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)


@dataclass(frozen=True)
class ExchangeDescription:
    """What an exchange does, for people: summaries, model cards, reports."""

    kind: str
    method: str
    """The method's name (``GRPO``, ``GRAFT``, ``GRAFT (stored peer)``, ``HACPO``)."""
    summary: str
    """One sentence: who hands what to whom."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The settings in force (``section.field`` -> value, :meth:`Exchange.effective`): the exchange settings the
    kind uses (none when nothing is exchanged), ``update.rule`` and ``update.loss_agg``."""
    replaced: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """Configured settings the kind overrides: ``section.field`` -> (configured, used instead)."""

    def lines(self) -> list[str]:
        """The description as text lines: ``exchange: ...``, one line per overridden setting, and the effective
        settings (``effective: k=v, ...``)."""
        out = [f"exchange: {self.method} -- {self.summary}"]
        out += [f"  {k} = {_show(v)} (configured {_show(c)}: overridden by {self.kind})" for k, (c, v) in self.replaced.items()]
        out.append("  effective: " + ", ".join(f"{k}={_show(v)}" for k, v in self.settings.items()))
        return out


@dataclass
class StoredPeer:
    """A stored peer (``exchange.kind: stored``): its groups by prompt and its model name in the store."""

    groups: dict[str, list[StoredGroup]]
    name: str


def open_peer_store(cfg: Config) -> StoredPeer | None:
    """The stored peer's groups of ``cfg``'s exchange (read before any model loads), or None when it has none."""
    return EXCHANGES[exchange_kind(cfg)].open_peer(cfg)


GATE_SETTINGS = (
    "delta",
    "delta_by_length",
    "weight_cap",
    "admission",
    "weighting",
    "balance",
    "selection",
    "successes_only",
    "include_all_correct",
    "pooled_rewards",
)
"""The ``exchange.<field>`` settings a kind that hands groups over uses (its effective settings)."""


class Exchange:
    """One kind of exchange; ``exchange(groups, step)`` with ``groups`` = every model's scored groups of the step.

    A subclass is registered with ``@EXCHANGES.register("name")`` (which sets :attr:`name`), sets :attr:`method`,
    :attr:`models`, and where they apply :attr:`settings`, :attr:`overrides` and :attr:`rule`; it implements
    ``__call__`` and :meth:`summary`."""

    name: ClassVar[str]
    """Its registry name (``exchange.kind``)."""
    method: ClassVar[str]
    """The method's name for people (``GRAFT``)."""
    models: ClassVar[tuple[int, int | None]] = (1, None)
    """How many models it trains: (at least, at most; None = no limit)."""
    settings: ClassVar[tuple[str, ...]] = ()
    """The ``exchange.<field>`` settings it uses (reported as effective settings)."""
    overrides: ClassVar[Mapping[str, Any]] = {}
    """``section.field`` -> the value it uses in place of the configured one (stated as "overridden by KIND")."""
    rule: ClassVar[str | None] = None
    """The ``update.rule`` it trains with, which the config must name (None: any rule no other kind claims)."""
    hands_over: ClassVar[bool] = True
    """Models may train on groups that are not their own (False: GRPO, each model alone)."""
    pairs: ClassVar[bool] = False
    """A receiver may have several peers, so ``exchange.pairing`` chooses among them (refused by the other kinds)."""
    sampling_round: int = 0
    """The sampling round of the step that the next call exchanges (``rollout.dynamic_sampling`` runs several; the
    training loop sets it before each call): each round draws from its own random stream (:meth:`generator`)."""

    def __init__(self, cfg: Config, receivers: Mapping[str, Receiver], grade: Grade, peer: StoredPeer | None = None) -> None:
        self.cfg, self.receivers, self.grade, self.peer = cfg, receivers, grade, peer

    def __call__(self, groups: dict[str, list[RolloutGroup]], step: int) -> ExchangeResult:
        raise NotImplementedError

    # ------------------------------------------------------------------ the kind's settings (no model needed)
    @classmethod
    def check(cls, cfg: Config) -> None:
        """Refuse settings this kind cannot run: a :class:`ConfigError` of one line naming the field."""
        low, high = cls.models
        n = len(cfg.models)
        if n < low or (high is not None and n > high):
            want = f"exactly {low}" if low == high else f"at least {low}" if high is None else f"{low} to {high}"
            raise ConfigError(f"models: exchange.kind={cls.name} trains {want} model(s), got {n}")
        _check_rule(cls, cfg)
        PAIRINGS[cfg.exchange.pairing].check(cls.name, cls.pairs, cfg)

    @classmethod
    def effective(cls, cfg: Config) -> dict[str, Any]:
        """The settings in force, ``section.field`` -> value: the exchange settings it uses, ``update.rule`` and
        ``update.loss_agg``, each overridden value in place of the configured one."""
        used = {f"exchange.{k}": getattr(cfg.exchange, k) for k in cls.settings}
        used |= {"update.rule": cfg.update.rule, "update.loss_agg": cfg.update.loss_agg}
        return used | {k: v for k, v in cls.overrides.items() if k in used}

    @classmethod
    def replaced(cls, cfg: Config) -> dict[str, tuple[Any, Any]]:
        """The configured settings it overrides with another value: ``section.field`` -> (configured, used)."""
        configured = {k: _configured(cfg, k) for k in cls.overrides}
        used = cls.effective(cfg)
        return {k: (configured[k], used[k]) for k in cls.overrides if k in used and configured[k] != used[k]}

    @classmethod
    def summary(cls, cfg: Config) -> str:
        """One sentence: who hands what to whom."""
        raise NotImplementedError

    @classmethod
    def describe_config(cls, cfg: Config) -> ExchangeDescription:
        return ExchangeDescription(cls.name, cls.method, cls.summary(cfg), cls.effective(cfg), cls.replaced(cfg))

    def describe(self) -> ExchangeDescription:
        return self.describe_config(self.cfg)

    @classmethod
    def open_peer(cls, cfg: Config) -> StoredPeer | None:
        """The stored peer it replays (read before any model loads); None: its peers are trained in this run."""
        return None

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
        return adv_norm(self.cfg.update)

    def generator(self, step: int) -> torch.Generator:
        """The random stream of the exchange (random selection / admission ablations) at ``step`` and the sampling
        round :attr:`sampling_round` (round 0: the step's stream)."""
        return torch.Generator().manual_seed(round_seed(self.cfg.seed, step, self.sampling_round, "exchange"))


def _configured(cfg: Config, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _check_rule(kind: type[Exchange], cfg: Config) -> None:
    """``update.rule`` agrees with the kind: the rule it trains with, or no rule another kind claims."""
    rule = cfg.update.rule
    if kind.rule is not None and rule != kind.rule:
        raise ConfigError(f"update.rule: exchange.kind={kind.name} trains with update.rule={kind.rule}, got {rule!r}")
    owners = [name for name in EXCHANGES if name != kind.name and EXCHANGES[name].rule == rule]
    if kind.rule is None and owners:
        raise ConfigError(
            f"update.rule: {rule} runs with its own exchange, exchange.kind={owners[0]} (got exchange.kind={kind.name})"
        )


@EXCHANGES.register("none")
class NoExchange(Exchange):
    """GRPO: every model trains on its own groups."""

    method, hands_over = "GRPO", False

    def __call__(self, groups, step):
        return ExchangeResult.unchanged(groups)

    @classmethod
    def summary(cls, cfg):
        return "none: every model trains on its own groups (exchange.kind=none)"


@EXCHANGES.register("live")
class LiveExchange(Exchange):
    """GRAFT among the co-trained models (spec §3)."""

    method, models, settings = "GRAFT", (2, None), GATE_SETTINGS + ("conflict", "pairing")
    pairs = True

    def __init__(self, cfg: Config, receivers: Mapping[str, Receiver], grade: Grade, peer: StoredPeer | None = None) -> None:
        super().__init__(cfg, receivers, grade, peer)
        self.window = PairingWindow(cfg.exchange.pairing_window)
        """The pairing evidence of the last ``exchange.pairing_window`` steps (unused with ``pairing: all``)."""

    def __call__(self, groups, step):
        return exchange_live(
            step,
            groups,
            self.receivers,
            self.cfg.rollout.n,
            self.cfg.exchange,
            self.scoring,
            self.grade,
            self.generator(step),
            self.adv_norm,
            self.window,
            threshold=self.cfg.reward.success_threshold,
        )

    @classmethod
    def effective(cls, cfg):
        pairing = PAIRINGS[cfg.exchange.pairing]
        return super().effective(cfg) | {f"exchange.{k}": getattr(cfg.exchange, k) for k in pairing.settings}

    @classmethod
    def summary(cls, cfg):
        names = [m.name for m in cfg.models]
        ex = cfg.exchange
        return (
            f"whole groups among {', '.join(names)} on the prompts where a receiver fails every sample"
            f"{PAIRINGS[ex.pairing].phrase(cfg)}, "
            f"gated at s > {ex.delta}"
        )

    def state_dict(self) -> dict:
        return PAIRINGS[self.cfg.exchange.pairing].state(self.window)

    def load_state_dict(self, state: dict) -> None:
        if "pairing" in state:
            self.window.load_state_dict(state["pairing"])


@EXCHANGES.register("stored")
class StoredExchange(Exchange):
    """One receiver; the peer's groups are replayed from a trajectory store (spec §6)."""

    method, models = "GRAFT (stored peer)", (1, 1)
    settings = tuple(k for k in GATE_SETTINGS if k != "balance")  # no partner direction: peer.balance instead

    peer: StoredPeer
    """Never None here: ``__init__`` refuses to build a stored exchange without its stored peer."""

    def __init__(self, cfg: Config, receivers: Mapping[str, Receiver], grade: Grade, peer: StoredPeer | None = None) -> None:
        peer = peer if peer is not None else open_peer_store(cfg)
        if peer is None:  # open_peer_store follows cfg's exchange.kind, whose peer is the stored one only for "stored"
            raise ConfigError(f"exchange.kind: a stored exchange needs exchange.kind=stored, got {exchange_kind(cfg)}")
        super().__init__(cfg, receivers, grade, peer)

    def __call__(self, groups, step):
        ((name, own),) = groups.items()
        cfg = self.cfg
        threshold = cfg.reward.success_threshold
        stored = stored_peer_groups(self.peer.groups, own, step, cfg.peer.pick, cfg.exchange.include_all_correct, threshold)
        return exchange_stored(
            step,
            own,
            stored,
            self.receivers[name],
            cfg.rollout.n,
            cfg.exchange,
            self.scoring,
            self.grade,
            cap=cfg.peer.max_replacements,
            balance=cfg.peer.balance,
            source_name=self.peer.name,
            generator=self.generator(step),
            adv_norm=self.adv_norm,
            threshold=threshold,
        )

    @classmethod
    def check(cls, cfg):
        if not cfg.peer.store_path:
            raise ConfigError("peer.store_path: is required with exchange.kind=stored")
        super().check(cfg)

    @classmethod
    def effective(cls, cfg):
        peer = cfg.peer
        return super().effective(cfg) | {
            "peer.pick": peer.pick,
            "peer.max_replacements": peer.max_replacements,
            "peer.balance": peer.balance,
        }

    @classmethod
    def open_peer(cls, cfg):
        try:
            store = TrajectoryStore(cfg.peer.store_path)
            name = store.resolve_model(cfg.peer.store_model, exclude=cfg.models[0].name)
            return StoredPeer(store.iter_groups(name), name)
        except StoreError as e:
            raise StoreError(f"peer.store_path: {e}") from None

    @classmethod
    def summary(cls, cfg):
        return (
            f"groups of the peer stored in {cfg.peer.store_path} replace {cfg.models[0].name}'s all-fail groups "
            f"(peer.pick={cfg.peer.pick}), gated at s > {cfg.exchange.delta}"
        )


@EXCHANGES.register("hacpo")
class HacpoExchange(Exchange):
    """HACPO's sharing (spec §8): every prompt's peer responses join the receiver, with capability-aware advantages."""

    method, models, rule = "HACPO", (2, 2), HACPO_UPDATE["rule"]
    settings = tuple(k for k in GATE_SETTINGS if k not in ("balance", "selection"))  # every prompt is shared
    overrides = {**{f"exchange.{k}": v for k, v in HACPO_SHARING.items()}, **{f"update.{k}": v for k, v in HACPO_UPDATE.items()}}

    def __init__(self, cfg: Config, receivers: Mapping[str, Receiver], grade: Grade, peer: StoredPeer | None = None) -> None:
        super().__init__(cfg, receivers, grade, peer)
        self.rates = {m.name: RollingRate(cfg.update.hacpo_window) for m in cfg.models}
        """Per model: the rolling success rate over ``update.hacpo_window`` steps (HACPO's capability P)."""

    def __call__(self, groups, step):
        return hacpo_exchange(
            step,
            groups,
            self.receivers,
            self.rates,
            self.cfg.exchange,
            self.scoring,
            self.grade,
            self.adv_norm,
            threshold=self.cfg.reward.success_threshold,
        )

    @classmethod
    def summary(cls, cfg):
        return "every prompt's whole group both ways, weighted min(s, 1), with capability-aware advantages (update.rule=hacpo)"

    def state_dict(self) -> dict:
        return {"rates": {n: r.state_dict() for n, r in self.rates.items()}}

    def load_state_dict(self, state: dict) -> None:
        for name, st in state.get("rates", {}).items():
            self.rates.setdefault(name, RollingRate(self.cfg.update.hacpo_window)).load_state_dict(st)


def make_exchange(cfg: Config, receivers: Mapping[str, Receiver], grade: Grade, peer: StoredPeer | None = None) -> Exchange:
    """The exchange ``cfg`` runs (``exchange.kind``) over ``receivers`` (the learners), re-verifying peer
    responses with ``grade``; ``peer``: the stored peer already read by :func:`open_peer_store`."""
    return EXCHANGES[exchange_kind(cfg)](cfg, receivers, grade, peer)


def hands_over(cfg: Config) -> bool:
    """Does ``cfg``'s exchange hand groups between models (every kind but ``none``)?"""
    return EXCHANGES[exchange_kind(cfg)].hands_over


def describe_exchange(cfg: Config) -> ExchangeDescription:
    """What the exchange of ``cfg`` does, without building it (no models needed)."""
    return EXCHANGES[exchange_kind(cfg)].describe_config(cfg)
