"""One model's side of training: sample, score peer text, update.

A :class:`Learner` owns a :class:`~graft.policy.policy.Policy` and its optimizer. The
trainer talks to learners only through the methods here, so the Ray backend
(:mod:`graft.distributed.ray_backend`) can put each learner in its own actor group.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from graft.algos.losses import merge, summarize
from graft.config import ModelConfig, RolloutConfig, UpdateConfig
from graft.types import Prompt, RolloutGroup


@dataclass
class Sequence:
    """One response flattened for the update: holder-tokenized ids, behaviour log-probs, scalars."""

    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    weight: float
    is_peer: bool
    sgt: bool = False


def never(group: RolloutGroup, i: int) -> bool:
    return False


def flatten(groups: list[RolloutGroup], supervised=never) -> list[Sequence]:
    """All responses of ``groups`` as update sequences; ``supervised(group, i)`` marks SGT (NLL) rows."""
    return [
        Sequence(g.prompt_token_ids, g.token_ids[i], g.old_logprobs[i], g.advantages[i], g.weights[i], g.is_peer,
                 sgt=supervised(g, i))
        for g in groups for i in range(g.size)
    ]


def prepare_minibatch(mb_groups: list[RolloutGroup], supervised=never
                      ) -> tuple[list[Sequence], tuple[float, float, float]]:
    """The rows of one minibatch that are forwarded, and the minibatch's normalisers
    (policy-gradient tokens, sequences, SGT tokens) -- shared with the Ray backend, which
    splits the rows across ranks and keeps these GLOBAL counts."""
    seqs = flatten(mb_groups, supervised)
    pg_rows = [s for s in seqs if not s.sgt]          # SGT rows are normalised separately
    counts = (float(sum(len(s.response_ids) for s in pg_rows)), float(len(pg_rows)),
              float(sum(len(s.response_ids) for s in seqs if s.sgt)))
    active = [s for s in seqs if (s.advantage != 0.0 or s.sgt) and s.weight != 0.0 and s.response_ids]
    return active, counts


def _pad(rows: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
    return out


class Learner:
    """A policy, its optimizer and the three operations the trainer needs from it."""

    def __init__(self, cfg: ModelConfig, device: str = "cpu", weights_from=None):
        from graft.policy.policy import Policy

        self.cfg = cfg
        self.name = cfg.name
        self.policy = Policy.load(cfg, device=device, weights_from=None if weights_from is None else str(weights_from))
        self.optimizer = self.policy.make_optimizer()
        self._engine = None

    def engine(self, kind: str = "hf"):
        """The rollout engine (:mod:`graft.policy.engines`) of kind ``rollout.engine``, built once."""
        current = getattr(self, "_engine", None)
        if current is None or current.kind != kind:
            from graft.policy.engines import make_engine
            if current is not None:
                current.close()
            self._engine = make_engine(kind, self.policy)
        return self._engine

    def weights_changed(self) -> None:
        """Tell the rollout engine the weights changed (vLLM reloads them; no-op for hf)."""
        if getattr(self, "_engine", None) is not None:
            self._engine.weights_updated()

    def close(self) -> None:
        if getattr(self, "_engine", None) is not None:
            self._engine.close()
            self._engine = None

    # --------------------------------------------------------------- receiver side
    def render_prompt(self, problem: str) -> str:
        return self.policy.render_prompt(problem)

    def encode_prompt(self, problem: str) -> list[int]:
        return self.policy.encode_prompt(problem)

    def encode_responses(self, texts: list[str], finished: list[bool]) -> list[list[int]]:
        return self.policy.codec.encode_responses(texts, finished)

    def token_logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]],
                       chunk: int = 1024, micro_batch: int = 8, temperature: float = 1.0,
                       progress: bool = False) -> list[torch.Tensor]:
        return self.policy.token_logprobs(prompt_ids, response_ids, chunk=chunk, micro_batch=micro_batch,
                                          temperature=temperature, progress=progress)

    # --------------------------------------------------------------- rollout
    def rollout(self, prompts: list[Prompt], rc: RolloutConfig, step: int, seed: int, progress: bool = False,
                prompt_offset: int = 0) -> tuple[list[RolloutGroup], dict]:
        """G samples per prompt from pi_theta_old; rewards are filled by the scorer.

        Prompt i of the step's batch (``prompt_offset + i`` when this is a shard of it) samples
        with its own seed, a function of (``seed``, i): the same whichever worker samples it."""
        from graft.policy.engines import prompt_seeds

        t0 = time.perf_counter()
        prompt_ids = [self.encode_prompt(p.problem) for p in prompts]
        samples = self.engine(rc.engine).generate(
            prompt_ids, n=rc.n, max_new_tokens=rc.max_new_tokens, temperature=rc.temperature, top_p=rc.top_p,
            batch_size=rc.batch_size, seed=seed, seeds=prompt_seeds(seed, prompt_offset, len(prompts)),
            progress=progress, desc=f"{self.name} rollout")
        groups = [
            RolloutGroup(
                prompt_id=p.id, problem=p.problem, answer=p.answer, source=self.name, holder=self.name,
                prompt_text=self.render_prompt(p.problem), prompt_token_ids=ids,
                responses=[s.text for s in ss], token_ids=[s.token_ids for s in ss],
                old_logprobs=[s.logprobs for s in ss], gen_token_ids=[s.token_ids for s in ss],
                gen_logprobs=[s.logprobs for s in ss], finished=[s.finished for s in ss],
                weights=[1.0] * len(ss), compat=[1.0] * len(ss), step=step,
            )
            for p, ids, ss in zip(prompts, prompt_ids, samples)
        ]
        seconds = time.perf_counter() - t0
        tokens = sum(len(t) for g in groups for t in g.token_ids)
        return groups, {"tokens/generated": tokens, "tokens_per_s/rollout": tokens / max(seconds, 1e-9)}

    def recompute_old_logprobs(self, groups: list[RolloutGroup], uc: UpdateConfig, temperature: float) -> None:
        """Replace own sampler log-probs with a forward pass of the current (= behaviour) policy."""
        own = [(g, i) for g in groups if not g.is_peer for i in range(g.size)]
        lps = self.token_logprobs([g.prompt_token_ids for g, _ in own], [g.token_ids[i] for g, i in own],
                                  chunk=uc.logprob_chunk, micro_batch=uc.micro_batch_size, temperature=temperature)
        for (g, i), lp in zip(own, lps):
            g.old_logprobs[i] = lp.tolist()

    # --------------------------------------------------------------- update
    def update(self, groups: list[RolloutGroup], plan: list[list[int]], uc: UpdateConfig, temperature: float,
               rule, progress: bool = False) -> dict:
        """One pass of ``plan`` (minibatches of group indices, in order); one optimiser step each.

        Sequences with zero advantage or zero weight contribute exactly zero loss and
        gradient, so they are not forwarded; their tokens still count in the token-mean
        denominator, which keeps the result identical to forwarding them. ``rule`` (an
        :class:`graft.trainer.rules.UpdateRule`) gives the loss, its keyword arguments, the
        per-minibatch re-weighting (HACPO) and the supervised rows (SGT).
        ``progress`` shows a bar over the minibatches (optimiser steps).
        """
        loss_fn, loss_kwargs = rule.loss, rule.loss_kwargs()
        totals: dict[str, float] = {}
        t0, tokens_done = time.perf_counter(), 0
        self.policy.model.train()
        bar = tqdm(total=len(plan), desc=f"{self.name} update", unit="minibatch", leave=False, disable=not progress)
        for k, idx in enumerate(plan):
            mb_groups = rule.minibatch_weights(k, [groups[i] for i in idx])
            active, counts = prepare_minibatch(mb_groups, rule.supervised)
            self.optimizer.zero_grad(set_to_none=True)
            mb_loss = 0.0
            for j in range(0, len(active), uc.micro_batch_size):
                micro = active[j: j + uc.micro_batch_size]
                loss, m = self._micro_loss(micro, loss_fn, uc, temperature, counts, loss_kwargs)
                loss.backward()
                mb_loss += float(loss.detach())
                merge(totals, m)
                tokens_done += sum(len(s.response_ids) for s in micro)
                bar.set_postfix_str(f"sequences {min(j + uc.micro_batch_size, len(active))}/{len(active)}")
            grad_norm = self._step()
            bar.update(1)
            totals["loss"] = totals.get("loss", 0.0) + mb_loss / len(plan)
            totals["grad_norm"] = totals.get("grad_norm", 0.0) + grad_norm / len(plan)
        bar.close()
        self.optimizer.zero_grad(set_to_none=True)   # no gradients held through rollout, exchange, the peer's update
        self.policy.model.eval()
        self.weights_changed()
        return self._update_metrics(totals, tokens_done, time.perf_counter() - t0)

    def _micro_loss(self, micro: list[Sequence], loss_fn, uc: UpdateConfig, temperature: float,
                    counts: tuple[float, float, float], loss_kwargs: dict):
        """Loss of one micro-batch, normalised by the whole minibatch's counts
        (policy-gradient tokens, sequences, SGT tokens) so micro-batch gradients add up exactly."""
        num_tokens, num_seqs, num_sgt_tokens = counts
        logp, mask = self.policy.forward_logprobs([s.prompt_ids for s in micro], [s.response_ids for s in micro],
                                                  chunk=uc.logprob_chunk, temperature=temperature)   # [B,T]
        old = _pad([s.old_logprobs for s in micro], logp.shape[1]).to(logp.device)
        f = lambda xs, dt=torch.float32: torch.tensor(xs, dtype=dt, device=logp.device)  # noqa: E731
        kwargs = dict(
            logp=logp, old_logp=old, advantages=f([s.advantage for s in micro]), weights=f([s.weight for s in micro]),
            mask=mask, is_peer=f([s.is_peer for s in micro], torch.bool), clip_low=uc.clip_low, clip_high=uc.clip_high,
            agg=uc.loss_agg, ratio_level=uc.ratio_level, num_tokens=num_tokens, num_seqs=num_seqs,
        )
        if any(s.sgt for s in micro) or num_sgt_tokens:
            kwargs |= {"sgt_mask": f([s.sgt for s in micro], torch.bool), "num_sgt_tokens": num_sgt_tokens}
        return loss_fn(**(kwargs | loss_kwargs))

    def _step(self) -> float:
        from graft.distributed.fsdp import clip_grad_norm_   # float64 norm: identical for sharded (Ray) training

        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        norm = clip_grad_norm_(params, self.cfg.max_grad_norm)
        self.optimizer.step()
        return norm

    @staticmethod
    def _update_metrics(t: dict, tokens: int, seconds: float) -> dict:
        """The update's metrics: loss, grad norm, :func:`losses.summarize` of the merged totals, throughput."""
        return {"loss": t.get("loss", 0.0), "grad_norm": t.get("grad_norm", 0.0), **summarize(t),
                "tokens/update": tokens, "tokens_per_s/update": tokens / max(seconds, 1e-9)}

    # --------------------------------------------------------------- persistence
    def save(self, path) -> None:
        self.policy.save(path)
