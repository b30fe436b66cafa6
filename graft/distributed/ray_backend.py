"""``backend: ray``: each model's ranks live in their own Ray actor group.

The driver (the process running ``graft train``) keeps the whole
``rollout -> score -> exchange -> update`` loop, the grader, the prompt sampler, the audit log,
the checkpoints, and every model's :class:`graft.trainer.learner.Learner` -- the same class as
in one process. A model's weights, optimizer and rollout engine live in
``resources[name].num_workers`` :class:`graft.trainer.workers.PolicyWorker` actors (ranks of one
``torch.distributed`` group: gloo on CPU, NCCL on GPU; FSDP2 when W > 1, see
:mod:`graft.policy.fsdp`). This module is only the transport: :class:`RayWorkers` calls a
primitive on every rank with its own arguments and waits. What crosses the boundary is what the
paper exchanges -- prompts, response text, token ids, generation log-probs, rewards, advantages and
row weights -- never parameters (except in checkpoints).

Failures. Every remote call waits at most ``ray.actor_timeout_s``. A dead actor, an exception
inside a worker, or a timeout kills the model's whole actor group (a surviving rank may be
blocked in a collective with the dead one) and raises :class:`WorkerFailure`; the trainer
stops and the run resumes from its last checkpoint (``resume=true``).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch

from graft.config import ConfigError, ModelConfig, RayConfig, ResourceConfig
from graft.errors import UserError
from graft.signals import blocked, ignore_stop_signals

REPO_ROOT = str(Path(__file__).resolve().parents[2])


def _ray():
    """The ``ray`` module (an optional dependency: ``pip install 'graft[ray]'``)."""
    import ray  # deferred: only backend=ray needs it, and it is heavy to import

    return ray


class WorkerFailure(UserError, RuntimeError):
    """A Ray worker died, raised, or did not answer in time; the run cannot continue.

    The message names the model, the worker rank, the operation and the cause, and says how
    to resume."""


class RayWorkers:
    """W actors of one model (``worker_cls``: :class:`~graft.trainer.workers.PolicyWorker`), in a placement group."""

    def __init__(
        self,
        worker_cls: type,
        cfg: ModelConfig,
        resources: ResourceConfig,
        ray_cfg: RayConfig,
        threads: int | None = None,
        keep_memory: bool = False,
    ) -> None:
        ray = _ray()
        self.name = cfg.name
        self.timeout = float(ray_cfg.actor_timeout_s)
        self.size = W = int(resources.num_workers)
        if W < 1:
            raise ConfigError(f"ray.resources.{cfg.name}.num_workers must be >= 1")
        self.failed: str | None = None
        self.actors: list = []
        self._pg = None
        bundle = {"CPU": float(resources.num_cpus) if resources.num_cpus > 0 else 0.001}
        if resources.num_gpus:
            bundle["GPU"] = float(resources.num_gpus)
        self._pg = ray.util.placement_group(
            [dict(bundle) for _ in range(W)], strategy="PACK", name=f"graft-{cfg.name}-{os.getpid()}"
        )
        ready, _ = ray.wait([self._pg.ready()], timeout=self.timeout)
        if not ready:
            self.close()
            raise WorkerFailure(
                f"model {cfg.name}: the Ray cluster cannot place {W} worker(s) x {bundle} within "
                f"ray.actor_timeout_s={self.timeout:.0f}s (cluster resources: {ray.cluster_resources()}); "
                f"lower ray.resources.{cfg.name}.num_workers / num_gpus or add nodes"
            )
        actor_cls = ray.remote(_actor_class(worker_cls))
        thr = threads or max(1, int(resources.num_cpus))
        # a worker's stderr is a log: no download / weight-loading bars of the hub and transformers
        env = {"OMP_NUM_THREADS": str(thr), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        for r in range(W):
            opts = dict(
                num_cpus=bundle["CPU"],
                num_gpus=float(resources.num_gpus or 0),
                max_restarts=0,
                max_task_retries=0,
                name=f"graft-{cfg.name}-rank{r}-{os.getpid()}-{id(self)}",
                runtime_env={"env_vars": env},
                scheduling_strategy=ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=r
                ),
            )
            self.actors.append(actor_cls.options(**opts).remote(cfg.name, r, W, thr, keep_memory))

    def setup(self, cfg: ModelConfig, device: str, weights_from: str | None, seed: int, engine: str) -> list[dict]:
        master = self._wait([self.actors[0].address.remote()], "start", ranks=[0])[0] if self.size > 1 else None
        self.info = self.call(
            "setup", [(cfg, device, weights_from, master, seed, engine, self.timeout)] * self.size, "setup (loading the model)"
        )
        return self.info

    # ------------------------------------------------------------------ remote calls
    def call(self, method: str, args: list[tuple], what: str = "") -> list:
        """``method(*args[r])`` on every rank r; waits for all (at most ``ray.actor_timeout_s``)."""
        if self.failed:
            raise WorkerFailure(self.failed)
        assert len(args) == self.size, f"{method}: {self.size} ranks, {len(args)} argument tuples"
        refs = [getattr(w, method).remote(*a) for w, a in zip(self.actors, args, strict=True)]
        return self._wait(refs, what or method)

    def _wait(self, refs: list, what: str, ranks: list[int] | None = None) -> list:
        ray = _ray()
        rex = ray.exceptions

        ranks = ranks or list(range(len(refs)))
        index = {r: i for i, r in enumerate(refs)}
        results: list = [None] * len(refs)
        pending = list(refs)
        deadline = time.monotonic() + self.timeout
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                late = sorted(ranks[index[r]] for r in pending)
                self._fail(f"{what}: worker(s) {late} did not answer within ray.actor_timeout_s={self.timeout:.0f}s")
            ready, pending = ray.wait(pending, num_returns=1, timeout=min(remaining, 2.0))
            for ref in ready:
                i = index[ref]
                try:
                    results[i] = ray.get(ref)
                except (rex.RayActorError, getattr(rex, "ActorUnavailableError", rex.RayActorError)) as e:
                    self._fail(f"{what}: worker {ranks[i]} died ({type(e).__name__}: {_first_line(e)})")
                except rex.RayTaskError as e:
                    self._fail(f"{what}: worker {ranks[i]} raised {_cause(e)}")
                except rex.RayError as e:
                    self._fail(f"{what}: worker {ranks[i]} failed ({type(e).__name__}: {_first_line(e)})")
        return results

    def _dead_ranks(self) -> list[int]:
        """Ranks whose actor is gone (asked with a short ping), to name the culprit in the message."""
        ray = _ray()
        rex = ray.exceptions
        dead = []
        refs = [w.ping.remote() for w in self.actors]
        for r, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=3.0)
            except rex.RayActorError:
                dead.append(r)
            except Exception:  # noqa: BLE001 - busy (e.g. blocked in a collective) is not dead
                pass
        return dead

    def _fail(self, detail: str) -> None:
        dead = self._dead_ranks()
        died = f" (dead worker(s): {dead})" if dead else ""
        self.failed = (
            f"model {self.name} ({self.size} Ray worker(s)): {detail}{died}. The run stopped; its last "
            f"checkpoint is resumable with resume=true"
        )
        self.close()
        raise WorkerFailure(self.failed)

    def save(self, path) -> None:
        """Rank 0 writes the folder; when it runs on another node its files come back as bytes."""
        ray = _ray()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        ship = self.info[0]["node"] != ray.util.get_node_ip_address()
        res = self.call("save", [(str(path), ship)] * self.size, "save")
        if ship and res[0]:
            for rel, data in res[0].items():
                (path / rel).parent.mkdir(parents=True, exist_ok=True)
                (path / rel).write_bytes(data)

    def close(self) -> None:
        """Kill this model's actors and release their resources (idempotent)."""
        ray = _ray()
        for w in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(w, no_restart=True)
        self.actors = []
        if self._pg is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self._pg)
            self._pg = None
        if not self.failed:
            self.failed = f"model {self.name}: the Ray workers were closed"

    def __repr__(self) -> str:
        return f"RayWorkers({self.name!r}, size={self.size})"


