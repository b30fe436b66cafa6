"""The worker side of a model: one rank holding the policy's weights, optimizer and rollout engine.

A :class:`PolicyWorker` exposes primitives only -- generate, log-probs, train on its share of one
minibatch, optimizer state, save -- and knows nothing of groups, exchange or plans: that is the
driver-side :class:`graft.trainer.learner.Learner`. The same class runs in-process
(:class:`LocalWorkers`, one rank) and inside Ray actors (:class:`graft.distributed.ray_backend.RayWorkers`,
W ranks of one ``torch.distributed`` group, FSDP2-sharded when W > 1).

:func:`scatter` is the one way work is split over ranks: contiguous blocks of whole units
(generation batches, scoring micro-batches, update micro-batches), so every rank computes exactly
what the single process computes for those rows.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import resource
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch

from graft.algos.losses import merge
from graft.console import say
from graft.cores import poll
from graft.files import write_text, writing
from graft.heap import keep_freed_memory
from graft.policy import fsdp
from graft.policy.context import max_positions
from graft.policy.engines import RolloutEngine, make_engine
from graft.policy.optim import set_lr
from graft.policy.policy import Policy, reference_policy
from graft.policy.sampling import SamplingParams
from graft.trainer.batch import Shard, micro_loss


def scatter(items: Sequence, parts: int, unit: int = 1, even: bool = False) -> list[list]:
    """``items`` in ``parts`` contiguous blocks of whole ``unit``s, as even as possible (the last
    non-empty block takes the remainder). ``even``: when there are fewer than ``parts`` units, split
    the items evenly instead (rollouts: per-prompt seeds make any split give the same samples)."""
    n, unit = len(items), max(1, unit)
    if even and n < parts * unit:
        unit = max(1, math.ceil(n / parts)) if n else 1
    units = math.ceil(n / unit) if n else 0
    base, extra = divmod(units, parts)
    out, start = [], 0
    for r in range(parts):
        size = min(n - start, (base + (1 if r < extra else 0)) * unit)
        out.append(list(items[start : start + size]))
        start += size
    return out


def process_memory() -> dict[str, float]:
    """Peak memory of the calling process in GB: resident (``peak_rss_gb``; ``ru_maxrss`` is KiB on
    Linux) and, once this process has used CUDA, the peak tensor memory torch allocated and the peak
    its caching allocator reserved on the current device (``gpu_allocated_gb``, ``gpu_reserved_gb``)."""
    out = {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["gpu_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
        out["gpu_reserved_gb"] = torch.cuda.max_memory_reserved() / 2**30
    return out


def _local_shard(p: torch.Tensor) -> torch.Tensor:
    """This rank's part of parameter ``p``: its local shard when sharded (a DTensor's ``to_local``), else ``p``."""
    to_local = getattr(p, "to_local", None)
    return to_local() if to_local is not None else p


class PolicyWorker:
    """One rank of a model: its :class:`~graft.policy.policy.Policy`, optimizer and rollout engine."""

    def __init__(
        self, name: str, rank: int = 0, world_size: int = 1, threads: int | None = None, keep_memory: bool = False
    ) -> None:
        """``keep_memory``: this process's allocator keeps freed memory (``cpu_memory: keep``, :mod:`graft.heap`)."""
        self.name, self.rank, self.world = name, rank, world_size
        if threads:
            torch.set_num_threads(int(threads))
        if keep_memory and not keep_freed_memory():
            say(f"{name}: cpu_memory=keep has no effect here (the C library has no glibc mallopt)")
        self.threads = torch.get_num_threads()
        self._policy: Policy | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._engine: RolloutEngine | None = None
        self.reference: Policy | None = None

    # Set by :meth:`setup`; reading them before it raises.
    @property
    def policy(self) -> Policy:
        if self._policy is None:
            raise RuntimeError(f"{self.name}: worker not set up")
        return self._policy

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        if self._optimizer is None:
            raise RuntimeError(f"{self.name}: worker not set up")
        return self._optimizer

    @property
    def engine(self) -> RolloutEngine:
        if self._engine is None:
            raise RuntimeError(f"{self.name}: worker not set up")
        return self._engine

    # ------------------------------------------------------------------ setup
    def address(self) -> tuple[str, int]:
        return fsdp.node_ip(), fsdp.free_port()

    def setup(
        self,
        cfg,
        device: str,
        weights_from: str | None,
        master: tuple[str, int] | None,
        seed: int | None,
        engine: str,
        timeout_s: float = 600.0,
    ) -> dict:
        """Load the model (from ``weights_from`` when resuming), shard it over the group when W > 1,
        build the optimizer and the rollout engine."""

        if seed is not None:
            torch.manual_seed(seed)
        if device == "cuda":
            torch.cuda.set_device(0)  # Ray restricts CUDA_VISIBLE_DEVICES to this worker's GPU(s)
        if self.world > 1:
            if master is None:
                raise ValueError(f"{self.name}: a group of {self.world} ranks needs the master address")
            fsdp.init_process_group(self.rank, self.world, master[0], master[1], device=device, timeout_s=timeout_s)
        policy = self._policy = Policy.load(cfg, device=device, weights_from=weights_from)
        if self.world > 1:
            fsdp.shard_model(policy.model)  # parameters keep cfg.dtype, as in one process
        self._optimizer = policy.make_optimizer()
        self.reference = reference_policy(cfg, device) if cfg.kl_coef > 0 else None  # not sharded: a full copy per rank
        self._engine = make_engine(engine, policy)  # built now: a vLLM engine's first weight push is collective
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "node": fsdp.node_ip(),
            "device": device,
            "engine": engine,
            "parameters": sum(p.numel() for p in policy.model.parameters()),
        }

    def ping(self) -> int:
        return self.rank

    def _gathered(self):
        return fsdp.gathered(self.policy.model) if self.engine.name != "vllm" else contextlib.nullcontext()

    # ------------------------------------------------------------------ primitives
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, progress: bool = False, desc: str = "") -> list[list]:
        """``params.n`` samples per prompt through the rollout engine (ended at stop strings), ``[P][G]``."""
        with self._gathered():
            return self.engine.generate(prompt_ids, params, progress, desc)

    def logprobs(self, prompt_ids, response_ids, chunk: int, micro_batch: int, temperature: float) -> list[torch.Tensor]:
        with self._gathered():
            return self.policy.token_logprobs(
                prompt_ids, response_ids, chunk=chunk, micro_batch=micro_batch, temperature=temperature
            )

    def train_minibatch(self, shard: Shard, uc, temperature: float) -> dict:
        """This rank's micro-batches of one minibatch (plus zero-weight dummies up to the common count),
        then one optimiser step on the gradient summed over ranks. Returns additive metric totals
        (``graft.algos.losses.merge``), the rank's loss, the global gradient norm and ``skipped_nonfinite``
        (1.0 when the step was skipped because a rank's loss or the gradient norm was NaN/inf; all ranks agree)."""
        model, mbs = self.policy.model, uc.micro_batch_size
        params = [p for p in model.parameters() if p.requires_grad]
        totals: dict[str, float] = {"loss": 0.0, "tokens/update": 0.0}
        micro = [shard.rows[j : j + mbs] for j in range(0, len(shard.rows), mbs)]
        self.optimizer.zero_grad(set_to_none=True)
        model.train()
        try:
            for j in range(shard.num_micro):
                poll()
                if j < len(micro):
                    loss, m = fsdp.root_call(
                        model,
                        micro_loss,
                        self.policy,
                        micro[j],
                        shard.loss,
                        uc,
                        temperature,
                        shard.counts,
                        shard.loss_kwargs,
                        self.reference,
                    )
                    loss.backward()
                    totals["loss"] += float(loss.detach())
                    totals["tokens/update"] += sum(len(s.response_ids) for s in micro[j])
                    merge(totals, m)
                else:
                    fsdp.dummy_backward(model, self._dummy_logprobs)
            totals["grad_norm"] = fsdp.clip_grad_norm_(params, self.policy.cfg.max_grad_norm) if shard.num_micro else 0.0
            finite = math.isfinite(totals["grad_norm"]) and math.isfinite(totals["loss"])
            totals["skipped_nonfinite"] = float(fsdp.any_rank(not finite, params[0].device if params else "cpu"))
            if not totals["skipped_nonfinite"]:  # a diverging update leaves weights and optimizer state as they were
                self.optimizer.step()
        finally:
            self.optimizer.zero_grad(set_to_none=True)  # no gradients held through rollout, exchange, the peer's update
            model.eval()
        return totals

    def _dummy_logprobs(self) -> torch.Tensor:
        """The log-probs of a one-token forward: a rank's zero-gradient dummy micro-batch (:func:`fsdp.dummy_backward`)."""
        tok = self.policy.pad_token_id
        return self.policy.forward_logprobs([[tok]], [[tok]])[0]

    def set_threads(self, n: int | None) -> None:
        """torch intra-op threads of this rank from now on: ``n``, or with None the ones it started with
        (``threads_claim_freed`` on ``backend: ray``: :class:`graft.cores.Pushed`)."""
        torch.set_num_threads(n or self.threads)

    def set_learning_rate(self, lr: float) -> None:
        """Optimiser steps from now on use learning rate ``lr``."""
        set_lr(self.optimizer, lr)

    def max_positions(self) -> int | None:
        """The model's ``max_position_embeddings`` (None when its config has none)."""
        return max_positions(self.policy.model.config)

    def nonfinite_parameters(self) -> list[str]:
        """Names of the parameters whose values on this rank (its shards, when sharded) hold NaN or inf."""
        return [n for n, p in self.policy.model.named_parameters() if not bool(torch.isfinite(_local_shard(p).detach()).all())]

    def set_engine(self, kind: str) -> None:
        """Sample with another rollout engine from now on (``hf``, ``hf-cb``, ``vllm``)."""

        if self._engine is None or self._engine.name != kind:
            if self._engine is not None:
                self._engine.close()
            self._engine = make_engine(kind, self.policy)

    def weights_changed(self) -> None:
        """Tell the rollout engine the weights changed (vLLM reloads them; no-op for engines sharing them)."""
        self.engine.weights_updated()

    # ------------------------------------------------------------------ state
    def optimizer_state(self) -> dict | None:
        if self.world > 1:
            return fsdp.gather_optimizer_state(self.optimizer, self.rank)
        return _to_cpu(self.optimizer.state_dict())

    def load_optimizer_state(self, state: dict) -> None:
        if self.world > 1:
            fsdp.load_optimizer_state(self.optimizer, state)
        else:  # the old moments go first: a model's AdamW state is 2x its weights, never held twice
            self.optimizer.state.clear()
            self.optimizer.load_state_dict(state)

    def restore_optimizer_state(self, state: dict) -> None:
        """Back to ``state``, an ``optimizer_state()`` this worker returned earlier: on one rank the moments are
        copied into the live tensors (:func:`copy_optimizer_state`), never held a third time."""
        if self.world > 1:
            fsdp.load_optimizer_state(self.optimizer, state)
        else:
            copy_optimizer_state(self.optimizer, state)

    def state_dict(self) -> dict | None:
        if self.world > 1:
            return fsdp.full_state_dict(self.policy.model, self.rank)
        return {k: v.detach().cpu().clone() for k, v in self.policy.model.state_dict().items()}

    def save(self, path: str, ship: bool = False) -> dict | None:
        """Rank 0 writes the Hugging Face folder to ``path`` (or, with ``ship``, returns its files as
        bytes for the driver to write: rank 0 is on another node)."""

        full = fsdp.full_state_dict(self.policy.model, self.rank) if self.world > 1 else None
        if self.rank != 0:
            return None
        target = Path(tempfile.mkdtemp(prefix="graft-save-")) if ship else Path(path)
        try:
            if full is None:
                self.policy.save(target)
            else:
                _save_full(self.policy, full, target)
            if not ship:
                return None
            return {str(f.relative_to(target)): f.read_bytes() for f in sorted(target.rglob("*")) if f.is_file()}
        finally:
            if ship:
                shutil.rmtree(target, ignore_errors=True)

    def memory(self) -> dict[str, float]:
        return process_memory()

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            if self._engine is not None:
                self._engine.close()
        fsdp.destroy_process_group()


