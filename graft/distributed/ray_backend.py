"""``backend: ray``: each model's policy lives in its own Ray actor group.

The driver (the process running ``graft train``) keeps the whole
``rollout -> score -> exchange -> update`` loop, the grader, the prompt sampler, the audit
log and the checkpoints. A model's weights, optimizer and sampler live in
``resources[name].num_workers`` :class:`PolicyWorker` actors; the driver holds a
:class:`RayLearner` with the same methods as :class:`graft.trainer.learner.Learner`, so the
loop does not know which backend it runs. What crosses the driver/worker boundary is what
the paper exchanges: prompts, response text, token ids, generation log-probs, rewards,
advantages and weights of the update rows -- never parameters (except in checkpoints).

Within a group of W workers (ranks 0..W-1 of one ``torch.distributed`` group, gloo on CPU,
NCCL on GPU; see :mod:`graft.distributed.fsdp` for the FSDP2 details):

- ``rollout``: prompts are split in contiguous blocks (whole generation batches when there
  are enough prompts), each worker samples its block with per-prompt seeds derived from
  (step seed, global prompt index), and the groups are concatenated in prompt order;
- ``token_logprobs`` (scoring peer responses for the compatibility score s, and
  ``recompute_old_logprobs``): sequences are sorted by length exactly as
  :meth:`Policy.token_logprobs` does and split in whole micro-batches, so every score is
  computed in the same padded batch as in one process;
- ``update``: each minibatch's forwarded rows are split across ranks in whole micro-batches
  (a minibatch with fewer micro-batches than ranks leaves ranks idle); every rank normalises its loss by the minibatch's GLOBAL token and
  sequence counts and FSDP2 sums the gradients, so the step equals the single-process step up
  to float summation order;
- ``save`` / ``optimizer.state_dict()``: full tensors gathered to rank 0, in the layout of an
  unsharded run (checkpoints are interchangeable between backends).

Failures. Every remote call waits at most ``ray.actor_timeout_s``. A dead actor, an exception
inside a worker, or a timeout kills the model's whole actor group (a surviving rank may be
blocked in a collective with the dead one) and raises :class:`WorkerFailure`; the trainer
stops and the run resumes from its last checkpoint (``resume=true``).
"""
from __future__ import annotations

import contextlib
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from graft.config import Config, ConfigError, ModelConfig, RayConfig, ResourceConfig, RolloutConfig, UpdateConfig
from graft.types import Prompt, RolloutGroup

REPO_ROOT = str(Path(__file__).resolve().parents[2])


class WorkerFailure(RuntimeError):
    """A Ray worker died, raised, or did not answer in time; the run cannot continue.

    The message names the model, the worker rank, the operation and the cause, and says how
    to resume."""


# ============================================================================ sharding helpers

def split_sizes(total: int, parts: int, unit: int = 1) -> list[int]:
    """Sizes of ``parts`` contiguous blocks covering ``total`` items, in multiples of ``unit``
    (the last non-empty block takes the remainder), as even as possible."""
    unit = max(1, unit)
    units = math.ceil(total / unit) if total else 0
    base, extra = divmod(units, parts)
    sizes, left = [], total
    for r in range(parts):
        s = min(left, (base + (1 if r < extra else 0)) * unit)
        sizes.append(s)
        left -= s
    return sizes


def balanced_unit(total: int, parts: int, preferred: int) -> int:
    """``preferred`` (a generation batch or micro-batch) when every part gets at least one such
    unit -- then each worker runs exactly the batches the single process would -- else an even split."""
    if preferred >= 1 and total >= parts * preferred:
        return preferred
    return max(1, math.ceil(total / parts)) if total else 1


def blocks(items: Sequence, sizes: list[int]) -> list[list]:
    out, i = [], 0
    for s in sizes:
        out.append(list(items[i:i + s]))
        i += s
    return out


@dataclass
class MinibatchShard:
    """One rank's rows of one minibatch, with the minibatch's global normalisers."""

    rows: list            # list[graft.trainer.learner.Sequence], forwarded rows only
    counts: tuple         # (policy-gradient tokens, sequences, SGT tokens) of the WHOLE minibatch
    num_micro: int        # micro-batches every rank runs (the maximum over ranks; extra ones are dummies)


# ============================================================================ the worker (inside an actor)

