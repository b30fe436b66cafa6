"""graft's variants by name: one :class:`Registry` per kind, each variant registered where it is implemented.

A variant registers itself in the module that implements it, and that call is the one place its name is written::

    @EXCHANGES.register("live")
    class LiveExchange(Exchange): ...

The registry gives the object its name (``LiveExchange.name == "live"``). The config takes a choice from a registry
(``exchange.kind: Annotated[str, EXCHANGES]``), so a registered variant is selectable by name without editing the
config, and a name no registry holds is refused when the config loads, with the valid names.

This module sits below everything it names. A registry knows the names of its variants before importing them: it
reads the source of its ``home`` (the packages where its variants live, in that order) for ``REGISTRY.register("name")``
calls, and imports a name's module the first time that name is looked up. So the config checks a choice, and
``graft COMMAND --help`` lists the choices, without importing torch. A variant registered at run time (a plugin, a
test: ``EXCHANGES.register("toy")(Toy)``) joins the same table.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

_T = TypeVar("_T")
_PACKAGE = Path(__file__).resolve().parent
"""graft's own folder: a registry's home is a package or module in it."""


class UnknownName(KeyError, ValueError):
    """A name no registry entry has; the message lists the valid ones."""

    def __str__(self) -> str:
        return str(self.args[0])


_DECORATE: Any = object()
"""``register(name)`` without a target returns a decorator (a target may itself be None: ``autocast: off``)."""


class _Pending:
    """A name found in the source of ``module``, not imported yet."""

    def __init__(self, module: str) -> None:
        self.module = module


class Registry(Mapping[str, Any]):
    """``name -> implementation`` of one kind of variant (see the module doc).

    ``kind`` names the kind in messages (``unknown exchange kind 'x'; valid: ...``); ``symbol`` is the name the
    registry has in this module (its implementations call ``SYMBOL.register``); ``home`` the modules or packages of
    graft whose source holds its registrations, read in this order."""

    def __init__(self, kind: str, symbol: str, home: tuple[str, ...]) -> None:
        self.kind, self.symbol, self.home = kind, symbol, home
        self._entries: dict[str, Any] | None = None

    def _table(self) -> dict[str, Any]:
        if self._entries is None:
            self._entries = {}
            for module in _home_modules(self.home):
                for name in _registered_names(module, self.symbol):
                    self._entries.setdefault(name, _Pending(module))
        return self._entries

    def __getitem__(self, name: str) -> Any:
        table = self._table()
        if name not in table:
            raise UnknownName(f"unknown {self.kind} {name!r}; valid: {self.choices()}")
        if isinstance(table[name], _Pending):
            module = table[name].module
            importlib.import_module(module)
            if isinstance(table[name], _Pending):
                raise RuntimeError(f"{module} names {self.symbol}.register({name!r}) but did not register it on import")
        return table[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._table()))

    def __len__(self) -> int:
        return len(self._table())

    def __contains__(self, name: object) -> bool:
        return name in self._table()

    def __eq__(self, other: object) -> bool:
        return self is other  # one registry per kind (and comparing entries would import them all)

    def __hash__(self) -> int:
        return id(self)

    def register(self, name: str, target: Any = _DECORATE) -> Any:
        """Register ``target`` as ``name`` and give it that name (its ``name`` attribute); without ``target``, a
        decorator that does so. A name taken by another object is refused (one name, one implementation)."""

        def add(obj: _T) -> _T:
            held = self._table().get(name)
            if held is not None and not isinstance(held, _Pending) and held is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered ({held!r}); unregister it first")
            self._table()[name] = obj
            _give_name(obj, name)
            return obj

        return add if target is _DECORATE else add(target)

    def unregister(self, name: str) -> None:
        self._table().pop(name, None)

    def choices(self) -> str:
        return ", ".join(self._table())

    def scanned(self) -> list[str]:
        """The names the home's source registers (what the registry knows before importing anything)."""
        return [name for module in _home_modules(self.home) for name in _registered_names(module, self.symbol)]


def _give_name(obj: Any, name: str) -> None:
    """``obj.name = name`` where an object can carry it: a class, a function, an instance (a frozen dataclass too);
    a plain value (a text, a number, a ``torch.dtype``) is registered as it is."""
    if obj is None or isinstance(obj, (str, bytes, int, float, tuple)):
        return
    for assign in (setattr, object.__setattr__):
        try:
            assign(obj, "name", name)
            return
        except (AttributeError, TypeError):
            continue


