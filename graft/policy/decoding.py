"""The sampler: the KV-cache decode loop of one policy (:class:`DecodeLoop`), its per-step buffers
(:class:`DecodeBuffers`) and head, and the sampled token's log-prob and entropy.

Log-prob semantics: :mod:`graft.policy.lm`. The loop *samples* from the tempered distribution restricted to the top-p
nucleus (renormalised), but *records* ``logp`` of the sampled token **without** the top-p renormalisation (unless
``renormalize_top_p=True``). With the training defaults (temperature 1, top-p 1) both are the model's own distribution;
with top-p < 1 the recorded value equals what :meth:`graft.policy.scoring.Scorer.forward_logprobs` gives for the same
tokens, so old and new log-probs stay comparable.

Where the sampler's log-probs differ from a forward pass: generation runs incrementally with a KV cache over
left-padded batches (with ``common_prefix``, the prompts' common prefix forwarded once:
:meth:`graft.policy.lm.CausalLM._forward_prompts`), ``forward_logprobs`` runs one pass over response-aligned batches,
so the two differ by float rounding only: < 1e-4 in fp32 (tested), but ~1e-2 per token in bf16.
``update.recompute_old_logprobs`` replaces them with a forward pass when that matters.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from graft.cores import poll
from graft.policy.kvcache import buffered_cache
from graft.policy.lm import CausalLM
from graft.policy.loading import unwrap as _unwrap
from graft.policy.sampling import SamplingParams
from graft.seeds import sample_seed
from graft.types import Sample


def entropy_of(z: Tensor, e: Tensor) -> Tensor:
    """Entropy (nats) [b] of ``softmax(z)`` for max-subtracted logits ``z`` [b, V] and ``e = exp(z)``:
    ``H = log S - sum(e z) / S`` with ``S = sum e``. The dot product runs as one batched matmul, so no
    [b, V] temporary is made; ``e z`` is NaN where ``z = -inf`` (``e = 0``), and only then is the masked
    form computed. Neither input is modified."""
    s = e.sum(dim=-1)
    ez = torch.bmm(e.unsqueeze(1), z.unsqueeze(2)).view(-1)
    if not bool(torch.isfinite(ez).all()):
        ez = torch.where(e > 0, e * z, 0.0).sum(dim=-1)
    return s.log() - ez / s


HEAD_COLUMNS = 16
"""The sampler's fp32 head on CPU is ``W @ x.T`` over a multiple of this many columns (:meth:`DecodeBuffers.logits`)."""