class PolicyWorker:
    """One rank of a model's actor group: a :class:`Learner` (FSDP2-sharded when W > 1)."""

    def __init__(self, name: str, rank: int, world_size: int, threads: int | None = None) -> None:
        self.name, self.rank, self.world = name, rank, world_size
        if threads:
            torch.set_num_threads(int(threads))
        self.learner = None

    # ------------------------------------------------------------------ setup
    def address(self) -> tuple[str, int]:
        from graft.distributed import fsdp
        return fsdp.node_ip(), fsdp.free_port()

    def setup(self, cfg: ModelConfig, device: str, weights_from: str | None, master: tuple[str, int] | None,
              seed: int, engine: str, timeout_s: float) -> dict:
        from graft.distributed import fsdp
        from graft.trainer.learner import Learner

        torch.manual_seed(seed)
        if device == "cuda":
            torch.cuda.set_device(0)   # Ray restricts CUDA_VISIBLE_DEVICES to this worker's GPU(s)
        if self.world > 1:
            fsdp.init_process_group(self.rank, self.world, master[0], master[1], device=device, timeout_s=timeout_s)
        self.learner = Learner(cfg, device=device, weights_from=weights_from)
        self.policy = self.learner.policy
        if self.world > 1:
            fsdp.shard_model(self.policy.model)   # parameters keep cfg.dtype, as in the local backend
            self.learner.optimizer = self.policy.make_optimizer()   # over the DTensor shards
        self.engine_kind = engine
        self.learner.engine(engine)   # build it now: a vLLM engine's first weight push is collective
        return {"rank": self.rank, "pid": os.getpid(), "node": fsdp.node_ip(), "device": device,
                "engine": engine, "parameters": sum(p.numel() for p in self.policy.model.parameters())}

    def ping(self) -> int:
        return self.rank

    def peak_rss_gb(self) -> float:
        return peak_rss_gb()

    # ------------------------------------------------------------------ inference
    def _gathered(self):
        from graft.distributed import fsdp
        return fsdp.gathered(self.policy.model)

    def rollout(self, prompts: list[Prompt], rc: RolloutConfig, step: int, seed: int, offset: int, progress: bool):
        ctx = self._gathered() if rc.engine != "vllm" else contextlib.nullcontext()
        with ctx:
            return self.learner.rollout(prompts, rc, step, seed, progress=progress, prompt_offset=offset)

    def generate(self, prompt_ids: list[list[int]], seeds: list[int], kwargs: dict):
        from graft.policy.engines import make_engine
        with self._gathered():
            return make_engine("hf", self.policy).generate(prompt_ids, seeds=seeds, **kwargs)

    def token_logprobs(self, prompt_ids, response_ids, chunk, micro_batch, temperature) -> list[torch.Tensor]:
        with self._gathered():
            return self.policy.token_logprobs(prompt_ids, response_ids, chunk=chunk, micro_batch=micro_batch,
                                              temperature=temperature)

    # ------------------------------------------------------------------ update
    def update(self, shards: list[MinibatchShard], uc: UpdateConfig, temperature: float, loss_kwargs: dict,
               num_minibatches: int) -> dict:
        """Run this rank's part of one pass: per minibatch, its micro-batches (plus zero-weight
        dummies up to the common count), then one optimiser step on the summed gradient."""
        from graft.algos.losses import merge
        from graft.distributed import fsdp
        from graft.trainer.rules import make_rule

        lr = self.learner
        model = self.policy.model
        loss_fn = make_rule(uc).loss
        totals: dict[str, float] = {}
        tokens_done = 0
        params = [p for p in model.parameters() if p.requires_grad]
        model.train()
        try:
            for sh in shards:
                lr.optimizer.zero_grad(set_to_none=True)
                micro = [sh.rows[j:j + uc.micro_batch_size] for j in range(0, len(sh.rows), uc.micro_batch_size)]
                mb_loss = 0.0
                for j in range(sh.num_micro):
                    if j < len(micro):
                        loss, m = fsdp.root_call(model, lr._micro_loss, micro[j], loss_fn, uc, temperature, sh.counts,
                                                 loss_kwargs)
                        loss.backward()
                        mb_loss += float(loss)
                        merge(totals, m)
                        tokens_done += sum(len(s.response_ids) for s in micro[j])
                    else:
                        tok = self.policy.pad_token_id
                        fsdp.dummy_backward(model, lambda: self.policy.forward_logprobs([[tok]], [[tok]])[0])
                grad_norm = fsdp.clip_grad_norm_(params, self.learner.cfg.max_grad_norm) if sh.num_micro else 0.0
                lr.optimizer.step()
                totals["loss"] = totals.get("loss", 0.0) + mb_loss / num_minibatches
                totals["grad_norm"] = totals.get("grad_norm", 0.0) + grad_norm / num_minibatches
        finally:
            lr.optimizer.zero_grad(set_to_none=True)
            model.eval()
        lr.weights_changed()
        totals["tokens/update"] = float(tokens_done)
        return totals

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict | None:
        from graft.distributed import fsdp
        if self.world > 1:
            return fsdp.full_state_dict(self.policy.model, self.rank)
        return {k: v.detach().cpu().clone() for k, v in self.policy.model.state_dict().items()}

    def save(self, path: str, ship: bool) -> dict | None:
        """Rank 0 writes the Hugging Face folder to ``path`` (or, with ``ship``, returns its files
        as bytes for the driver to write: rank 0 is on another node)."""
        from graft.distributed import fsdp
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

    def optimizer_state(self) -> dict | None:
        from graft.distributed import fsdp
        if self.world > 1:
            return fsdp.gather_optimizer_state(self.learner.optimizer, self.rank)
        sd = self.learner.optimizer.state_dict()
        return _to_cpu(sd)

    def load_optimizer_state(self, state: dict) -> None:
        from graft.distributed import fsdp
        if self.world > 1:
            fsdp.load_optimizer_state(self.learner.optimizer, state)
        else:
            self.learner.optimizer.load_state_dict(state)

    def shutdown(self) -> None:
        from graft.distributed import fsdp
        with contextlib.suppress(Exception):
            self.learner.close()
        fsdp.destroy_process_group()


