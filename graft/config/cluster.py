"""``ray.*``: the Ray backend and each model's resources."""

from __future__ import annotations

from dataclasses import dataclass, field

from graft.config.checks import check


@dataclass
class ResourceConfig:
    num_workers: int = 1
    """Ray workers (FSDP ranks) for this model."""
    num_gpus: float = 0
    """GPUs per worker."""
    num_cpus: float = 1
    """CPUs per worker."""

    def __post_init__(self) -> None:
        check(self.num_workers >= 1, "num_workers", f"must be >= 1, got {self.num_workers}")
        check(self.num_gpus >= 0, "num_gpus", f"must be >= 0, got {self.num_gpus}")
        check(self.num_cpus >= 0, "num_cpus", f"must be >= 0, got {self.num_cpus}")


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
        check(self.actor_timeout_s > 0, "actor_timeout_s", f"must be > 0, got {self.actor_timeout_s}")
