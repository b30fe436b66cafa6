"""The root of the config tree, :class:`Config`: the run as a whole, its sections, and the invariants that span them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated

from graft.config.checks import check, check_choices
from graft.config.cluster import RayConfig
from graft.config.data import DataConfig
from graft.config.exchange import ExchangeConfig, PeerConfig
from graft.config.models import ModelConfig
from graft.config.reward import RewardConfig
from graft.config.rollout import RolloutConfig
from graft.config.saving import CheckpointConfig, EvalConfig, LoggingConfig
from graft.config.update import UpdateConfig
from graft.registry import BACKENDS, CPU_MEMORY, ENGINES, EXCHANGES, TASKS


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
    that flips, another run). The default stays sequential: on two idle cores (``benchmarks/results/threads/``) side by side
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
    cpu_memory: Annotated[str, CPU_MEMORY] = "keep"
    """Where the models run on CPU: ``keep`` makes the C allocator (glibc's ``malloc``) keep the memory freed tensors
    give back and reuse it for the next allocation, instead of returning every large block to the kernel and
    faulting it in again page by page (:mod:`graft.heap`); the same numbers, computed without the page faults: the
    default job's Gemma-3 update 1.6x faster (SmolLM2's, with smaller buffers, unchanged), peak RSS +0.4 GB
    (``benchmarks/results/cpu-memory/``). The process's resident memory then stays at its peak. ``release``: the
    allocator's own behaviour. No effect on a CUDA device or without glibc (musl, macOS: a notice says so)."""
    resume: str | bool = False
    """``true`` resumes from the newest checkpoint in ``run_dir`` that verifies (sha256 of every file; a damaged
    newer one is reported and skipped; none at all in a folder that holds metrics is an error); a path resumes
    from that checkpoint; ``restart`` deliberately deletes what ``run_dir`` holds of an earlier run (metrics,
    audit log, trajectories, eval, checkpoints, TensorBoard events) and starts from scratch."""
    backend: Annotated[str, BACKENDS] = "local"
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
        check_choices(self)
        names = [m.name for m in self.models]
        for m in self.models:
            m.bind_domain(self.reward.domain)
        check(len(set(names)) == len(names), "models", f"model names must be unique, got {names}")
        EXCHANGES[self.exchange.kind].check(self)  # the kind's own settings: models, peer.*, update.rule
        check(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        check(self.steps >= 0, "steps", f"must be >= 0, got {self.steps}")
        check(self.batch_prompts >= 1, "batch_prompts", f"must be >= 1, got {self.batch_prompts}")
        check(
            self.batch_prompts >= self.update.num_minibatches,
            "batch_prompts",
            f"{self.batch_prompts} must be >= update.num_minibatches ({self.update.num_minibatches}): groups are never split",
        )
        if isinstance(self.data.train, str) and self.data.train in TASKS:
            TASKS[self.data.train].check(self)  # the procedural task's own invariants across sections
        self._check_threads()
        check(
            bool(re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device)),
            "device",
            f"{self.device!r} is not one of auto, cpu, cuda, cuda:N",
        )
        check(bool(str(self.run_dir).strip()), "run_dir", "is required")
        check(
            not self.eval.every or self.data.val is not None,
            "eval.every",
            f"is {self.eval.every} but data.val is not set: there is nothing to evaluate on (set data.val, or eval.every=0)",
        )
        ENGINES[self.rollout.engine].check(self)  # the engine's own needs: behaviour log-probs, ranks per model
        self._check_autocast()
        if self.backend == "ray":
            for name in self.ray.resources:
                check(name in names, f"ray.resources.{name}", f"names no model; models: {names}")

    def _check_autocast(self) -> None:
        """An update of lower precision than the sampler needs ``update.recompute_old_logprobs``."""
        for i, m in enumerate(self.models):
            check(
                m.autocast == "off" or self.update.recompute_old_logprobs,
                f"models.{i}.autocast",
                f"is {m.autocast} but update.recompute_old_logprobs is false: the update's bf16 forward differs from the "
                "sampler's log-probs by ~1e-2 nats per token, so the behaviour log-probs must come from a forward of the "
                "same precision (set update.recompute_old_logprobs=true)",
            )

    def _check_threads(self) -> None:
        """``threads``, ``threads_per_model``, ``threads_claim_freed``."""
        check(self.threads is None or self.threads >= 1, "threads", f"must be >= 1, got {self.threads}")
        for phase, k in self.threads_per_model.items():
            check(phase in ("rollout", "update"), "threads_per_model", f"{phase!r} is not a phase: rollout, update")
            check(k >= 1, f"threads_per_model.{phase}", f"must be >= 1, got {k}")
        check(
            not self.threads_claim_freed or bool(self.threads_per_model),
            "threads_claim_freed",
            "is true but threads_per_model is empty: only models running side by side can claim each other's threads "
            "(set threads_per_model, e.g. {rollout: 1, update: 1}, or threads_claim_freed=false)",
        )