def _to_cpu(x: Any) -> Any:
    if torch.is_tensor(x):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_to_cpu(v) for v in x]
    return x


def _save_full(policy, state: dict, path: str | Path) -> None:
    """What :meth:`Policy.save` writes, from a gathered full state dict (sharded models)."""
    path = Path(path)
    import json

    path.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(str(path), state_dict=state)
    policy.tokenizer.save_pretrained(str(path))
    cfg_file = path / "config.json"
    if cfg_file.exists():   # FSDP2 renames the class (FSDPLlamaForCausalLM); keep the real architecture
        data = json.loads(cfg_file.read_text())
        arch = data.get("architectures") or []
        data["architectures"] = [a[4:] if a.startswith("FSDP") else a for a in arch]
        cfg_file.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# ============================================================================ driver side

class _RemoteOptimizer:
    """``state_dict``/``load_state_dict`` of the workers' optimizer (what checkpoints need)."""

    def __init__(self, learner: "RayLearner") -> None:
        self._learner = learner

    def state_dict(self) -> dict:
        return self._learner._call("optimizer_state", (), "optimizer.state_dict")[0]

    def load_state_dict(self, state: dict) -> None:
        self._learner._call("load_optimizer_state", (state,), "optimizer.load_state_dict")

    def zero_grad(self, set_to_none: bool = True) -> None:  # the workers zero their own gradients
        pass