def _actor_class(worker_cls: type) -> type:
    """``worker_cls`` as a Ray actor under graft's stop protocol (:mod:`graft.signals`): it ignores the stop signals
    (Ray's own SIGTERM handler would exit at once, mid-step) and is stopped by the driver (``ray.kill``)."""

    class Actor(worker_cls):
        def __init__(self, *args, **kwargs) -> None:
            if threading.current_thread() is threading.main_thread():  # a plain actor is built on its main thread
                ignore_stop_signals()
            super().__init__(*args, **kwargs)

    Actor.__name__ = Actor.__qualname__ = worker_cls.__name__
    return Actor


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else type(e).__name__


def _cause(e) -> str:
    cause = getattr(e, "cause", None)
    if cause is not None:
        return f"{type(cause).__name__}: {_first_line(cause)}"
    return _first_line(e)


# ============================================================================ cluster and factory


def init_ray(ray_cfg: RayConfig, needed_cpus: float = 0.0, needed_gpus: float = 0.0) -> None:
    """Connect to ``ray.address`` (``auto`` or ``ray://host:port``) or start a local Ray.

    A local Ray gets at least the CPUs the configured workers request (Ray counts CPUs as
    scheduling slots; the OS shares the real cores)."""
    try:
        ray = _ray()
    except ImportError as e:
        raise ConfigError("backend=ray needs Ray: pip install 'ray[default]' (or 'graft[ray]')") from e
    if ray.is_initialized():
        return
    env = {
        "env_vars": {
            "PYTHONPATH": os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p),
            "TOKENIZERS_PARALLELISM": "false",
        }
    }
    for var in ("GRAFT_CACHE", "HF_HOME", "HF_HUB_OFFLINE"):
        if os.environ.get(var):
            env["env_vars"][var] = os.environ[var]
    kwargs: dict[str, Any] = {"address": ray_cfg.address, "runtime_env": env, "log_to_driver": True}
    if not ray_cfg.address:
        cpus = max(float(os.cpu_count() or 1), needed_cpus)
        kwargs = {"num_cpus": int(math.ceil(cpus)), "include_dashboard": False, "runtime_env": env}
        if needed_gpus and not torch.cuda.is_available():
            raise ConfigError(
                f"the configured Ray workers request {needed_gpus} GPU(s) but this machine has none "
                "(set ray.address to a cluster with GPUs, or num_gpus: 0)"
            )
    # A local Ray's processes start with the stop signals blocked (a group signal must not end them), and
    # ray.init's SIGTERM handler, which exits at once, gives way to the one this process had.
    main = threading.current_thread() is threading.main_thread()
    with blocked():
        previous = signal.getsignal(signal.SIGTERM)
        ray.init(**kwargs)
        if main and previous is not None:
            signal.signal(signal.SIGTERM, previous)
