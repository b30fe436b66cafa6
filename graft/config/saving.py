"""``checkpoint.*``, ``eval.*`` and ``logging.*``: what a run saves, evaluates and reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from graft.config.checks import check, check_choices
from graft.registry import OPTIMIZER_KEEPS, TRACKERS, WANDB_MODES


@dataclass
class CheckpointConfig:
    save_every: int = 0
    """Save a checkpoint every this many steps (0: only at the end)."""
    keep_last: int = 2
    """How many checkpoints to keep."""
    save_final: bool = True
    """Save a checkpoint when the run ends."""
    keep_optimizer: Annotated[str, OPTIMIZER_KEEPS] = "all"
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
        check_choices(self)
        check(self.save_every >= 0, "save_every", f"must be >= 0 (0: only at the end), got {self.save_every}")
        check(self.keep_period >= 0, "keep_period", f"must be >= 0 (0: keep no period), got {self.keep_period}")


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
        check(self.every >= 0, "every", f"must be >= 0 (0 disables), got {self.every}")
        check(self.n >= 1, "n", f"must be >= 1, got {self.n}")
        check(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        check(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        check(self.max_new_tokens is None or self.max_new_tokens > 0, "max_new_tokens", f"must be > 0, got {self.max_new_tokens}")
        check(self.repeats >= 1, "repeats", f"must be >= 1, got {self.repeats}")


@dataclass
class LoggingConfig:
    report_to: list[Annotated[str, TRACKERS]] = field(default_factory=list)
    """Experiment trackers that receive every ``metrics.jsonl`` value at the same step index (eval results
    included), plus the resolved config: ``tensorboard`` writes ``RUN_DIR/tensorboard/`` (config as text and
    hparams), ``wandb`` a W&B run under ``RUN_DIR/wandb/`` (config as the run config), ``mlflow`` an MLflow run
    in the local file store ``RUN_DIR/mlruns/`` (config as params and as ``config.yaml``). Each needs its
    package (``pip install 'graft[trackers]'``); graft/trainer/tracking.py has the details."""
    wandb_project: str = "graft"
    """W&B project of the run (the W&B run name is the run folder's name; ``WANDB_ENTITY`` picks the entity)."""
    wandb_mode: Annotated[str, WANDB_MODES] = "auto"
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
        check_choices(self)
        check(bool(str(self.mlflow_experiment).strip()), "mlflow_experiment", "must not be empty")
        check(self.log_completions >= 0, "log_completions", f"must be >= 0 (0 = off), got {self.log_completions}")