class RemotePolicy:
    """Sampling side of a remote policy, for evaluation (``evaluate_during_training``)."""

    def __init__(self, learner: "RayLearner") -> None:
        self._learner = learner
        self.name, self.cfg = learner.name, learner.cfg
        self.tokenizer = learner.text.tokenizer

    def encode_prompt(self, problem: str) -> list[int]:
        return self._learner.encode_prompt(problem)

    def render_prompt(self, problem: str) -> str:
        return self._learner.render_prompt(problem)

    def generate(self, prompt_ids: list[list[int]], n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, batch_size: int = 64, seed: int = 0, progress: bool = False, desc: str = "",
                 seeds: Sequence[int] | None = None, stop_strings: Sequence[str] | None = None, **_):
        """``Policy.generate`` over the workers: prompts split in blocks, one seed per prompt
        (``seeds``, else derived from (``seed``, prompt index)), results in prompt order."""
        from graft.policy.engines import prompt_seeds

        W = self._learner.num_workers
        sizes = split_sizes(len(prompt_ids), W, balanced_unit(len(prompt_ids), W, max(1, batch_size // max(n, 1))))
        seeds = list(seeds) if seeds is not None else prompt_seeds(seed, 0, len(prompt_ids))
        kw = dict(n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, batch_size=batch_size,
                  seed=seed, progress=False, desc=desc, stop_strings=None if stop_strings is None else list(stop_strings))
        parts = self._learner._call("generate", [(p, s, kw) for p, s in zip(blocks(prompt_ids, sizes), blocks(seeds, sizes))],
                                    "generate")
        return [g for part in parts for g in part]


class RayLearner:
    """Driver-side stand-in for :class:`~graft.trainer.learner.Learner`, backed by a Ray actor group."""

    def __init__(self, cfg: ModelConfig, resources: ResourceConfig, ray_cfg: RayConfig, device: str,
                 weights_from: str | None = None, seed: int = 0, engine: str = "hf", threads: int | None = None) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.cfg, self.name = cfg, cfg.name
        self.timeout = float(ray_cfg.actor_timeout_s)
        self.num_workers = W = int(resources.num_workers)
        if W < 1:
            raise ConfigError(f"ray.resources.{cfg.name}.num_workers must be >= 1")
        self.failed: str | None = None
        from graft.policy.codec import TextCodec
        self.text = TextCodec.load(cfg, str(weights_from) if weights_from else None)
        self.optimizer = _RemoteOptimizer(self)
        self.policy = RemotePolicy(self)
        self.workers: list = []
        self._pg = None

        bundle = {"CPU": float(resources.num_cpus) if resources.num_cpus > 0 else 0.001}
        if resources.num_gpus:
            bundle["GPU"] = float(resources.num_gpus)
        self._pg = placement_group([dict(bundle) for _ in range(W)], strategy="PACK", name=f"graft-{cfg.name}-{os.getpid()}")
        ready, _ = ray.wait([self._pg.ready()], timeout=self.timeout)
        if not ready:
            self.close()
            raise WorkerFailure(
                f"model {cfg.name}: the Ray cluster cannot place {W} worker(s) x {bundle} within "
                f"ray.actor_timeout_s={self.timeout:.0f}s (cluster resources: {ray.cluster_resources()}); "
                f"lower ray.resources.{cfg.name}.num_workers / num_gpus or add nodes")
        actor_cls = ray.remote(PolicyWorker)
        thr = threads or max(1, int(resources.num_cpus))
        env = {"OMP_NUM_THREADS": str(thr), "TOKENIZERS_PARALLELISM": "false"}
        for r in range(W):
            opts = dict(num_cpus=bundle["CPU"], num_gpus=float(resources.num_gpus or 0), max_restarts=0,
                        max_task_retries=0, name=f"graft-{cfg.name}-rank{r}-{os.getpid()}-{id(self)}",
                        runtime_env={"env_vars": env},
                        scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=r))
            self.workers.append(actor_cls.options(**opts).remote(cfg.name, r, W, thr))
        master = self._call_one(0, "address", (), "start") if W > 1 else None
        self.info = self._call("setup", (cfg, device, str(weights_from) if weights_from else None, master, seed, engine,
                                         self.timeout), "setup (loading the model)")

    # ------------------------------------------------------------------ remote calls
    def _call(self, method: str, args: tuple | list[tuple], what: str) -> list:
        """Call ``method`` on every worker (same ``args``, or one tuple per rank) and wait for all."""
        if self.failed:
            raise WorkerFailure(self.failed)
        per_rank = args if isinstance(args, list) else [args] * len(self.workers)
        refs = [getattr(w, method).remote(*a) for w, a in zip(self.workers, per_rank)]
        return self._wait(refs, what)

    def _call_one(self, rank: int, method: str, args: tuple, what: str):
        return self._wait([getattr(self.workers[rank], method).remote(*args)], what, ranks=[rank])[0]

    def _wait(self, refs: list, what: str, ranks: list[int] | None = None) -> list:
        import ray
        from ray import exceptions as rex

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
        import ray
        from ray import exceptions as rex
        dead = []
        refs = [w.ping.remote() for w in self.workers]
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
        self.failed = (f"model {self.name} ({self.num_workers} Ray worker(s)): {detail}{died}. The run stopped; its last "
                       f"checkpoint is resumable with resume=true")
        self.close()
        raise WorkerFailure(self.failed)

    def close(self) -> None:
        """Kill this model's actors and release their resources (idempotent)."""
        import ray
        for w in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(w, no_restart=True)
        self.workers = []
        if self._pg is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self._pg)
            self._pg = None
        if not self.failed:
            self.failed = f"model {self.name}: the Ray learner was closed"

    # ------------------------------------------------------------------ receiver side (driver-local text ops)
    def render_prompt(self, problem: str) -> str:
        return self.text.render_prompt(problem)

    def encode_prompt(self, problem: str) -> list[int]:
        return self.text.encode_prompt(problem)

    def encode_responses(self, texts: list[str], finished: list[bool]) -> list[list[int]]:
        return self.text.encode_responses(texts, finished)

    def token_logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]], chunk: int = 1024,
                       micro_batch: int = 8, temperature: float = 1.0, progress: bool = False) -> list[torch.Tensor]:
        from graft.policy.policy import scoring_order

        N, W = len(response_ids), self.num_workers
        order = scoring_order(prompt_ids, response_ids)   # as Policy.token_logprobs does
        # whole micro-batches per worker, in the single process's order: identical padding, identical values
        sizes = split_sizes(N, W, max(1, micro_batch))
        parts = blocks(order, sizes)
        args = [([prompt_ids[i] for i in p], [response_ids[i] for i in p], chunk, micro_batch, temperature) for p in parts]
        res = self._call("token_logprobs", args, "token_logprobs")
        out: list = [None] * N
        for p, lps in zip(parts, res):
            for i, lp in zip(p, lps):
                out[i] = lp
        return out

    # ------------------------------------------------------------------ rollout
    def rollout(self, prompts: list[Prompt], rc: RolloutConfig, step: int, seed: int, progress: bool = False
                ) -> tuple[list[RolloutGroup], dict]:
        t0 = time.perf_counter()
        W = self.num_workers
        ppb = rc.batch_size // rc.n if rc.batch_size % rc.n == 0 else 1
        sizes = split_sizes(len(prompts), W, balanced_unit(len(prompts), W, max(1, ppb)))
        offsets = [sum(sizes[:r]) for r in range(W)]
        args = [(part, rc, step, seed, off, progress and r == 0)
                for r, (part, off) in enumerate(zip(blocks(prompts, sizes), offsets))]
        res = self._call("rollout", args, f"rollout (step {step})")
        groups = [g for gs, _ in res for g in gs]
        seconds = time.perf_counter() - t0
        tokens = sum(len(t) for g in groups for t in g.token_ids)
        return groups, {"tokens/generated": tokens, "tokens_per_s/rollout": tokens / max(seconds, 1e-9)}

    def recompute_old_logprobs(self, groups: list[RolloutGroup], uc: UpdateConfig, temperature: float) -> None:
        from graft.trainer.learner import Learner
        Learner.recompute_old_logprobs(self, groups, uc, temperature)   # uses self.token_logprobs

    # ------------------------------------------------------------------ update
    def update(self, groups: list[RolloutGroup], plan: list[list[int]], uc: UpdateConfig, temperature: float,
               rule, progress: bool = False) -> dict:
        """Like ``Learner.update``; ``progress`` is accepted and ignored (the workers run the minibatches)."""
        from graft.trainer.learner import Learner, prepare_minibatch

        t0 = time.perf_counter()
        W = self.num_workers
        per_rank: list[list[MinibatchShard]] = [[] for _ in range(W)]
        for k, idx in enumerate(plan):
            mb_groups = rule.minibatch_weights(k, [groups[i] for i in idx])
            active, counts = prepare_minibatch(mb_groups, rule.supervised)
            mbs = uc.micro_batch_size
            # whole micro-batches per rank: each is computed exactly as the single process computes it
            parts = blocks(active, split_sizes(len(active), W, mbs))
            num_micro = max(math.ceil(len(p) / mbs) for p in parts)
            for r in range(W):
                per_rank[r].append(MinibatchShard(rows=parts[r], counts=counts, num_micro=num_micro))
        res = self._call("update", [(per_rank[r], uc, temperature, rule.loss_kwargs(), len(plan)) for r in range(W)],
                         "update")
        from graft.algos.losses import merge
        totals: dict[str, float] = {"loss": sum(t.get("loss", 0.0) for t in res),
                                    "grad_norm": res[0].get("grad_norm", 0.0)}   # the global norm, the same on every rank
        for t in res:
            merge(totals, t)
        tokens = int(totals.pop("tokens/update", 0))
        return Learner._update_metrics(totals, tokens, time.perf_counter() - t0)

    # ------------------------------------------------------------------ persistence
    def save(self, path) -> None:
        import ray
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        ship = self.info[0]["node"] != ray.util.get_node_ip_address()
        res = self._call("save", (str(path), ship), "save")
        if ship and res[0]:
            for rel, data in res[0].items():
                (path / rel).parent.mkdir(parents=True, exist_ok=True)
                (path / rel).write_bytes(data)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full parameters (and buffers) of the model, gathered from the workers."""
        return self._call("state_dict", (), "state_dict")[0]

    def peak_rss_gb(self) -> float:
        """The largest peak resident memory (GB) among this model's worker processes."""
        return max(self._call("peak_rss_gb", (), "peak_rss_gb"))

    def __repr__(self) -> str:
        return f"RayLearner({self.name!r}, workers={self.num_workers})"