class DecodeBuffers:
    """The sampler's per-step fp32 tensors, allocated once per :meth:`DecodeLoop.generate` call and reused at every
    decoding step: the logits ``z`` [B, V], their transpose as the head's matmul writes it ``zt`` [V, P] (over the
    hidden states zero-padded to P rows, ``x`` [P, H]) and their
    exp ``e`` [B, V] (B: the generation batch; a step with b <= B rows alive uses the first b rows, contiguous).
    Over Gemma-3's 262k vocabulary and 64 rows each is 64 MiB that the allocator would otherwise map and fault in
    afresh every step. Filled by the same kernels as the allocating path (``torch.mm``/``addmm``/``exp`` with
    ``out=``), so every value is bit-identical to it.

    ``entropy``: record the per-token entropy of the sampling distribution (:func:`entropy_of`); off, the
    samples carry ``entropies=None`` and the sampler skips its two passes over [b, V] (the rollout asks for it:
    ``MODEL/entropy/mean`` is logged every step; evaluation, probes and benchmarks read no entropy).
    ``reuse=False`` allocates per step as before (kept for the side-by-side test and benchmark)."""

    def __init__(self, entropy: bool = True, reuse: bool = True) -> None:
        self.entropy, self.reuse = entropy, reuse
        self._z: Tensor | None = None
        self._zt: Tensor | None = None
        self._x: Tensor | None = None
        self._e: Tensor | None = None

    def _rows(self, name: str, b: int, V: int, like: Tensor) -> Tensor:
        buf = getattr(self, name)
        if buf is None or buf.shape[0] < b or buf.shape[1] != V or buf.device != like.device:
            buf = torch.empty((b, V), dtype=torch.float32, device=like.device)
            setattr(self, name, buf)
        return buf[:b]

    def logits(self, head: Any, hidden: Tensor) -> Tensor:
        """``head(hidden).float()`` [b, V] for ``hidden`` [b, H].

        A plain fp32 ``nn.Linear`` head (the only kind whose kernel ``F.linear`` is known: ``mm`` / ``addmm``) with
        no gradient recorded (``out=`` has none) is computed into the reused buffers. On CPU as the transposed product
        ``W @ x.T`` [V, P] copied into [b, V], where ``x`` [P, H] is ``hidden`` with zero rows up to ``P``, the next
        multiple of :data:`HEAD_COLUMNS`: the same dot products, but BLAS streams the [V, H] weight as its row operand
        instead of packing it at every call, and at a column count that fills its vectors. Gemma-3's [262144, 640]
        head: up to 2.3x faster than the kernels it replaced at most row counts, 0.6x at 1 row (AMD EPYC, 2 threads:
        ``benchmarks/results/rollout-head/``). The padding also makes a row's logits independent of how many rows are alive:
        with the exact row count, BLAS takes kernels whose rounding depends on it below 12 rows, and a row's logits
        must not depend on how its batch is split (the Ray backend's per-sample seeds promise the same samples split
        or not). From 12 rows on the padded, exact and untransposed products agreed bit for bit on the AMD host
        measured."""
        assert hidden.dim() == 2, hidden.shape
        w = getattr(head, "weight", None)
        if not (
            not torch.is_grad_enabled()
            and type(head) is torch.nn.Linear
            and isinstance(w, Tensor)
            and type(w) in (Tensor, torch.nn.Parameter)
            and w.dtype == hidden.dtype == torch.float32
        ):
            return head(hidden).float()
        (b, _), V = hidden.shape, w.shape[0]
        if hidden.device.type != "cpu":
            out = self._rows("_z", b, V, hidden) if self.reuse else None
            return torch.mm(hidden, w.t(), out=out) if head.bias is None else torch.addmm(head.bias, hidden, w.t(), out=out)
        x = self._padded(hidden)
        zt = self._flat(V, x.shape[0], hidden)
        zt = torch.mm(w, x.t(), out=zt) if head.bias is None else torch.addmm(head.bias[:, None], w, x.t(), out=zt)
        if not self.reuse:
            return zt[:, :b].t().contiguous()
        return self._rows("_z", b, V, hidden).copy_(zt[:, :b].t())

    def _padded(self, hidden: Tensor) -> Tensor:
        """``hidden`` [b, H] with zero rows up to the next multiple of :data:`HEAD_COLUMNS` [P, H] (itself when b is
        such a multiple), in the reused buffer."""
        b, H = hidden.shape
        P = -(-b // HEAD_COLUMNS) * HEAD_COLUMNS
        if P == b:
            return hidden
        if not self.reuse or self._x is None or self._x.shape[0] < P or self._x.shape[1] != H:
            self._x = torch.empty((P, H), dtype=hidden.dtype, device=hidden.device)
        x = self._x[:P]
        x[:b].copy_(hidden)
        x[b:].zero_()
        return x

    def _flat(self, V: int, b: int, like: Tensor) -> Tensor:
        """A contiguous [V, b] tensor: the first V * b elements of the reused ``zt`` buffer (fresh without ``reuse``)."""
        if not self.reuse:
            return torch.empty((V, b), dtype=torch.float32, device=like.device)
        if self._zt is None or self._zt.numel() < V * b or self._zt.device != like.device:
            self._zt = torch.empty(V * b, dtype=torch.float32, device=like.device)
        return self._zt[: V * b].view(V, b)

    def exp(self, z: Tensor) -> Tensor:
        """``exp(z)`` [b, V] for ``z`` [b, V], into the reused buffer."""
        assert z.dim() == 2, z.shape
        if not self.reuse or z.dtype != torch.float32:
            return torch.exp(z)
        return torch.exp(z, out=self._rows("_e", z.shape[0], z.shape[1], z))


@dataclasses.dataclass(frozen=True)
class _Decoding:
    """What every generation batch of one :meth:`DecodeLoop.generate` call samples with (see there)."""

    max_new_tokens: int
    temperature: float
    top_p: float
    renormalize_top_p: bool
    stop_strings: tuple[str, ...]
    model: Any
    bufs: DecodeBuffers


class _Trace:
    """What one generation batch has sampled so far, per original row [B]: tokens, log-probs, entropies, finished."""

    def __init__(self, B: int) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(B)]
        self.logps: list[list[float]] = [[] for _ in range(B)]
        self.ents: list[list[float]] = [[] for _ in range(B)]
        self.finished = [False] * B

    def samples(self, decode: Callable[[Sequence[int]], str], entropy: bool) -> list[Sample]:
        return [
            Sample(token_ids=t, logprobs=lp, text=decode(t), finished=f, entropies=e if entropy else None)
            for t, lp, e, f in zip(self.tokens, self.logps, self.ents, self.finished, strict=True)
        ]