def copy_optimizer_state(opt: torch.optim.Optimizer, saved: dict) -> None:
    """``opt`` back to ``saved`` (an earlier ``state_dict()``, deep-copied or on the host) by copying each moment
    tensor into the live one (``opt.state_dict()`` hands out the live tensors), so the state exists twice, not
    three times (Gemma-3's AdamW moments are 2 GB). Where the layout or the hyper-parameters differ -- ``saved``
    taken before the first update, with no moments yet -- the live state is dropped and a copy of ``saved``
    loaded (``load_state_dict`` would otherwise alias ``saved``'s tensors)."""
    live = opt.state_dict()
    if (
        live["param_groups"] != saved["param_groups"]
        or live["state"].keys() != saved["state"].keys()
        or any(
            live["state"][i].keys() != st.keys() or not all(torch.is_tensor(v) for v in st.values())
            for i, st in saved["state"].items()
        )
    ):
        opt.state.clear()
        opt.load_state_dict(copy.deepcopy(saved))
        return
    for i, st in saved["state"].items():
        for k, v in st.items():
            live["state"][i][k].copy_(v)


def _to_cpu(x: Any) -> Any:
    if torch.is_tensor(x):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_to_cpu(v) for v in x]
    return x


def _save_full(policy, state: dict, path) -> None:
    """What :meth:`Policy.save` writes, from a gathered full state dict (sharded models)."""

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with writing(path / policy.weights_file):
        policy.model.save_pretrained(str(path), state_dict=state)
    with writing(path / "tokenizer.json"):
        policy.tokenizer.save_pretrained(str(path))
    cfg_file = path / "config.json"
    if cfg_file.exists():  # FSDP2 renames the class (FSDPLlamaForCausalLM); keep the real architecture
        data = json.loads(cfg_file.read_text())
        data["architectures"] = [a[4:] if a.startswith("FSDP") else a for a in data.get("architectures") or []]
        write_text(cfg_file, json.dumps(data, indent=2, sort_keys=True) + "\n")


class LocalWorkers:
    """One in-process rank (``backend: local``)."""

    def __init__(self, worker: PolicyWorker) -> None:
        self.worker, self.size = worker, 1

    def call(self, method: str, args: list[tuple], what: str = "") -> list:
        assert len(args) == 1, f"{method}: one rank, {len(args)} argument tuples"
        return [getattr(self.worker, method)(*args[0])]

    def save(self, path) -> None:
        self.worker.save(str(path))

    @property
    def local_policy(self):
        """The in-process policy (in-training evaluation samples from it directly)."""
        return self.worker.policy

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.worker._engine is not None:
                self.worker._engine.close()
