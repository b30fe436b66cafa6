"""The scorer: log-probs of given responses under one policy, with gradients for the update
(:meth:`Scorer.forward_logprobs`) or without for scoring (:meth:`Scorer.token_logprobs`), the fused head
(:class:`_HeadLogProb`) and the decoder passes over prompt and response (shared prefix or joint).

Log-prob semantics: :mod:`graft.policy.lm`.
"""

from __future__ import annotations

import weakref
from typing import Any, cast

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint
from tqdm.auto import tqdm
from transformers import DynamicCache

from graft.policy.fsdp import is_sharded
from graft.policy.lm import CausalLM
from graft.policy.loading import unwrap as _unwrap

HEAD_KEEP_BYTES = 1 << 30
"""Memory bound of :class:`_HeadLogProb`'s kept logits: one :meth:`Scorer.forward_logprobs` call (one
micro-batch) keeps the fp32 logits of its chunks for backward while their total stays within this many bytes
(``n x V x 4`` per chunk: the default job's largest micro-batch, 8 x 48 tokens of Gemma-3's 262k vocabulary, is
0.4 GB); the chunks beyond it recompute their logits in backward. 0: always recompute."""


class _HeadLogProb(torch.autograd.Function):
    """``log_softmax(z)[target]`` with ``z = softcap(h W^T + b) / T`` for a plain ``nn.Linear`` head.

    Shapes: ``hidden`` [n, H], ``weight`` [V, H], ``bias`` [V] or None, ``targets`` [n] -> [n].

    ``compute``: a copy of ``weight`` in a lower precision (``models.I.autocast``) that every head matmul uses instead,
    on ``hidden`` (and ``bias``) cast to its dtype; the logits are still fp32 and the gradients return in the
    inputs' own dtypes (``weight``'s reaches the fp32 parameter). ``None``: ``weight`` itself.

    ``keep=False`` saves only ``h``, the targets and the log-normaliser; backward recomputes the logits
    chunk in place (one n x V fp32 buffer, two with softcapping) instead of keeping the logits, their exp
    and their gradient as autograd would: 4 head matmuls per chunk. ``keep=True`` saves the forward's
    fp32 logits ``z`` [n, V] (with softcapping, the raw ``tanh`` [n, V] that backward derives ``z`` from)
    and backward works on them in place: 3 head matmuls, the same values bit for bit (backward computes
    from the very tensor it used to recompute), one n x V buffer held from forward to backward
    (:data:`HEAD_KEEP_BYTES` bounds them). Such a node is differentiated once: a second backward
    (``retain_graph``) fails autograd's check of tensors saved and then modified in place.
    The weight gradient is skipped when the head is frozen (LoRA).

    ``accumulate=True`` (``weight`` a leaf parameter, no ``compute`` copy): backward adds the weight gradient into
    ``weight.grad`` itself, as the matmul's own accumulation (``addmm_``), and returns none to autograd. Autograd
    would allocate a [V, H] gradient per chunk, sum it with the other uses of a tied weight (the input embedding)
    and add that into ``weight.grad``: three passes over a [V, H] buffer (671 MB for Gemma-3) per micro-batch that
    this skips. The sum is the same up to float rounding (another order of additions).
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        softcap: float | None,
        temperature: float,
        keep: bool = False,
        compute: Tensor | None = None,
        accumulate: bool = False,
    ) -> Tensor:
        assert hidden.dim() == 2 and targets.shape == hidden.shape[:1], (hidden.shape, targets.shape)
        assert not accumulate or (compute is None and weight.is_leaf), "accumulate needs a leaf fp32 head weight"
        w, h_dtype = (weight if compute is None else compute), hidden.dtype
        hidden, bias = hidden.to(w.dtype), None if bias is None else bias.to(w.dtype)
        z = torch.nn.functional.linear(hidden, w, bias).float()
        t = None
        if softcap:
            t = z.div_(softcap).tanh_()
            z = t * softcap if keep else t.mul_(softcap)
        if temperature != 1.0:
            z.div_(temperature)
        picked = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        m = z.amax(dim=-1, keepdim=True)
        e = (z - m) if keep and t is None else z.sub_(m)
        lse = e.exp_().sum(dim=-1).log_() + m.squeeze(-1)
        kept = (t if t is not None else z) if keep else None
        ctx.save_for_backward(hidden, w, bias, targets, lse, kept)
        ctx.softcap, ctx.temperature, ctx.keep = softcap, temperature, keep
        ctx.dtypes = (h_dtype, weight.dtype)
        ctx.param = weight if accumulate else None
        return picked - lse

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, lse, kept = ctx.saved_tensors
        softcap, temperature = ctx.softcap, ctx.temperature
        z = kept if ctx.keep else torch.nn.functional.linear(hidden, weight, bias).float()
        t = None
        if softcap:
            t = z if ctx.keep else z.div_(softcap).tanh_()  # the raw tanh, kept for the derivative
            z = t * (softcap / temperature)
        elif temperature != 1.0 and not ctx.keep:
            z.div_(temperature)
        # d/dz [z_target - lse] = onehot - softmax(z); times the incoming grad, / T for dz/dlogits
        g = (grad.float() / temperature).unsqueeze(-1)
        gz = z.sub_(lse.unsqueeze(-1)).exp_().mul_(g).neg_()
        gz.scatter_add_(-1, targets.unsqueeze(-1), g)
        if t is not None:
            gz.mul_(t.square_().neg_().add_(1.0))  # d softcap(x) / dx = 1 - tanh^2
        gz = gz.to(weight.dtype)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        h_dtype, w_dtype = ctx.dtypes
        gh = (gz @ weight).to(h_dtype) if need_h else None
        gw = (gz.t() @ hidden).to(w_dtype) if need_w and ctx.param is None else None
        if need_w and ctx.param is not None:
            _accumulate_grad(ctx.param, gz.t(), hidden)
        gb = gz.sum(0).to(w_dtype) if need_b and bias is not None else None
        return gh, gw, gb, None, None, None, None, None, None


def _accumulate_grad(param: Tensor, a: Tensor, b: Tensor) -> None:
    """``param.grad += a @ b`` in the matmul itself (``param.grad = a @ b`` while it is unset)."""
    with torch.no_grad():
        if param.grad is None:
            param.grad = a @ b
        else:
            param.grad.addmm_(a, b)


def scoring_order(prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[int]:
    """Row order for no-grad scoring in micro-batches: longest prompts first, the rows of one prompt
    together (its prefix is then forwarded once per micro-batch), longest responses first within it."""
    first: dict[tuple[int, ...], int] = {}
    key = [first.setdefault(tuple(p), i) for i, p in enumerate(prompt_ids)]
    return sorted(range(len(prompt_ids)), key=lambda i: (-len(prompt_ids[i]), key[i], -len(response_ids[i])))


class Scorer:
    """Log-probs of given text under one :class:`~graft.policy.lm.CausalLM` (a policy's ``scorer``)."""

    def __init__(self, lm: CausalLM) -> None:
        self.lm: CausalLM = weakref.proxy(lm)
        """The model scored with, held weakly: the policy owns its scorer, and no reference cycle keeps a model's
        memory alive after its policy is dropped."""
        self.fused_head: bool = True
        """Use the fused head log-prob backward (:class:`_HeadLogProb`) when the head is a plain Linear."""
        self.accumulate_head_grad: bool = True
        """The fused head adds its weight gradient into ``weight.grad`` in the matmul (:meth:`_accumulates_head_grad`)
        and a tied input embedding's backward then adds only the rows of its tokens (a sparse gradient) into it:
        no [V, H] gradient is allocated, summed and added per micro-batch. The same sum up to float rounding."""
        self.head_keep_bytes: int = HEAD_KEEP_BYTES
        """The fused head keeps a chunk's forward logits for backward (3 head matmuls instead of 4, same values)
        while one :meth:`forward_logprobs` call's kept logits stay within this many bytes (:data:`HEAD_KEEP_BYTES`)."""
        self._compute: tuple[tuple, Tensor] | None = None
        """The fused head's weight in ``lm.autocast``'s dtype and the weight version it was cast from (:meth:`_compute_copy`)."""

    def _gather_logp(self, hidden: Tensor, targets: Tensor, temperature: float) -> Tensor:
        """log-softmax(logits)[target] for rows of ``hidden`` [n, H]; materialises n x V once."""
        logits = self.lm._logits(hidden, temperature)
        picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        if torch.is_grad_enabled():
            return picked - torch.logsumexp(logits, dim=-1)
        # no autograd: logsumexp in place, so only one n x V buffer exists
        m = logits.amax(dim=-1, keepdim=True)
        return picked - (logits.sub_(m).exp_().sum(dim=-1).log_() + m.squeeze(-1))

    def forward_logprobs(
        self,
        prompt_ids: list[list[int]],
        response_ids: list[list[int]],
        chunk: int = 1024,
        temperature: float = 1.0,
        shared_prefix: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """``(logp [B, T], mask [B, T])``: log pi(response token t | prompt, response[:t]) for every
        response token, right-padded (``mask`` is 1.0 on real tokens, ``logp`` 0 elsewhere).

        Differentiable. Each distinct prompt is forwarded once, with gradients, and the responses
        attend to its key/value states expanded to their rows (:meth:`_hidden_shared`): a GRPO
        group's prompt costs Lp positions instead of G x Lp, and the prefix all the call's prompts begin
        with is forwarded once (``lm.common_prefix``, :meth:`CausalLM._forward_prompts`). On an FSDP-sharded model
        every call with gradients makes exactly two decoder passes (prompts, then responses), so the ranks
        issue the same collectives whatever their rows. ``shared_prefix=False`` runs the reference instead:
        one pass over [B, Lp + T - 1] (:meth:`_hidden_joint`), also taken while gradient checkpointing is
        active (checkpointed layers drop the cache). All give the same values and gradients up to float
        summation order (tested). The LM head + log-softmax then run on the valid response
        positions only, ``chunk`` positions at a time, so no more than chunk x V logits exist at
        once. With gradients on, a plain ``nn.Linear`` head uses a fused log-prob function
        (:class:`_HeadLogProb`) that keeps a chunk's fp32 logits for backward while the call's kept
        logits stay within ``self.head_keep_bytes`` (3 head matmuls) and recomputes them in backward
        beyond it (4), with the same values either way; any other head (LoRA on ``lm_head``,
        FSDP-sharded) runs a checkpointed chunk. Held for backward: at most ``head_keep_bytes`` plus
        chunk x V. With ``self.lm.autocast`` (``models.I.autocast``) the decoder and head run under ``torch.autocast``
        in that dtype (the fused head on one copy of the weight in it, cast again after the weight changes: :meth:`_compute_copy`)
        and the log-probs stay fp32.
        """
        if len(prompt_ids) != len(response_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("empty prompt: every prompt needs at least one token")
        dev, B = self.lm.device, len(prompt_ids)
        T = max((len(r) for r in response_ids), default=0)
        mask = torch.zeros((B, T), dtype=torch.bool)
        resp = torch.full((B, T), self.lm.pad_token_id, dtype=torch.long)
        for b, r in enumerate(response_ids):
            mask[b, : len(r)] = True
            if r:
                resp[b, : len(r)] = torch.tensor(r, dtype=torch.long)
        if T == 0 or B == 0:
            return torch.zeros((B, T), device=dev), mask.float().to(dev)
        mask, resp = mask.to(dev), resp.to(dev)
        row_of: dict[tuple[int, ...], int] = {}
        inv = [row_of.setdefault(tuple(p), len(row_of)) for p in prompt_ids]
        tied = self._tied_embedding()
        if tied is not None:  # its gradient rows go into the weight.grad the head has filled: no dense [V, H] sum
            tied.sparse = self._accumulates_head_grad()
        with torch.autocast(dev.type, dtype=self.lm.autocast or torch.bfloat16, enabled=self.lm.autocast is not None):
            if shared_prefix and not self._checkpointing():
                hidden = self._hidden_shared([list(k) for k in row_of], inv, resp, mask)
            else:
                hidden = self._hidden_joint(prompt_ids, resp, mask)  # [B, T, H]: row t predicts response token t
            vals = self._head_logprobs(hidden[mask], resp[mask], max(1, int(chunk)), temperature)  # [N, H], [N] -> [N]
        logp = torch.zeros((B, T), dtype=vals.dtype, device=dev).masked_scatter(mask, vals)
        return logp, mask.float()

    def _head_logprobs(self, hv: Tensor, targets: Tensor, chunk: int, temperature: float) -> Tensor:
        """Log-probs [N] of ``targets`` [N] after hidden states ``hv`` [N, H], ``chunk`` rows at a time (see
        :meth:`forward_logprobs`: fused with kept logits up to ``head_keep_bytes``, checkpointed, or no-grad)."""
        assert hv.dim() == 2 and targets.shape == hv.shape[:1], (hv.shape, targets.shape)
        grad = torch.is_grad_enabled()
        head, fused = self.lm._head, self._fused_head()
        parts, kept, V = [], 0, head.weight.shape[0] if fused else 0
        compute = self._compute_copy(head.weight) if grad and fused and self.lm.autocast is not None else None
        accumulate = self._accumulates_head_grad()
        for i in range(0, hv.shape[0], chunk):
            h_c, t_c = hv[i : i + chunk], targets[i : i + chunk]
            if grad and fused:
                keep = kept + 4 * h_c.shape[0] * V <= self.head_keep_bytes  # fp32 [n, V] held until backward
                kept += 4 * h_c.shape[0] * V if keep else 0
                parts.append(
                    _HeadLogProb.apply(h_c, head.weight, head.bias, t_c, self.lm.softcap, temperature, keep, compute, accumulate)
                )
            elif grad:
                parts.append(checkpoint(self._gather_logp, h_c, t_c, temperature, use_reentrant=False))
            else:
                parts.append(self._gather_logp(h_c, t_c, temperature))
        return torch.cat(parts)

    def _fused_head(self) -> bool:
        """The head runs as :class:`_HeadLogProb`: a plain ``nn.Linear``, not LoRA-wrapped, not a DTensor."""
        head = self.lm._head
        return self.fused_head and type(head) is torch.nn.Linear and type(head.weight) in (Tensor, torch.nn.Parameter)

    def _accumulates_head_grad(self) -> bool:
        """Backward adds the head's weight gradient straight into ``weight.grad`` (``_HeadLogProb``'s
        ``accumulate``): gradients on, the fused head on its fp32 leaf weight, ``self.accumulate_head_grad``."""
        w = self.lm._head.weight
        return (
            torch.is_grad_enabled()
            and self.accumulate_head_grad
            and self.lm.autocast is None
            and self._fused_head()
            and w.is_leaf
            and w.requires_grad
        )

    def _tied_embedding(self) -> torch.nn.Embedding | None:
        """The input embedding when it shares its weight with the head (tied), else None."""
        emb = _unwrap(self.lm.model).get_input_embeddings()
        tied = isinstance(emb, torch.nn.Embedding) and emb.max_norm is None and emb.weight is self.lm._head.weight
        return emb if tied else None

    def _compute_copy(self, weight: Tensor) -> Tensor:
        """``weight`` in ``self.lm.autocast``'s dtype, cast again only after the weight changed in place (an optimiser
        step or a loaded checkpoint bumps its version counter), so the micro-batches of one minibatch share a copy."""
        key = (weight.data_ptr(), weight.shape, weight._version)
        if self._compute is None or self._compute[0] != key:
            self._compute = None  # the old copy is freed before the new one is made
            self._compute = (key, weight.detach().to(self.lm.autocast))
        return self._compute[1]

    def _checkpointing(self) -> bool:
        """Gradient checkpointing is active now: it drops the KV cache the shared-prefix pass needs."""
        return self.lm.cfg.gradient_checkpointing and torch.is_grad_enabled() and self.lm.model.training

    def _hidden_joint(self, prompt_ids: list[list[int]], resp: Tensor, mask: Tensor) -> Tensor:
        """Decoder states [B, T, H] predicting the response tokens: one pass over prompt + response
        (prompts left-padded so all responses start in the same column)."""
        dev = resp.device
        ids, attn = self.lm._left_pad(prompt_ids, self.lm.pad_token_id)
        ids, attn = ids.to(dev), attn.to(dev)
        Lp = ids.shape[1]
        ids = torch.cat([ids, resp[:, :-1]], dim=1)  # the last response token is only ever a target
        attn = torch.cat([attn, mask[:, :-1].long()], dim=1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        hidden = self.lm._decoder(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).last_hidden_state
        return hidden[:, Lp - 1 :]

    def _hidden_shared(self, prompts: list[list[int]], inv: list[int], resp: Tensor, mask: Tensor) -> Tensor:
        """Decoder states [B, T, H] predicting the response tokens, each distinct prompt forwarded once.

        The U distinct prompts run through the decoder into a KV cache (:meth:`CausalLM._forward_prompts`: left-padded, or
        the prefix they all begin with once and then their suffixes, where :meth:`CausalLM._common_length` allows, but never on an
        FSDP-sharded model with gradients on, whose ranks must make the same passes whatever their rows); the cache is
        expanded to the B rows (``inv[b]`` = row b's prompt); the responses then run against it with position ids
        continuing each prompt. The gradient reaches the prompt's states through the cache, so it equals the joint
        forward's.
        """
        dev, T = resp.device, resp.shape[1]
        cache = DynamicCache(config=_unwrap(self.lm.model).config)
        uniform = is_sharded(self.lm.model) and torch.is_grad_enabled()
        c = 0 if uniform else self.lm._common_length(prompts, T, cache)
        h_prompt, attn, next_pos = self.lm._forward_prompts(self.lm._decoder, prompts, cache, c)  # [U, H] predicts token 0
        rows = torch.tensor(inv, dtype=torch.long, device=dev)
        first = h_prompt[rows][:, None]  # [B, 1, H]
        cache.batch_select_indices(rows)
        n_in = max(T - 1, 1)  # all responses of one token: one position anyway, so the pass count is the same
        full_attn = torch.cat([attn[rows], mask[:, :n_in].long() if T > 1 else torch.zeros_like(mask[:, :1]).long()], dim=1)
        resp_pos = next_pos[rows, None] + torch.arange(n_in, device=dev)[None]
        h_resp = self.lm._decoder(
            input_ids=resp[:, :n_in],
            attention_mask=full_attn,
            position_ids=resp_pos,
            use_cache=True,
            **{self.lm._cache_kw: cache},
        ).last_hidden_state  # [B, n_in, H]
        return torch.cat([first, h_resp[:, : T - 1]], dim=1)

    @torch.no_grad()
    def token_logprobs(
        self,
        prompt_ids: list[list[int]],
        response_ids: list[list[int]],
        chunk: int = 1024,
        micro_batch: int = 8,
        temperature: float = 1.0,
        progress: bool = False,
    ) -> list[Tensor]:
        """Per-response log-prob vectors ``[N]`` of ``[T_n]`` (CPU fp32), no gradients.

        Sequences are grouped into micro-batches by :func:`scoring_order` (rows of one prompt
        together, so its prefix is forwarded once; then by length, for less padding); the result
        is in input order.
        """
        if len(prompt_ids) != len(response_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
        N = len(response_ids)
        order = scoring_order(prompt_ids, response_ids)
        out: list[Tensor | None] = [None] * N
        mb = max(1, int(micro_batch))
        bar = None
        if progress:
            bar = tqdm(total=N, desc=f"{self.lm.name} logprobs", unit="seq", leave=False)
        try:
            for s in range(0, N, mb):
                idx = order[s : s + mb]
                logp, _ = self.forward_logprobs(
                    [prompt_ids[i] for i in idx], [response_ids[i] for i in idx], chunk=chunk, temperature=temperature
                )
                logp = logp.float().cpu()
                for row, i in enumerate(idx):
                    out[i] = logp[row, : len(response_ids[i])].clone()
                if bar is not None:
                    bar.update(len(idx))
        finally:
            if bar is not None:
                bar.close()
        return cast("list[Tensor]", out)  # every entry is set: ``order`` is a permutation of range(N)
