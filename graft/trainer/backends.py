"""Building and releasing every model's :class:`~graft.trainer.learner.Learner` on its backend.

``backend: local`` puts each model's one rank in this process (:class:`~graft.trainer.workers.LocalWorkers`);
``backend: ray`` puts ``ray.resources[name].num_workers`` :class:`~graft.trainer.workers.PolicyWorker` ranks in
a Ray actor group (:class:`~graft.distributed.ray_backend.RayWorkers`, the transport). The learner on the driver
is the same class either way.
"""

from __future__ import annotations

import contextlib
from typing import Iterable

import torch
from tqdm.auto import tqdm

from graft.config import Config, ConfigError, ResourceConfig
from graft.console import say
from graft.distributed.ray_backend import RayWorkers, init_ray
from graft.policy.codec import TextCodec
from graft.registry import BACKENDS, CPU_MEMORY
from graft.seeds import init_seed
from graft.trainer.learner import Learner
from graft.trainer.workers import PolicyWorker


def resources_for(cfg: Config, name: str) -> ResourceConfig:
    return cfg.ray.resources.get(name) or ResourceConfig()


def keeps_memory(cfg: Config, device: str) -> bool:
    """Whether the worker processes of a model on ``device`` keep freed memory (``cpu_memory: keep``, on CPU only)."""
    return CPU_MEMORY[cfg.cpu_memory] and device == "cpu"


def make_learners(cfg: Config, device: str, ckpt=None, progress: bool = False) -> dict[str, Learner]:
    """``{name: Learner}``: each model's ranks in this process (``backend: local``) or in a Ray actor
    group (``backend: ray``); ``progress``: a bar over the models loaded in this process."""
    weights = {m.name: (str(ckpt.model_dirs[m.name]) if ckpt else None) for m in cfg.models}
    return BACKENDS[cfg.backend](cfg, device, weights, progress)


@BACKENDS.register("local")
def local_learners(cfg: Config, device: str, weights: dict[str, str | None], progress: bool) -> dict[str, Learner]:
    """``local``: every model's one rank in this process."""
    out = {}
    for m in tqdm(cfg.models, desc="loading models", disable=not progress):
        torch.manual_seed(init_seed(cfg.seed, m.name))  # e.g. a fresh LoRA adapter: same init on every backend
        out[m.name] = Learner.local(m, device, weights[m.name], cfg.rollout.engine, keep_memory=keeps_memory(cfg, device))
    return out


@BACKENDS.register("ray")
def ray_learners(cfg: Config, device: str, weights: dict[str, str | None], progress: bool) -> dict[str, Learner]:
    """``ray``: each model's ranks as a Ray actor group (``ray.resources``)."""
    unknown = set(cfg.ray.resources) - {m.name for m in cfg.models}
    if unknown:
        raise ConfigError(f"ray.resources names unknown model(s) {sorted(unknown)}; models: {[m.name for m in cfg.models]}")
    res = {m.name: resources_for(cfg, m.name) for m in cfg.models}
    init_ray(
        cfg.ray, sum(r.num_cpus * r.num_workers for r in res.values()), sum(r.num_gpus * r.num_workers for r in res.values())
    )
    learners: dict = {}
    try:
        for m in cfg.models:
            r = res[m.name]
            wdev = "cuda" if r.num_gpus > 0 else "cpu"
            if cfg.device == "cuda" and wdev == "cpu":
                raise ConfigError(f"device=cuda but ray.resources.{m.name}.num_gpus is 0")
            workers = RayWorkers(PolicyWorker, m, r, cfg.ray, threads=cfg.threads, keep_memory=keeps_memory(cfg, wdev))
            learners[m.name] = Learner(m, workers, TextCodec.load(m, weights[m.name]))
            info = workers.setup(m, wdev, weights[m.name], init_seed(cfg.seed, m.name), cfg.rollout.engine)
            say(
                f"ray: model {m.name} on {r.num_workers} worker(s) "
                f"({', '.join(sorted({i['node'] for i in info}))}; {wdev}; engine {cfg.rollout.engine})"
            )
    except BaseException:
        close_learners(learners)
        raise
    return learners


def close_learners(learners: dict | Iterable) -> None:
    """Release every learner's resources (kills Ray actors; frees rollout engines)."""
    items = learners.values() if isinstance(learners, dict) else learners
    for lr in items:
        close = getattr(lr, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()


def worker_memory(learners: dict) -> dict[str, float]:
    """``{"mem/KEY/NAME": GB}`` for every Ray-backed model and every peak of
    :func:`~graft.trainer.workers.process_memory` (``peak_rss_gb``; on CUDA ``gpu_allocated_gb``,
    ``gpu_reserved_gb``), the max over its workers; the driver's own ``mem/KEY`` does not see them.
    Empty for the local backend (one process)."""
    return {f"mem/{k}/{n}": v for n, lr in learners.items() if isinstance(lr.workers, RayWorkers) for k, v in lr.memory().items()}