@cache
def _home_modules(home: tuple[str, ...]) -> tuple[str, ...]:
    """The modules of ``home`` (each package's modules, recursively, by path), in order, each once."""
    out: list[str] = []
    for entry in home:
        path = _PACKAGE.joinpath(*entry.split(".")[1:])
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
        for f in files:
            parts = f.relative_to(_PACKAGE.parent).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if module not in out:
                out.append(module)
    return tuple(out)


@cache
def _registrations(module: str) -> tuple[tuple[str, str], ...]:
    """``(registry symbol, name)`` of every ``SYMBOL.register("name")`` call in ``module``'s source, in order."""
    path = _PACKAGE.joinpath(*module.split(".")[1:])
    file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    out = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "register"
            and isinstance(node.func.value, ast.Name)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.lineno, node.col_offset, node.func.value.id, node.args[0].value))
    return tuple((symbol, name) for *_, symbol, name in sorted(out))


def _registered_names(module: str, symbol: str) -> list[str]:
    return [name for s, name in _registrations(module) if s == symbol]


RULES = Registry("update rule", "RULES", ("graft.trainer",))
"""``update.rule`` -> :class:`graft.trainer.rules.UpdateRule` subclass."""

ENGINES = Registry("rollout engine", "ENGINES", ("graft.policy",))
"""``rollout.engine`` (and ``graft eval --backend``) -> :class:`graft.policy.engines.RolloutEngine` subclass."""

EXCHANGES = Registry("exchange kind", "EXCHANGES", ("graft.exchange",))
"""``exchange.kind`` -> :class:`graft.exchange.kinds.Exchange` subclass; its ``check(cfg)`` runs when the config
loads."""

BALANCES = Registry("balance", "BALANCES", ("graft.algos",))
"""``exchange.balance`` -> ``(|C_AB|, |C_BA|, ratio, floor) -> (m_AB, m_BA)`` (:mod:`graft.algos.selection`)."""

SELECTIONS = Registry("selection", "SELECTIONS", ("graft.algos",))
"""``exchange.selection`` -> ``(candidates, receiver's all-fail prompts, m, generator) -> kept prompts``
(:mod:`graft.algos.selection`)."""

CONFLICTS = Registry("conflict rule", "CONFLICTS", ("graft.algos",))
"""``exchange.conflict`` -> ``(k_S, mean s, source index) -> sort key`` of a contending source, largest wins
(:func:`graft.algos.selection.resolve_conflicts`)."""

ADMISSIONS = Registry("admission", "ADMISSIONS", ("graft.algos",))
"""``exchange.admission`` -> ``(passes Bool[N], generator) -> admitted Bool[N]`` (:func:`graft.algos.gating.gate`)."""

WEIGHTINGS = Registry("weighting", "WEIGHTINGS", ("graft.algos",))
"""``exchange.weighting`` -> ``(s [N], admitted Bool[N], cap) -> weights [N]`` (:func:`graft.algos.gating.gate`)."""

PAIRINGS = Registry("pairing", "PAIRINGS", ("graft.exchange",))
"""``exchange.pairing`` -> ``(solved Int[W,S], s [S] of Float[N_S]) -> (chosen Bool[S], scores [S])``: which
peers a receiver draws from at a step, from the evidence of the last ``exchange.pairing_window`` steps
(:mod:`graft.exchange.pairing`)."""

LOSS_AGGS = Registry("loss aggregation", "LOSS_AGGS", ("graft.algos",))
"""``update.loss_agg`` -> ``(masked loss [B,T], mask [B,T], num_tokens, num_seqs) -> scalar``
(:func:`graft.algos.losses.aggregate`)."""

RATIO_LEVELS = Registry("ratio level", "RATIO_LEVELS", ("graft.algos",))
"""``update.ratio_level`` -> ``(log ratio [B,T], mask [B,T]) -> log ratio [B,T]`` (:mod:`graft.algos.losses`)."""

KL_ESTIMATORS = Registry("KL estimator", "KL_ESTIMATORS", ("graft.algos",))
"""``models.I.kl_loss_type`` -> ``d = logp - logp_ref [B,T] -> per-token KL estimate [B,T]`` (verl's names;
:mod:`graft.algos.losses`)."""

ORDERS = Registry("minibatch order", "ORDERS", ("graft.algos",))
"""``update.order`` -> ``(is_peer per minibatch, generator) -> minibatch order`` (:mod:`graft.algos.minibatch`)."""

LR_SCHEDULES = Registry("learning-rate schedule", "LR_SCHEDULES", ("graft.policy",))
"""``models.I.lr_schedule`` -> ``progress p in [0, 1] -> factor of the learning rate`` (:mod:`graft.policy.optim`)."""

TEMPLATES = Registry("prompt template", "TEMPLATES", ("graft.policy",))
"""``models.I.template`` -> :class:`graft.policy.prompts.Template`: prompt text, response framing, default worked
examples and stop strings."""

