"""The names of graft's variants, and where each one is implemented: one registry per kind.

The config validates every name against these (``update.rule``, ``rollout.engine``, ``exchange.kind``,
``exchange.balance``, ``exchange.pairing``, ``update.loss_agg``, ``logging.report_to``, ``data.arithmetic.families``
...: its ``Literal`` choices are built from them), and the code that runs a variant looks it up here,
so a name is written once. Entries are ``"module:attribute"`` strings, imported on first use:
this module sits below everything it names, so the config can import it without importing
the layers above.

Adding a variant = its implementation in one module plus one line here (or, from a plugin or a
test, ``RULES.register("my-rule", MyRule)``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any


class UnknownName(KeyError, ValueError):
    """A name no registry entry has; the message lists the valid ones."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Mapping[str, Any]):
    """``name -> implementation`` of one kind of variant; ``registry[name]`` imports it on first use."""

    def __init__(self, kind: str, entries: dict[str, Any]) -> None:
        self.kind = kind
        self._entries: dict[str, Any] = dict(entries)

    def __getitem__(self, name: str) -> Any:
        if name not in self._entries:
            raise UnknownName(f"unknown {self.kind} {name!r}; valid: {', '.join(self._entries)}")
        target = self._entries[name]
        if isinstance(target, str):
            module, _, attr = target.partition(":")
            target = self._entries[name] = getattr(importlib.import_module(module), attr)
        return target

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def register(self, name: str, target: Any) -> None:
        """Add ``name`` (an object, or a ``"module:attribute"`` string imported on first use)."""
        self._entries[name] = target

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def choices(self) -> str:
        return ", ".join(self._entries)


RULES = Registry(
    "update rule",
    {
        "graft": "graft.trainer.rules:UpdateRule",
        "hacpo": "graft.trainer.rules:HacpoRule",
        "luffy": "graft.trainer.rules:LuffyRule",
        "sgt": "graft.trainer.rules:SgtRule",
    },
)
"""``update.rule`` -> :class:`graft.trainer.rules.UpdateRule` subclass."""

ENGINES = Registry(
    "rollout engine",
    {
        "hf": "graft.policy.engines:HFEngine",
        "hf-bf16": "graft.policy.engines:HFBf16Engine",
        "hf-cb": "graft.policy.engines:ContinuousBatchingEngine",
        "vllm": "graft.policy.engines:VllmEngine",
    },
)
"""``rollout.engine`` (and ``graft eval --backend``) -> :class:`graft.policy.engines.RolloutEngine` subclass."""

EXCHANGES = Registry(
    "exchange kind",
    {
        "none": "graft.exchange.kinds:NoExchange",
        "live": "graft.exchange.kinds:LiveExchange",
        "stored": "graft.exchange.kinds:StoredExchange",
        "hacpo": "graft.exchange.kinds:HacpoExchange",
    },
)
"""``exchange.kind`` -> :class:`graft.exchange.kinds.Exchange` subclass (checked when the config loads, so a kind
registered from a plugin or a test is selectable by name)."""

BALANCES = Registry(
    "balance",
    {
        "min": "graft.algos.selection:balance_min",
        "none": "graft.algos.selection:balance_none",
        "asymmetric": "graft.algos.selection:balance_asymmetric",
    },
)
"""``exchange.balance`` -> ``(|C_AB|, |C_BA|, ratio, floor) -> (m_AB, m_BA)`` (:mod:`graft.algos.selection`)."""

CONFLICTS = Registry(
    "conflict rule",
    {
        "most_successes": "graft.algos.selection:conflict_most_successes",
        "most_compatible": "graft.algos.selection:conflict_most_compatible",
        "model_order": "graft.algos.selection:conflict_model_order",
    },
)
"""``exchange.conflict`` -> ``(k_S, mean s, source index) -> sort key`` of a contending source, largest wins
(:func:`graft.algos.selection.resolve_conflicts`)."""