def peak_rss_gb() -> float:
    """Peak resident memory of the calling process in GB (``ru_maxrss`` is KiB on Linux)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def worker_memory(learners: dict) -> dict[str, float]:
    """``{"mem/peak_rss_gb/NAME": GB}`` for every Ray-backed model (max over its workers); the driver's
    own ``mem/peak_rss_gb`` does not see them. Empty for the local backend (one process)."""
    return {f"mem/peak_rss_gb/{n}": lr.peak_rss_gb() for n, lr in learners.items() if isinstance(lr, RayLearner)}


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
        import ray
    except ImportError as e:
        raise ConfigError("backend=ray needs Ray: pip install 'ray[default]' (or 'graft[ray]')") from e
    if ray.is_initialized():
        return
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p),
                        "TOKENIZERS_PARALLELISM": "false"}}
    for var in ("GRAFT_CACHE", "HF_HOME", "HF_HUB_OFFLINE"):
        if os.environ.get(var):
            env["env_vars"][var] = os.environ[var]
    if ray_cfg.address:
        ray.init(address=ray_cfg.address, runtime_env=env, log_to_driver=True)
    else:
        cpus = max(float(os.cpu_count() or 1), needed_cpus)
        kwargs: dict[str, Any] = {"num_cpus": int(math.ceil(cpus)), "include_dashboard": False, "runtime_env": env}
        if needed_gpus and not torch.cuda.is_available():
            raise ConfigError(f"the configured Ray workers request {needed_gpus} GPU(s) but this machine has none "
                              "(set ray.address to a cluster with GPUs, or num_gpus: 0)")
        ray.init(**kwargs)


def init_seed(seed: int, name: str) -> int:
    """torch seed set right before model ``name`` is built (random parts such as a new LoRA adapter):
    a function of (seed, name), so every backend and every rank initialises identically."""
    import zlib
    return (int(seed) * 1_000_003 + zlib.crc32(f"init/{name}".encode())) % (2**63 - 1)


def resources_for(cfg: Config, name: str) -> ResourceConfig:
    return cfg.ray.resources.get(name) or ResourceConfig()


def make_learners(cfg: Config, device: str, ckpt=None) -> dict:
    """``{name: Learner}`` for ``backend: local``, ``{name: RayLearner}`` for ``backend: ray``."""
    from graft.trainer.learner import Learner

    weights = {m.name: (str(ckpt.model_dirs[m.name]) if ckpt else None) for m in cfg.models}
    if cfg.backend == "local":
        from tqdm.auto import tqdm
        out = {}
        for m in tqdm(cfg.models, desc="loading models", disable=not cfg.progress):
            torch.manual_seed(init_seed(cfg.seed, m.name))   # e.g. a fresh LoRA adapter: same init on every backend
            out[m.name] = Learner(m, device=device, weights_from=weights[m.name])
        return out
    unknown = set(cfg.ray.resources) - {m.name for m in cfg.models}
    if unknown:
        raise ConfigError(f"ray.resources names unknown model(s) {sorted(unknown)}; models: {[m.name for m in cfg.models]}")
    res = {m.name: resources_for(cfg, m.name) for m in cfg.models}
    init_ray(cfg.ray, sum(r.num_cpus * r.num_workers for r in res.values()),
             sum(r.num_gpus * r.num_workers for r in res.values()))
    learners: dict = {}
    try:
        for m in cfg.models:
            r = res[m.name]
            wdev = "cuda" if r.num_gpus > 0 else "cpu"
            if cfg.device == "cuda" and wdev == "cpu":
                raise ConfigError(f"device=cuda but ray.resources.{m.name}.num_gpus is 0")
            learners[m.name] = RayLearner(m, r, cfg.ray, wdev, weights_from=weights[m.name], seed=init_seed(cfg.seed, m.name),
                                          engine=cfg.rollout.engine, threads=cfg.threads)
            print(f"ray: model {m.name} on {r.num_workers} worker(s) "
                  f"({', '.join(sorted({i['node'] for i in learners[m.name].info}))}; {wdev}; engine {cfg.rollout.engine})",
                  file=sys.stderr)
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
