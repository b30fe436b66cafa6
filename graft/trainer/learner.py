"""One model's side of training, on the driver: sample, score peer text, update.

A :class:`Learner` holds the model's text codec and talks to its worker group -- one in-process
rank (``backend: local``) or W Ray ranks (``backend: ray``) -- through primitives only
(:class:`graft.trainer.workers.PolicyWorker`). Everything that is not arithmetic on weights
happens here, once, for both backends: prompt encoding, building rollout groups, the minibatch
loop (rows, global normalisers, one :func:`~graft.trainer.workers.scatter` over ranks, metrics).
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch
from tqdm.auto import tqdm

from graft import cores
from graft.algos.losses import merge, summarize
from graft.config import ModelConfig, RolloutConfig, UpdateConfig
from graft.policy.codec import TextCodec
from graft.policy.optim import scheduled_lr
from graft.policy.sampling import SamplingParams, rollout_sampling
from graft.policy.scoring import scoring_order
from graft.seeds import prompt_seeds
from graft.trainer.batch import Shard, forwarded_positions, prepare_minibatch
from graft.trainer.workers import LocalWorkers, PolicyWorker, scatter
from graft.types import Prompt, RolloutGroup, Sample


def mean_entropy(samples: list[Sample]) -> float | None:
    """Per-token entropy of the sampler averaged over every token of ``samples`` [N] (token-weighted);
    ``None`` when the engine reported none (or no token was sampled)."""
    ents: list[float] = []
    for s in samples:
        if s.entropies is None:
            return None
        ents.extend(s.entropies)
    return sum(ents) / len(ents) if ents else None


def generation_rounds(order: list[list[int]], per_batch: int) -> list[list[list[int]]]:
    """``order`` (the prompt indices of each rank) as rounds of at most one generation batch (``per_batch`` prompts)
    per rank, in order; a rank out of prompts gets an empty list (every rank takes part in every call)."""
    rounds = max((math.ceil(len(idx) / per_batch) for idx in order), default=0)
    return [[idx[b * per_batch : (b + 1) * per_batch] for idx in order] for b in range(rounds)]


class Learner:
    """One model on the driver: its codec and its worker group."""

    def __init__(self, cfg: ModelConfig, workers, codec: TextCodec) -> None:
        self.cfg, self.name, self.workers, self.codec = cfg, cfg.name, workers, codec
        self.optimizer = _Optimizer(self)

    @classmethod
    def local(
        cls, cfg: ModelConfig, device: str = "cpu", weights_from=None, engine: str = "hf", keep_memory: bool = False
    ) -> "Learner":
        """A learner whose one rank lives in this process (``backend: local``; ``keep_memory``: see
        :class:`~graft.trainer.workers.PolicyWorker`)."""
        worker = PolicyWorker(cfg.name, keep_memory=keep_memory)
        worker.setup(cfg, device, None if weights_from is None else str(weights_from), None, None, engine)
        return cls(cfg, LocalWorkers(worker), worker.policy.codec)

    @property
    def policy(self):
        """The in-process Policy (``backend: local``), or this learner over its Ray workers."""
        return getattr(self.workers, "local_policy", None) or self

    def pushed_threads(self) -> cores.Pushed:
        """The calling side-by-side task's threads for this model's ranks (``threads_claim_freed``): pushed to them
        before a call once they grew (``set_threads``), when they live in other processes (``backend: ray``; they
        react at call boundaries only); in-process ranks take theirs at :func:`graft.cores.poll` instead."""
        if isinstance(self.workers, LocalWorkers):
            return cores.Pushed(None)
        return cores.Pushed(lambda n: self.workers.call("set_threads", [(n,)] * self.workers.size, "set_threads"))

    # --------------------------------------------------------------- primitives over the ranks
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, progress: bool = False, desc: str = "") -> list[list]:
        """``params.n`` samples per prompt, ``[P][G]``: prompts in blocks of whole generation batches per rank,
        prompt i sampling with ``params.seeds[i]`` (default: derived from ``params.seed`` and i), results in prompt
        order. ``progress``: rank 0's bar, labelled ``desc``."""
        W, n, batch_size = self.workers.size, params.n, params.batch_size
        seeds = list(params.seeds) if params.seeds is not None else prompt_seeds(params.seed, 0, len(prompt_ids))
        per_batch = batch_size // n if batch_size % n == 0 else 1
        order = scatter(list(range(len(prompt_ids))), W, per_batch, even=True)
        desc = desc or f"{self.name} generate"
        pushed = self.pushed_threads()
        parts: list[list] = [[] for _ in range(W)]
        for block in generation_rounds(order, per_batch) if pushed.active else [order]:
            pushed.check()
            res = self.workers.call(
                "generate",
                [
                    (
                        [prompt_ids[i] for i in idx],
                        dataclasses.replace(params, seeds=tuple(seeds[i] for i in idx)),
                        progress and r == 0,
                        desc,
                    )
                    for r, idx in enumerate(block)
                ],
                "generate",
            )
            for part, got in zip(parts, res, strict=True):  # one result per rank
                part += got
        pushed.restore()
        return [g for part in parts for g in part]

    def token_logprobs(
        self,
        prompt_ids: list[list[int]],
        response_ids: list[list[int]],
        chunk: int = 1024,
        micro_batch: int = 8,
        temperature: float = 1.0,
        progress: bool = False,
    ) -> list[torch.Tensor]:
        """Per-response log-probs ``[N]`` of ``[T_n]`` under the current weights (no gradients): whole
        micro-batches per rank in :func:`~graft.policy.scoring.scoring_order`, so every value is computed in
        the same padded batch as in one process."""
        order = scoring_order(prompt_ids, response_ids)
        parts = scatter(order, self.workers.size, max(1, micro_batch))
        pushed = self.pushed_threads()
        pushed.check()
        res = self.workers.call(
            "logprobs",
            [([prompt_ids[i] for i in p], [response_ids[i] for i in p], chunk, micro_batch, temperature) for p in parts],
            "logprobs",
        )
        pushed.restore()
        out: list = [None] * len(response_ids)
        for p, lps in zip(parts, res, strict=True):  # one result per part (rank), one log-prob row per response
            for i, lp in zip(p, lps, strict=True):
                out[i] = lp
        return out

    # --------------------------------------------------------------- rollout
    def rollout(
        self, prompts: list[Prompt], rc: RolloutConfig, step: int, seed: int, progress: bool = False
    ) -> tuple[list[RolloutGroup], dict]:
        """G samples per prompt from pi_theta_old (ended at the model's stop strings); rewards are
        filled by the scorer. Prompt i samples with its own seed, a function of (``seed``, i)."""
        t0 = time.perf_counter()
        prompt_ids = [self.codec.encode_prompt(p.problem, p.messages) for p in prompts]
        params = rollout_sampling(rc, seeds=prompt_seeds(seed, 0, len(prompts)), entropy=True)
        samples = self.generate(prompt_ids, params, progress=progress, desc=f"{self.name} rollout")
        groups = [
            RolloutGroup(
                prompt_id=p.id,
                problem=p.problem,
                answer=p.answer,
                source=self.name,
                holder=self.name,
                prompt_text=self.codec.render_prompt(p.problem, p.messages),
                prompt_token_ids=ids,
                responses=[s.text for s in ss],
                token_ids=[s.token_ids for s in ss],
                old_logprobs=[s.logprobs for s in ss],
                gen_token_ids=[s.token_ids for s in ss],
                gen_logprobs=[s.logprobs for s in ss],
                finished=[s.finished for s in ss],
                weights=[1.0] * len(ss),
                compat=[1.0] * len(ss),
                step=step,
                messages=p.messages,
            )
            for p, ids, ss in zip(prompts, prompt_ids, samples, strict=True)
        ]
        seconds = time.perf_counter() - t0
        tokens = sum(len(t) for g in groups for t in g.token_ids)
        return groups, {
            "tokens/generated": tokens,
            "tokens/prompt": sum(len(ids) for ids in prompt_ids),
            "tokens_per_s/rollout": tokens / max(seconds, 1e-9),
            "entropy/mean": mean_entropy([s for ss in samples for s in ss]),
        }

    def recompute_old_logprobs(self, groups: list[RolloutGroup], uc: UpdateConfig, temperature: float) -> dict:
        """Replace the sampler's log-probs of own responses (``old_logprobs``, and ``gen_logprobs``: the
        source side of ``s``) with a forward pass of the current (= behaviour) policy. Returns the gap
        between the two, ``logprob_gap/mean_abs`` and ``logprob_gap/max_abs`` (nats per token)."""
        own = [(g, i) for g in groups if not g.is_peer for i in range(g.size)]
        lps = self.token_logprobs(
            [g.prompt_token_ids for g, _ in own],
            [g.token_ids[i] for g, i in own],
            chunk=uc.logprob_chunk,
            micro_batch=uc.micro_batch_size,
            temperature=temperature,
        )
        total, count, worst = 0.0, 0, 0.0
        for (g, i), lp in zip(own, lps, strict=True):
            gap = (lp.double() - torch.tensor(g.old_logprobs[i], dtype=torch.float64)).abs()
            if gap.numel():
                total, count, worst = total + float(gap.sum()), count + gap.numel(), max(worst, float(gap.max()))
            g.old_logprobs[i] = lp.tolist()
            g.gen_logprobs[i] = list(g.old_logprobs[i])
        return {"logprob_gap/mean_abs": total / count if count else None, "logprob_gap/max_abs": worst if count else None}

    # --------------------------------------------------------------- update
    def update(
        self,
        groups: list[RolloutGroup],
        plan: list[list[int]],
        uc: UpdateConfig,
        temperature: float,
        rule,
        progress: bool = False,
    ) -> dict:
        """One pass of ``plan`` (minibatches of group indices, in order); one optimiser step each.

        Sequences with zero advantage or zero weight contribute exactly zero loss and gradient, so
        they are not forwarded; their tokens still count in the token-mean denominator, which keeps
        the result identical to forwarding them. ``rule`` (a :class:`graft.trainer.rules.UpdateRule`)
        gives the loss, the per-minibatch re-weighting (HACPO) and the supervised rows (SGT). Each
        minibatch's rows go to the ranks in whole micro-batches, each rank dividing by the minibatch's
        global counts, so W ranks compute the single process's step. A minibatch whose loss or gradient
        norm is NaN/inf takes no optimiser step (``update/skipped_nonfinite`` counts them).
        """
        W, mbs = self.workers.size, uc.micro_batch_size
        totals: dict[str, float] = {}
        skipped = 0
        t0 = time.perf_counter()
        bar = tqdm(total=len(plan), desc=f"{self.name} update", unit="minibatch", leave=False, disable=not progress)
        pushed = self.pushed_threads()
        try:
            for k, idx in enumerate(plan):
                active, counts = prepare_minibatch(
                    rule.minibatch_weights(k, [groups[i] for i in idx]), rule.supervised, zero_advantage=self.cfg.kl_coef > 0
                )
                parts = scatter(active, W, mbs)
                merge(totals, forwarded_positions(active, mbs))
                num_micro = max(math.ceil(len(p) / mbs) for p in parts)
                shards = [Shard(p, counts, num_micro, rule.loss, rule.loss_kwargs()) for p in parts]
                pushed.check()
                res = self.workers.call("train_minibatch", [(sh, uc, temperature) for sh in shards], "update")
                for r in res:
                    merge(totals, r)
                totals["loss"] = totals.get("loss", 0.0) + sum(r["loss"] for r in res) / len(plan)
                totals["grad_norm"] = totals.get("grad_norm", 0.0) + res[0]["grad_norm"] / len(plan)  # global norm
                skipped += int(res[0]["skipped_nonfinite"])  # the ranks agree
                bar.update(1)
        finally:
            bar.close()
        pushed.restore()
        self.workers.call("weights_changed", [()] * W, "weights_changed")
        seconds, tokens = time.perf_counter() - t0, totals.get("tokens/update", 0.0)
        return {
            "loss": totals.get("loss", 0.0),
            "grad_norm": totals.get("grad_norm", 0.0),
            **summarize(totals),
            "tokens/update": int(tokens),
            "tokens_per_s/update": tokens / max(seconds, 1e-9),
            "tokens/forwarded": int(totals.get("tokens/forwarded", 0)),
            "tokens/forwarded_per_sequence": int(totals.get("tokens/forwarded_per_sequence", 0)),
            "update/skipped_nonfinite": skipped,
        }

    def set_learning_rate(self, step: int, horizon: int) -> float:
        """Every rank's optimiser to the learning rate of training step ``step`` of a schedule over ``horizon`` steps
        (``models.I.lr_schedule``, :func:`~graft.policy.optim.scheduled_lr`); returns it."""
        lr = scheduled_lr(self.cfg.lr, self.cfg.lr_schedule, self.cfg.warmup_steps, step, horizon)
        self.workers.call("set_learning_rate", [(lr,)] * self.workers.size, "set_learning_rate")
        return lr

    # --------------------------------------------------------------- persistence, resources
    def save(self, path) -> None:
        """The model (or its LoRA adapter) as a Hugging Face folder at ``path``."""
        self.workers.save(path)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full parameters (and buffers) of the model."""
        return self.workers.call("state_dict", [()] * self.workers.size, "state_dict")[0]

    def max_positions(self) -> int | None:
        """The model's ``max_position_embeddings`` (None when its config has none)."""
        return self.workers.call("max_positions", [()] * self.workers.size, "max_positions")[0]

    def nonfinite_parameters(self) -> list[str]:
        """Names of the model's parameters holding NaN or inf (on any rank)."""
        parts = self.workers.call("nonfinite_parameters", [()] * self.workers.size, "nonfinite_parameters")
        return sorted({n for part in parts for n in part})

    def memory(self) -> dict[str, float]:
        """Each peak of :func:`~graft.trainer.workers.process_memory` (GB), the largest among this model's
        worker processes."""
        per_rank = self.workers.call("memory", [()] * self.workers.size, "memory")
        return {k: max(m[k] for m in per_rank if k in m) for k in per_rank[0]}

    def close(self) -> None:
        self.workers.close()

    def __repr__(self) -> str:
        return f"Learner({self.name!r}, ranks={self.workers.size})"


class _Optimizer:
    """``state_dict``/``load_state_dict`` of the workers' optimizer (what checkpoints need)."""

    def __init__(self, learner: Learner) -> None:
        self._learner = learner

    def state_dict(self) -> dict:
        W = self._learner.workers.size
        return self._learner.workers.call("optimizer_state", [()] * W, "optimizer.state_dict")[0]

    def load_state_dict(self, state: dict) -> None:
        W = self._learner.workers.size
        self._learner.workers.call("load_optimizer_state", [(state,)] * W, "optimizer.load_state_dict")

    def restore(self, state: dict) -> None:
        """Back to ``state`` (an earlier :meth:`state_dict`), the moments copied in place on each worker."""
        W = self._learner.workers.size
        self._learner.workers.call("restore_optimizer_state", [(state,)] * W, "optimizer.restore")
