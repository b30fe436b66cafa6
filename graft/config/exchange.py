"""``exchange.*`` and ``peer.*``: which peer groups a model receives, and how they are gated and weighted."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from graft.config.checks import check, check_choices
from graft.registry import ADMISSIONS, BALANCES, CONFLICTS, EXCHANGES, PAIRINGS, PICKS, SELECTIONS, WEIGHTINGS


@dataclass
class ExchangeConfig:
    kind: Annotated[str, EXCHANGES] = "live"
    """Which exchange the run performs, a name of :data:`graft.registry.EXCHANGES`: ``live`` (GRAFT among the
    co-trained models), ``none`` (GRPO: each model trains alone, same loop otherwise), ``stored`` (GRAFT with a
    peer replayed from a trajectory store, ``peer.*``) or ``hacpo`` (HACPO's sharing; with ``update.rule=hacpo``).
    Each kind checks the settings it needs when the config loads and states the settings it actually uses
    (``graft.exchange.kinds``). The older keys ``exchange.mode`` (``graft``/``grpo``), ``peer.source`` (``store``)
    and ``update.rule=hacpo`` alone still load as the kind they mean (one notice; :mod:`graft.config.upgrade`)."""
    delta: float = 0.8
    """Gate: a peer response with compatibility s <= delta is dropped (spec §3.4)."""
    weight_cap: float = 1.0
    """Admitted peer responses get weight min(s, weight_cap)."""
    balance: Annotated[str, BALANCES] = "min"
    """Selection size per direction: ``min`` keeps m = min(|C_AB|, |C_BA|) (paper); ``none`` keeps all
    candidates; ``asymmetric`` keeps min(|C_dir|, ceil(balance_ratio * |C_other|) + balance_floor)."""
    balance_ratio: float = 2.0
    """``asymmetric`` balancing: how many times the other direction's count the richer one may keep."""
    balance_floor: int = 1
    """``asymmetric`` balancing: extra prompts a direction may keep beyond ratio times the other."""
    selection: Annotated[str, SELECTIONS] = "ranked"
    """``ranked`` keeps the candidates with most source successes (ties kept); ``random`` draws the same
    number from the receiver's all-fail prompts (ablation)."""
    admission: Annotated[str, ADMISSIONS] = "gate"
    """``gate`` admits s > delta; ``random`` admits as many responses as the gate would, at random;
    ``all`` admits every response (with ``weighting: none`` this is the no-compatibility ablation)."""
    weighting: Annotated[str, WEIGHTINGS] = "compat"
    """``compat`` weights admitted responses min(s, weight_cap); ``none`` gives them weight 1."""
    include_all_correct: bool = False
    """Beyond the paper: also hand over peer groups with k_S = n; their advantages are set to
    ``all_correct_advantage`` (they have zero variance, so GRPO would give 0)."""
    all_correct_advantage: float = 1.0
    """Advantage given to each response of a handed-over all-correct group."""
    successes_only: bool = False
    """Ablation: transfer only the successful responses of the selected peer group."""
    pooled_rewards: bool = False
    """Ablation: recompute advantages by normalising peer and own rewards together instead of keeping
    the source's frozen advantages."""
    delta_by_length: dict[int, float] = field(default_factory=dict)
    """Beyond the paper: per-length-bucket gates ``{max_tokens: delta}``; a response of L receiver tokens uses
    the delta of the smallest bucket bound >= L, else ``delta``."""
    conflict: Annotated[str, CONFLICTS] = "most_successes"
    """With three or more models, which source's group a receiver gets when several sources kept the same
    prompt after balancing: ``most_successes`` (highest k_S, then highest mean s, then model order),
    ``most_compatible`` (highest mean s, then k_S, then model order) or ``model_order`` (the earlier model
    in ``models``). Every conflict is written into the audit log. Never arises with two models."""
    pairing: Annotated[str, PAIRINGS] = "all"
    """With three or more models (``exchange.kind: live``), which peers each receiver draws from at a step, a name of
    :data:`graft.registry.PAIRINGS`: ``all`` (every peer), ``complementary`` (the one peer that
    solved, k_S >= 1, the most of the receiver's all-fail prompts over the last ``pairing_window`` steps) or
    ``compatible`` (the one peer whose responses handed to the receiver over those steps have the highest median
    s). Ties go to the earlier model in ``models``; the window includes the current step. Each decision, with its
    evidence, is written into the audit log (``pairing``). Refused with two models and by the other kinds (a
    receiver has one peer there)."""
    pairing_window: int = 8
    """``complementary``/``compatible`` pairing: how many steps of evidence (the current step and the ones before it)
    a receiver's choice reads."""

    def __post_init__(self) -> None:
        check_choices(self)
        check(self.delta >= 0, "delta", f"must be >= 0, got {self.delta}")
        check(self.weight_cap > 0, "weight_cap", f"must be > 0, got {self.weight_cap}")
        check(self.balance_ratio >= 0, "balance_ratio", f"must be >= 0, got {self.balance_ratio}")
        check(self.balance_floor >= 0, "balance_floor", f"must be >= 0, got {self.balance_floor}")
        check(self.pairing_window >= 1, "pairing_window", f"must be >= 1, got {self.pairing_window}")
        self.delta_by_length = {int(k): float(v) for k, v in dict(self.delta_by_length).items()}
        for k, v in self.delta_by_length.items():
            check(k >= 1, f"delta_by_length.{k}", "a bucket bound is a token count and must be >= 1")
            check(v >= 0, f"delta_by_length.{k}", f"delta must be >= 0, got {v}")


@dataclass
class PeerConfig:
    """The stored peer of ``exchange.kind: stored`` (spec §6): groups of a trajectory store written by an earlier
    run. (``peer.source: store`` of earlier versions is ``exchange.kind: stored``.)"""

    store_path: str | None = None
    """Trajectory store to replay (required with ``exchange.kind: stored``)."""
    store_model: str | None = None
    """Which model's rows in the store are the peer (default: the only other model in it)."""
    pick: Annotated[str, PICKS] = "latest"
    """Which stored group to use when several exist for a prompt: ``latest`` not after the receiver's step
    (default: the most recent peer policy that a co-trained peer could have had), ``same_step`` only the same
    step, ``any`` the one with most successes."""
    max_replacements: int | None = None
    """Cap on replaced prompts per step in stored-peer mode (``None`` = no cap)."""
    balance: bool = False
    """Apply balancing in stored-peer mode (there is no partner direction, so the default is off)."""

    def __post_init__(self) -> None:
        check_choices(self)
        check(
            self.max_replacements is None or self.max_replacements >= 0,
            "max_replacements",
            f"must be >= 0, got {self.max_replacements}",
        )