DTYPES = Registry("dtype", "DTYPES", ("graft.policy",))
"""``models.I.dtype`` -> the ``torch.dtype`` the weights are loaded in (:mod:`graft.policy.loading`)."""

AUTOCASTS = Registry("autocast", "AUTOCASTS", ("graft.policy",))
"""``models.I.autocast`` -> the ``torch.dtype`` the log-prob forwards compute in, or None: the weights' own
(:mod:`graft.policy.lm`)."""

ADV_STDS = Registry("advantage std", "ADV_STDS", ("graft.algos",))
"""``update.adv_std`` -> ``unbiased``: whether the group std has Bessel's correction (:mod:`graft.algos.advantages`)."""

BAD_ROWS = Registry("bad-row policy", "BAD_ROWS", ("graft.data",))
"""``data.on_bad_row`` -> what loading does with a row it cannot use (:mod:`graft.data.datasets`)."""

BACKENDS = Registry("backend", "BACKENDS", ("graft.trainer",))
"""``backend`` -> ``(name, model config, cfg, device, ...) -> worker group`` of one model (:mod:`graft.trainer.backends`)."""

CPU_MEMORY = Registry("cpu_memory policy", "CPU_MEMORY", ("graft.heap",))
"""``cpu_memory`` -> whether the C allocator keeps freed memory for reuse (:mod:`graft.heap`)."""

WANDB_MODES = Registry("W&B mode", "WANDB_MODES", ("graft.trainer",))
"""``logging.wandb_mode`` -> ``env -> the mode W&B runs in`` (:mod:`graft.trainer.tracking`)."""

TRACKERS = Registry("tracker", "TRACKERS", ("graft.trainer",))
"""``logging.report_to`` items -> tracker class of :mod:`graft.trainer.tracking` (its ``module`` and ``package``
say what it needs installed)."""

ON_ERRORS = Registry("reward on_error policy", "ON_ERRORS", ("graft.reward",))
"""``reward.on_error`` -> ``(message, status, n) -> (n rewards, n statuses)`` for a batch a reward function failed on,
or raises (:mod:`graft.reward.functions`)."""

PICKS = Registry("stored-group pick", "PICKS", ("graft.storage",))
"""``exchange.peer.pick`` -> ``(stored groups of one prompt, step, eligible) -> the group or None``
(:mod:`graft.storage.trajectory_store`)."""

OPTIMIZER_KEEPS = Registry("optimizer-state policy", "OPTIMIZER_KEEPS", ("graft.storage",))
"""``checkpoint.keep_optimizer`` -> :class:`graft.storage.checkpoint.OptimizerKeep`: whether a checkpoint gets the
optimizer state and whether older ones lose it."""

TASKS = Registry("procedural task", "TASKS", ("graft.data",))
"""``data.train`` (and ``data.val``) names of procedural tasks -> :class:`graft.data.tasks.Task`: its settings section
``data.NAME``, its prompts and families."""

DOMAINS = Registry("domain", "DOMAINS", ("graft.domains.math", "graft.domains"))
"""``reward.domain`` -> :class:`graft.domains.Domain`: rows, prompt instruction and worked examples, grading and
reward monitor of one kind of task (graft/domains/)."""

CODE_FAMILIES = Registry("code family", "CODE_FAMILIES", ("graft.data.code_families",))
"""The code task's problem families (``data.code_task.families``) -> :class:`graft.data.code_families.CodeFamily`
(``CODE_FAMILIES["add"](rng)`` draws one function to write; :mod:`graft.data.code_families`)."""

FAMILIES = Registry("problem family", "FAMILIES", ("graft.data.arithmetic",))
"""Procedural problem families (``data.arithmetic.families``): ``name -> (rng, max_operand) -> (problem, integer
answer)``, defined in :mod:`graft.data.arithmetic`. Operands scale with ``max_operand`` (``square``: up to 2 x,
``double``: 5 x, ``max``: 10 x) except where a family fixes its range (``big_add``: 3-digit, ``next``)."""

STYLES = Registry("arithmetic style", "STYLES", ("graft.data.arithmetic",))
"""Phrasings of the single-step arithmetic task (``data.arithmetic.style``): ``name -> format string``. ``{a}``/``{b}``
are the operands; ``{op}`` is ``+ - *``, ``{op_word}`` is plus/minus/times, ``{op_latex}`` is ``+ - \\times``,
``{op_unicode}`` is ``+ - ×``; a style may also be a format string using the same fields."""


def registries() -> dict[str, Registry]:
    """Every registry of this module, by its symbol."""
    return {name: r for name, r in globals().items() if isinstance(r, Registry)}