def _check_prompts(prompt_ids: list[list[int]], seeds: Sequence[int] | None) -> None:
    """The prompts of a call against its settings (:class:`SamplingParams` checks the settings themselves)."""
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("empty prompt: every prompt needs at least one token")
    if seeds is not None and len(seeds) != len(prompt_ids):
        raise ValueError(f"{len(seeds)} seeds for {len(prompt_ids)} prompts")


class DecodeLoop:
    """The sampler of one :class:`~graft.policy.lm.CausalLM` (a policy's ``sampler``): its own batched loop over a KV
    cache (:meth:`generate`)."""

    def __init__(self, lm: CausalLM) -> None:
        self.lm: CausalLM = weakref.proxy(lm)
        """The model sampled from, held weakly: the policy owns its sampler, and no reference cycle keeps a model's
        memory alive after its policy is dropped."""
        self.decode_buffers: bool = True
        """Reuse the per-step [B, V] tensors (:class:`DecodeBuffers`; same values as allocating them)."""

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        model: Any = None,
        renormalize_top_p: bool = False,
        progress: bool = False,
        desc: str = "",
    ) -> list[list[Sample]]:
        """``params.n`` samples for each prompt: result ``[P][G]``.

        Own batched loop with a KV cache: prompts left-padded, position ids counted over real
        tokens, logits only at the last position, temperature + top-p sampling with a
        ``torch.Generator`` seeded by ``params.seed`` (same inputs and seed -> same samples; the
        batch size only changes which random numbers go to which sequence). A sequence stops
        at a stop token (kept in ``token_ids`` with its log-prob, ``finished=True``) or after
        ``max_new_tokens`` (``finished=False``); finished rows leave the batch.

        ``params.stop_strings`` (None: none): a row also leaves the batch once its text contains one of them (it
        keeps ``finished=False`` and every token sampled so far; the rollout engine's
        :func:`graft.policy.prompts.cut_at_stop` does the cutting). This only saves work: with
        per-sample ``seeds`` the cut samples are the same as without it.

        ``params.seeds`` (one per prompt; overrides ``seed``): sample j of prompt i draws its random
        numbers from its own generator seeded by ``seeds.sample_seed(seeds[i], j)``, so it
        does not depend on the batch size, on the other prompts of the call, or on how a batch
        is split across Ray workers (the Ray backend relies on this).

        ``params.entropy``: record each token's entropy (``Sample.entropies``; ``None`` when off, see
        :class:`DecodeBuffers`).

        ``model``: sample from this copy of the policy's model instead (same architecture and
        tokenizer, e.g. a bf16 copy: :class:`graft.policy.engines.HFBf16Engine`); log-probs are then
        that copy's. ``renormalize_top_p``: record the nucleus-renormalised log-prob instead (see the module doc).
        ``progress``: a bar labelled ``desc``.
        """
        p, n = params, params.n
        _check_prompts(prompt_ids, p.seeds)
        bufs = DecodeBuffers(entropy=p.entropy, reuse=self.decode_buffers)
        how = _Decoding(p.max_new_tokens, p.temperature, p.top_p, renormalize_top_p, p.stop_strings or (), model, bufs)
        flat = [list(q) for q in prompt_ids for _ in range(n)]
        gens = self._generators(p.seed, p.seeds, n)
        bar = tqdm(total=len(flat), desc=desc or f"{self.lm.name} generate", unit="seq", leave=False) if progress else None
        try:
            samples = self._generate_rows(flat, gens, p.batch_size, how, bar)
        finally:
            if bar is not None:
                bar.close()
        return [samples[i * n : (i + 1) * n] for i in range(len(prompt_ids))]

    def _generators(self, seed: int, seeds: Sequence[int] | None, n: int) -> torch.Generator | list[torch.Generator]:
        """The call's generator on the device, seeded by ``seed``; with ``seeds``, one CPU generator per sample
        (sample j of prompt i: ``sample_seed(seeds[i], j)``)."""
        if seeds is not None:
            return [torch.Generator().manual_seed(sample_seed(int(s), j)) for s in seeds for j in range(n)]
        gen = torch.Generator(device=self.lm.device)
        gen.manual_seed(int(seed))
        return gen

    def _generate_rows(
        self, prompts: list[list[int]], gens: torch.Generator | list[torch.Generator], batch_size: int, how: _Decoding, bar: Any
    ) -> list[Sample]:
        """One sample per row of ``prompts``, ``batch_size`` rows at a time (``gens``: the call's generator, or one
        per row)."""
        out: list[Sample] = []
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            out += self._generate_batch(
                chunk, gens if isinstance(gens, torch.Generator) else gens[start : start + batch_size], how, bar
            )
            if bar is not None:
                bar.update(len(chunk))
        return out

    def _generate_batch(
        self, prompts: list[list[int]], gen: torch.Generator | list[torch.Generator], how: _Decoding, bar: Any
    ) -> list[Sample]:
        """One generation batch, one row per prompt [B]: prefill (:meth:`_prefill`), then one token per step for
        the rows still in the batch (``gen``: the call's generator, or one per row)."""
        dev, B, bufs = self.lm.device, len(prompts), how.bufs
        base = _unwrap(self.lm.model if how.model is None else how.model)
        decoder, head = base.get_decoder(), base.get_output_embeddings()
        stop = torch.tensor(sorted(self.lm.stop_ids), dtype=torch.long, device=dev)
        trace = _Trace(B)
        alive = torch.arange(B, device=dev)  # original row of each row still in the batch
        if how.max_new_tokens > 0:
            h, attn, next_pos, cache = self._prefill(base, decoder, prompts, how.max_new_tokens)
        for step in range(how.max_new_tokens):
            poll()
            g = gen if isinstance(gen, torch.Generator) else [gen[o] for o in alive.tolist()]  # per-row generators
            logits = self._step_logits(h, how.temperature, head, bufs)
            tok, lp, ent = self._sample(logits, how.top_p, g, how.renormalize_top_p, bufs)
            leave = self._record_step(trace, alive, tok, lp, ent, stop, how.stop_strings)
            if bar is not None and step % 8 == 0:
                bar.set_postfix_str(f"tokens {step + 1}/{how.max_new_tokens}, alive {len(alive)}", refresh=False)
            if step == how.max_new_tokens - 1:
                break
            keep = (~leave).nonzero().squeeze(-1)
            if keep.numel() == 0:
                break
            if keep.numel() < len(alive):  # finished rows leave the batch
                cache.batch_select_indices(keep)
                alive, tok, attn, next_pos = alive[keep], tok[keep], attn[keep], next_pos[keep]
            attn = torch.cat([attn, attn.new_ones((len(alive), 1))], dim=1)
            h = decoder(
                input_ids=tok[:, None],
                attention_mask=attn,
                position_ids=next_pos[:, None],
                use_cache=True,
                **{self.lm._cache_kw: cache},
            ).last_hidden_state[:, -1]
            next_pos = next_pos + 1
        return trace.samples(self.lm.decode, bufs.entropy)

    def _record_step(
        self,
        trace: _Trace,
        alive: Tensor,
        tok: Tensor,
        lp: Tensor,
        ent: Tensor | None,
        stop: Tensor,
        stop_strings: tuple[str, ...],
    ) -> Tensor:
        """Append one step's tokens, log-probs and entropies [b] to the ``trace`` of the rows ``alive`` [b]; returns
        which rows leave the batch [b]: those that sampled a stop token (finished) or whose text holds a stop string."""
        is_stop = torch.isin(tok, stop)
        leave = is_stop.clone()
        # a stop string lies within the last `window` tokens (>= 1 byte per token, <= 4 bytes per char)
        window = 4 * max((len(x) for x in stop_strings), default=0) + 4
        ent_l = ent.tolist() if ent is not None else [0.0] * len(tok)
        for r, (orig, t, logp, e, s) in enumerate(
            zip(alive.tolist(), tok.tolist(), lp.tolist(), ent_l, is_stop.tolist(), strict=True)
        ):
            trace.tokens[orig].append(t)
            trace.logps[orig].append(logp)
            trace.ents[orig].append(e)
            if s:
                trace.finished[orig] = True
            elif stop_strings and any(x in self.lm.decode(trace.tokens[orig][-window:]) for x in stop_strings):
                leave[r] = True
        return leave

    def _prefill(self, base: Any, decoder: Any, prompts: list[list[int]], max_new_tokens: int):
        """Forward each distinct prompt once (:meth:`CausalLM._forward_prompts`; the prefix they all begin with once,
        where :meth:`CausalLM._common_length` allows) and copy its KV cache to its rows. Returns the last hidden state, attention
        mask and next position of every row ``[B]``, and the cache."""
        dev, B = self.lm.device, len(prompts)
        row_of: dict[tuple[int, ...], int] = {}
        inv = [row_of.setdefault(tuple(p), len(row_of)) for p in prompts]
        uniq = [list(k) for k in row_of]
        cache = buffered_cache(base.config, max(len(p) for p in uniq) + max_new_tokens)
        h, attn, next_pos = self.lm._forward_prompts(decoder, uniq, cache, self.lm._common_length(uniq, max_new_tokens, cache))
        if len(uniq) < B:
            expand = torch.tensor(inv, dtype=torch.long, device=dev)
            cache.batch_select_indices(expand)
            h, attn, next_pos = h[expand], attn[expand], next_pos[expand]
        return h, attn, next_pos, cache

    def _step_logits(self, hidden: Tensor, temperature: float, head: Any = None, bufs: DecodeBuffers | None = None) -> Tensor:
        """:meth:`CausalLM._logits` for one decoding step [b, H] -> [b, V] (fp32 whatever ``head``'s dtype), with the
        elementwise work done in place (over Gemma's 262k vocabulary each extra [b, V] temporary costs
        milliseconds per step); into ``bufs``' reused logits buffer when given."""
        assert hidden.dim() == 2, hidden.shape
        head = self.lm._head if head is None else head
        z = head(hidden).float() if bufs is None else bufs.logits(head, hidden)
        if self.lm.softcap:
            z.div_(self.lm.softcap).tanh_().mul_(self.lm.softcap)
        if temperature != 1.0:
            z.div_(temperature)
        return z

    @staticmethod
    def _sample(
        logits: Tensor,
        top_p: float,
        gen: torch.Generator | list[torch.Generator],
        renormalize_top_p: bool,
        bufs: DecodeBuffers | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """One token per row of ``logits`` [b, V] (already / temperature; overwritten), its log-prob and
        the entropy [b] of the sampling distribution (:func:`entropy_of`: full vocabulary, at the sampling
        temperature, before top-p; read off the same logits, it changes no token and no log-prob); the
        entropy is ``None`` when ``bufs`` says it is not wanted. ``exp`` goes into ``bufs``' reused buffer.

        Inverse-CDF sampling (one uniform number per row: ``torch.multinomial`` and a full
        sort cost seconds per step over Gemma's 262k vocabulary on CPU) on the unnormalised
        CDF of ``exp(z - max z)``. Top-p < 1 works on a ``topk`` prefix grown until it holds the
        nucleus, instead of sorting the vocabulary. The recorded log-prob is
        ``log_softmax(logits)[token]`` (the forward-pass value), or the nucleus-renormalised one
        with ``renormalize_top_p``.
        """
        b, V = logits.shape
        z = logits.sub_(logits.amax(dim=-1, keepdim=True))  # [b, V], max 0
        e = torch.exp(z) if bufs is None else bufs.exp(z)
        ent = entropy_of(z, e) if bufs is None or bufs.entropy else None
        if isinstance(gen, torch.Generator):
            u = 1.0 - torch.rand((b, 1), generator=gen, device=logits.device)  # (0, 1]: never picks a 0-prob token
        else:  # one CPU generator per row (``seeds``)
            u = 1.0 - torch.cat([torch.rand((1, 1), generator=g) for g in gen]).to(logits.device)
        lp_renorm = None
        if top_p >= 1.0:
            c = e.cumsum_(dim=-1)
            total = c[:, -1:]
            tok = torch.searchsorted(c, u * total).clamp_(max=V - 1).squeeze(-1)
        else:
            total = e.sum(dim=-1, keepdim=True)
            k = min(V, 256)
            while True:
                vals, idx = torch.topk(z, k, dim=-1)  # descending
                p = vals.exp() / total
                if k == V or bool((p.sum(-1) >= top_p).all()):
                    break
                k = min(V, k * 8)
            p = p.masked_fill((p.cumsum(-1) - p) >= top_p, 0.0)  # smallest prefix with mass >= top_p
            c = p.cumsum(-1)
            j = torch.searchsorted(c, u * c[:, -1:]).clamp_(max=k - 1)
            tok = idx.gather(-1, j).squeeze(-1)
            lp_renorm = (p.gather(-1, j).log() - c[:, -1:].log()).squeeze(-1)
        lp = z.gather(-1, tok[:, None]).squeeze(-1) - total.log().squeeze(-1)
        return tok, (lp_renorm if renormalize_top_p and lp_renorm is not None else lp), ent