ADMISSIONS = Registry(
    "admission",
    {
        "gate": "graft.algos.gating:admit_gate",
        "random": "graft.algos.gating:admit_random",
        "all": "graft.algos.gating:admit_all",
    },
)
"""``exchange.admission`` -> ``(passes Bool[N], generator) -> admitted Bool[N]`` (:func:`graft.algos.gating.gate`)."""

WEIGHTINGS = Registry(
    "weighting",
    {
        "compat": "graft.algos.gating:weight_compat",
        "none": "graft.algos.gating:weight_none",
    },
)
"""``exchange.weighting`` -> ``(s [N], admitted Bool[N], cap) -> weights [N]`` (:func:`graft.algos.gating.gate`)."""

PAIRINGS = Registry(
    "pairing",
    {
        "all": "graft.exchange.pairing:pair_all",
        "complementary": "graft.exchange.pairing:pair_complementary",
        "compatible": "graft.exchange.pairing:pair_compatible",
    },
)
"""``exchange.pairing`` -> ``(solved Int[W,S], s [S] of Float[N_S]) -> (chosen Bool[S], scores [S])``: which
peers a receiver draws from at a step, from the evidence of the last ``exchange.pairing_window`` steps
(:mod:`graft.exchange.pairing`)."""

LOSS_AGGS = Registry(
    "loss aggregation",
    {
        "token-mean": "graft.algos.losses:agg_token_mean",
        "seq-mean-token-mean": "graft.algos.losses:agg_seq_mean_token_mean",
    },
)
"""``update.loss_agg`` -> ``(masked loss [B,T], mask [B,T], num_tokens, num_seqs) -> scalar``
(:func:`graft.algos.losses.aggregate`)."""

TRACKERS = Registry(
    "tracker",
    {
        "tensorboard": "graft.trainer.tracking:TensorBoardTracker",
        "wandb": "graft.trainer.tracking:WandbTracker",
        "mlflow": "graft.trainer.tracking:MLflowTracker",
    },
)
"""``logging.report_to`` items -> tracker class of :mod:`graft.trainer.tracking` (its ``module`` and ``package``
say what it needs installed)."""

DOMAINS = Registry(
    "domain",
    {
        "math": "graft.domains.math:MATH",
        "number": "graft.domains.math:NUMBER",
        "code": "graft.domains.code:CODE",
    },
)
"""``reward.domain`` -> :class:`graft.domains.Domain`: rows, prompt instruction and worked examples, grading and
reward monitor of one kind of task (graft/domains/)."""

_FAMILY_NAMES = (
    "add",
    "sub",
    "mul",
    "words",
    "latex",
    "chain",
    "story_add",
    "story_sub",
    "story_mul",
    "spelled",
    "big_add",
    "div",
    "mod",
    "square",
    "next",
    "double",
    "max",
)
FAMILIES = Registry("problem family", {f: f"graft.data.arithmetic:_fam_{f}" for f in _FAMILY_NAMES})
"""Procedural problem families (``data.arithmetic.families``): ``name -> (rng, max_operand) -> (problem, integer
answer)``, defined in :mod:`graft.data.arithmetic`. Operands scale with ``max_operand`` (``square``: up to 2 x,
``double``: 5 x, ``max``: 10 x) except where a family fixes its range (``big_add``: 3-digit, ``next``)."""

STYLES: dict[str, str] = {
    "question": "What is {a} {op} {b}?",
    "times": "What is {a} {op_unicode} {b}?",
    "words": "What is {a} {op_word} {b}?",
    "compute": "Compute ${a} {op_latex} {b}$.",
    "calculate": "Calculate {a} {op} {b}.",
}
"""Phrasings of the single-step arithmetic task (``data.arithmetic.style``). ``{a}``/``{b}`` are the operands;
``{op}`` is ``+ - *``, ``{op_word}`` is plus/minus/times, ``{op_latex}`` is ``+ - \\times``, ``{op_unicode}`` is
``+ - ×``; a style may also be a format string using the same fields."""
