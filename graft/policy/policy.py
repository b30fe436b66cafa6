"""One trainable causal LM: prompts, sampling with log-probs, chunked log-probs, optimiser, saving.

Log-prob semantics (the same in :meth:`Policy.generate`, :meth:`Policy.forward_logprobs`
and :meth:`Policy.token_logprobs`)::

    logits = lm_head(h).float()                       # fp32 even for a bf16 model
    logits = cap * tanh(logits / cap)                 # when config.final_logit_softcapping is set
    logp   = log_softmax(logits / temperature)        # the full vocabulary

``generate`` *samples* from that distribution restricted to the top-p nucleus (renormalised),
but *records* ``logp`` of the sampled token **without** the top-p renormalisation (unless
``renormalize_top_p=True``). With the training defaults (temperature 1, top-p 1) both are
the model's own distribution; with top-p < 1 the recorded value equals what
``forward_logprobs`` gives for the same tokens, so old and new log-probs stay comparable.

Where the sampler's log-probs differ from a forward pass: generation runs incrementally
with a KV cache over left-padded batches (with ``Policy.common_prefix``, the prompts' common prefix
forwarded once: :meth:`Policy._forward_prompts`), ``forward_logprobs`` runs one pass over
response-aligned batches, so the two differ by float rounding only: < 1e-4 in fp32
(tested), but ~1e-2 per token in bf16. ``update.recompute_old_logprobs`` replaces them
with a forward pass when that matters.

The model stays in eval mode (dropout off) unless the caller changes it; graft's rollout
and update both run it that way so that the first minibatch has ratio exactly 1.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint
from tqdm.auto import tqdm
from transformers import DynamicCache

from graft.config import LoraConfig, ModelConfig
from graft.cores import poll
from graft.files import writing
from graft.policy.codec import TextCodec
from graft.policy.fsdp import is_sharded
from graft.policy.kvcache import attention_span, buffered_cache
from graft.policy.loading import load_model, load_tokenizer, unwrap as _unwrap
from graft.policy.optim import make_adamw
from graft.registry import AUTOCASTS
from graft.seeds import sample_seed
from graft.types import Sample

AUTOCASTS.register("off", None)
AUTOCASTS.register("bfloat16", torch.bfloat16)

HEAD_KEEP_BYTES = 1 << 30
"""Memory bound of :class:`_HeadLogProb`'s kept logits: one :meth:`Policy.forward_logprobs` call (one
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
    """The sampler's per-step fp32 tensors, allocated once per :meth:`Policy.generate` call and reused at every
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
    """What every generation batch of one :meth:`Policy.generate` call samples with (see there)."""

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


def scoring_order(prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[int]:
    """Row order for no-grad scoring in micro-batches: longest prompts first, the rows of one prompt
    together (its prefix is then forwarded once per micro-batch), longest responses first within it."""
    first: dict[tuple[int, ...], int] = {}
    key = [first.setdefault(tuple(p), i) for i, p in enumerate(prompt_ids)]
    return sorted(range(len(prompt_ids)), key=lambda i: (-len(prompt_ids[i]), key[i], -len(response_ids[i])))


def _check_sampling(prompt_ids: list[list[int]], temperature: float, top_p: float, seeds: Sequence[int] | None) -> None:
    if temperature <= 0:
        raise ValueError("temperature must be > 0 (greedy decoding has no sampling log-probs)")
    if not 0 < top_p <= 1:
        raise ValueError("top_p must be in (0, 1]")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("empty prompt: every prompt needs at least one token")
    if seeds is not None and len(seeds) != len(prompt_ids):
        raise ValueError(f"{len(seeds)} seeds for {len(prompt_ids)} prompts")


class Policy:
    """A causal LM with its tokenizer and prompt template (``cfg``), on ``device``."""

    def __init__(self, cfg: ModelConfig, model: Any, tokenizer: Any, device: str | torch.device = "cpu") -> None:
        self.name = cfg.name
        self.cfg = cfg
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        base = _unwrap(model)
        text_cfg = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
        self.softcap: float | None = getattr(text_cfg, "final_logit_softcapping", None) or None
        self.fused_head: bool = True
        """Use the fused head log-prob backward (:class:`_HeadLogProb`) when the head is a plain Linear."""
        self.accumulate_head_grad: bool = True
        """The fused head adds its weight gradient into ``weight.grad`` in the matmul (:meth:`_accumulates_head_grad`)
        and a tied input embedding's backward then adds only the rows of its tokens (a sparse gradient) into it:
        no [V, H] gradient is allocated, summed and added per micro-batch. The same sum up to float rounding."""
        self.decode_buffers: bool = True
        """The sampler reuses its per-step [B, V] tensors (:class:`DecodeBuffers`; same values as allocating them)."""
        self.head_keep_bytes: int = HEAD_KEEP_BYTES
        """The fused head keeps a chunk's forward logits for backward (3 head matmuls instead of 4, same values)
        while one :meth:`forward_logprobs` call's kept logits stay within this many bytes (:data:`HEAD_KEEP_BYTES`)."""
        self.autocast: torch.dtype | None = AUTOCASTS[cfg.autocast]
        """The log-prob forwards' compute dtype under ``torch.autocast`` (``models.I.autocast``), or None: the weights'."""
        self._compute: tuple[tuple, Tensor] | None = None
        """The fused head's weight in ``autocast``'s dtype and the weight version it was cast from (:meth:`_compute_copy`)."""
        self.common_prefix: bool = cfg.common_prefix
        """Prefill and the update forward the tokens all prompts of a call begin with once (:meth:`_common_length`;
        ``models.I.common_prefix``; same values up to float rounding)."""
        self.codec = TextCodec(cfg, tokenizer)
        """Template, tokenizer and stop strings (the text side, shared with weight-less processes)."""
        self.eos_token_id: int = self.codec.eos_token_id
        self.pad_token_id: int = self.codec.pad_token_id
        stop = {tokenizer.eos_token_id}
        gen_eos = getattr(getattr(base, "generation_config", None), "eos_token_id", None)
        stop |= set(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
        self.stop_ids: set[int] = {int(i) for i in stop if i is not None}
        """Token ids that end a sampled response (tokenizer EOS + generation_config EOS ids)."""
        self.codec.stop_ids = self.stop_ids
        params = inspect.signature(self._decoder.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers >= 5.x renamed it

    # The decoder stack and LM head are looked up on every use, so that replacing or wrapping
    # ``self.model`` later (a new adapter, FSDP) is picked up.
    @property
    def _decoder(self) -> Any:
        return _unwrap(self.model).get_decoder()

    @property
    def _head(self) -> Any:
        return _unwrap(self.model).get_output_embeddings()

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, cfg: ModelConfig, device: str | torch.device = "cpu", weights_from: str | None = None) -> "Policy":
        """Tokenizer and model of ``cfg`` (see :mod:`graft.policy.loading`); ``weights_from``
        is a folder written by :meth:`save` (full model, or the LoRA adapter when ``cfg.lora.enabled``)."""
        tokenizer = load_tokenizer(cfg, weights_from=weights_from)
        model = load_model(cfg, device=device, weights_from=weights_from)
        return cls(cfg, model, tokenizer, device)

    # ------------------------------------------------------------------ text <-> tokens (the codec's)
    def decode(self, ids: Sequence[int]) -> str:
        return self.codec.decode(ids)

    # ------------------------------------------------------------------ logits
    def _logits(self, hidden: Tensor, temperature: float) -> Tensor:
        """fp32 logits / temperature for hidden states [..., H] (softcapping applied)."""
        logits = self._head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        if temperature != 1.0:
            logits = logits / temperature
        return logits

    def _gather_logp(self, hidden: Tensor, targets: Tensor, temperature: float) -> Tensor:
        """log-softmax(logits)[target] for rows of ``hidden`` [n, H]; materialises n x V once."""
        logits = self._logits(hidden, temperature)
        picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        if torch.is_grad_enabled():
            return picked - torch.logsumexp(logits, dim=-1)
        # no autograd: logsumexp in place, so only one n x V buffer exists
        m = logits.amax(dim=-1, keepdim=True)
        return picked - (logits.sub_(m).exp_().sum(dim=-1).log_() + m.squeeze(-1))

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        batch_size: int = 64,
        seed: int = 0,
        progress: bool = False,
        desc: str = "",
        renormalize_top_p: bool = False,
        seeds: Sequence[int] | None = None,
        stop_strings: Sequence[str] = (),
        model: Any = None,
        entropy: bool = True,
    ) -> list[list[Sample]]:
        """``n`` samples for each prompt: result ``[P][G]``.

        Own batched loop with a KV cache: prompts left-padded, position ids counted over real
        tokens, logits only at the last position, temperature + top-p sampling with a
        ``torch.Generator`` seeded by ``seed`` (same inputs and seed -> same samples; the
        batch size only changes which random numbers go to which sequence). A sequence stops
        at a stop token (kept in ``token_ids`` with its log-prob, ``finished=True``) or after
        ``max_new_tokens`` (``finished=False``); finished rows leave the batch.

        ``stop_strings``: a row also leaves the batch once its text contains one of them (it
        keeps ``finished=False`` and every token sampled so far; the rollout engine's
        :func:`graft.policy.prompts.cut_at_stop` does the cutting). This only saves work: with
        per-sample ``seeds`` the cut samples are the same as without it.

        ``seeds`` (one per prompt; overrides ``seed``): sample j of prompt i draws its random
        numbers from its own generator seeded by ``seeds.sample_seed(seeds[i], j)``, so it
        does not depend on the batch size, on the other prompts of the call, or on how a batch
        is split across Ray workers (the Ray backend relies on this).

        ``model``: sample from this copy of the policy's model instead (same architecture and
        tokenizer, e.g. a bf16 copy: :class:`graft.policy.engines.HFBf16Engine`); log-probs are then
        that copy's.

        ``entropy``: record each token's entropy (``Sample.entropies``; ``None`` when off, see :class:`DecodeBuffers`).
        """
        _check_sampling(prompt_ids, temperature, top_p, seeds)
        bufs = DecodeBuffers(entropy=entropy, reuse=self.decode_buffers)
        how = _Decoding(max_new_tokens, temperature, top_p, renormalize_top_p, tuple(stop_strings), model, bufs)
        flat = [list(p) for p in prompt_ids for _ in range(n)]
        gens = self._generators(seed, seeds, n)
        bar = tqdm(total=len(flat), desc=desc or f"{self.name} generate", unit="seq", leave=False) if progress else None
        try:
            samples = self._generate_rows(flat, gens, max(1, batch_size), how, bar)
        finally:
            if bar is not None:
                bar.close()
        return [samples[i * n : (i + 1) * n] for i in range(len(prompt_ids))]

    def _generators(self, seed: int, seeds: Sequence[int] | None, n: int) -> torch.Generator | list[torch.Generator]:
        """The call's generator on the device, seeded by ``seed``; with ``seeds``, one CPU generator per sample
        (sample j of prompt i: ``sample_seed(seeds[i], j)``)."""
        if seeds is not None:
            return [torch.Generator().manual_seed(sample_seed(int(s), j)) for s in seeds for j in range(n)]
        gen = torch.Generator(device=self.device)
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
        dev, B, bufs = self.device, len(prompts), how.bufs
        base = _unwrap(self.model if how.model is None else how.model)
        decoder, head = base.get_decoder(), base.get_output_embeddings()
        stop = torch.tensor(sorted(self.stop_ids), dtype=torch.long, device=dev)
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
                **{self._cache_kw: cache},
            ).last_hidden_state[:, -1]
            next_pos = next_pos + 1
        return trace.samples(self.decode, bufs.entropy)

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
            elif stop_strings and any(x in self.decode(trace.tokens[orig][-window:]) for x in stop_strings):
                leave[r] = True
        return leave

    def _prefill(self, base: Any, decoder: Any, prompts: list[list[int]], max_new_tokens: int):
        """Forward each distinct prompt once (:meth:`_forward_prompts`; the prefix they all begin with once, where
        :meth:`_common_length` allows) and copy its KV cache to its rows. Returns the last hidden state, attention
        mask and next position of every row ``[B]``, and the cache."""
        dev, B = self.device, len(prompts)
        row_of: dict[tuple[int, ...], int] = {}
        inv = [row_of.setdefault(tuple(p), len(row_of)) for p in prompts]
        uniq = [list(k) for k in row_of]
        cache = buffered_cache(base.config, max(len(p) for p in uniq) + max_new_tokens)
        h, attn, next_pos = self._forward_prompts(decoder, uniq, cache, self._common_length(uniq, max_new_tokens, cache))
        if len(uniq) < B:
            expand = torch.tensor(inv, dtype=torch.long, device=dev)
            cache.batch_select_indices(expand)
            h, attn, next_pos = h[expand], attn[expand], next_pos[expand]
        return h, attn, next_pos, cache

    def _common_length(self, prompts: list[list[int]], extra: int, cache: Any) -> int:
        """How many tokens :meth:`_forward_prompts` forwards once for the distinct ``prompts`` [U]: the prefix they all
        begin with, at most the shortest prompt less one token (every row keeps a suffix to forward).

        0 (one left-padded pass, as without the switch) when ``self.common_prefix`` is off, for a single prompt (nothing
        to share), without a common token, or when a layer of ``cache`` attends to a window shorter than the longest
        prompt plus the ``extra`` positions forwarded after it (new tokens, responses): the padding between prefix and
        suffix would then shift what that sliding window sees (:func:`~graft.policy.kvcache.attention_span`)."""
        if not self.common_prefix or len(prompts) < 2 or max(len(p) for p in prompts) + extra > attention_span(cache):
            return 0
        c = 0
        for column in zip(*prompts, strict=False):  # up to the shortest prompt
            if len(set(column)) > 1:
                break
            c += 1
        return min(c, min(len(p) for p in prompts) - 1)

    def _forward_prompts(self, decoder: Any, prompts: list[list[int]], cache: Any, c: int) -> tuple[Tensor, Tensor, Tensor]:
        """The distinct ``prompts`` [U] through ``decoder`` into ``cache``: ``(h [U, H], attn [U, L], next_pos [U])``,
        the state at each prompt's last token, the attention mask of the L cached columns and the next position.

        ``c = 0``: one pass over the left-padded prompts (row: [padding][prompt]). ``c > 0`` (:meth:`_common_length`):
        the c tokens every prompt begins with run once, as one row [1, c]; their cache is expanded to the U rows and
        the suffixes run against it (row: [prefix][padding][suffix], mask 0 on the padding, positions counting real
        tokens only). Each real token sees the same keys, values and positions in both layouts (of the same length
        L), so the states agree up to float rounding; a gradient reaches the prefix through the cache."""
        dev, U = self.device, len(prompts)
        ids, attn = self._left_pad([p[c:] for p in prompts], self.pad_token_id)
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0) + c
        if c:
            prefix = torch.tensor([prompts[0][:c]], dtype=torch.long, device=dev)
            decoder(
                input_ids=prefix,
                attention_mask=torch.ones_like(prefix),
                position_ids=torch.arange(c, device=dev)[None],
                use_cache=True,
                **{self._cache_kw: cache},
            )
            cache.batch_select_indices(torch.zeros(U, dtype=torch.long, device=dev))
            attn = torch.cat([attn.new_ones((U, c)), attn], dim=1)
        h = decoder(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, **{self._cache_kw: cache}
        ).last_hidden_state[:, -1]
        return h, attn, pos[:, -1] + 1

    def _step_logits(self, hidden: Tensor, temperature: float, head: Any = None, bufs: DecodeBuffers | None = None) -> Tensor:
        """:meth:`_logits` for one decoding step [b, H] -> [b, V] (fp32 whatever ``head``'s dtype), with the
        elementwise work done in place (over Gemma's 262k vocabulary each extra [b, V] temporary costs
        milliseconds per step); into ``bufs``' reused logits buffer when given."""
        assert hidden.dim() == 2, hidden.shape
        head = self._head if head is None else head
        z = head(hidden).float() if bufs is None else bufs.logits(head, hidden)
        if self.softcap:
            z.div_(self.softcap).tanh_().mul_(self.softcap)
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

    # ------------------------------------------------------------------ log-probs of given text
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
        with is forwarded once (``self.common_prefix``, :meth:`_forward_prompts`). On an FSDP-sharded model
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
        chunk x V. With ``self.autocast`` (``models.I.autocast``) the decoder and head run under ``torch.autocast``
        in that dtype (the fused head on one copy of the weight in it, cast again after the weight changes: :meth:`_compute_copy`)
        and the log-probs stay fp32.
        """
        if len(prompt_ids) != len(response_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("empty prompt: every prompt needs at least one token")
        dev, B = self.device, len(prompt_ids)
        T = max((len(r) for r in response_ids), default=0)
        mask = torch.zeros((B, T), dtype=torch.bool)
        resp = torch.full((B, T), self.pad_token_id, dtype=torch.long)
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
        with torch.autocast(dev.type, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
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
        head, fused = self._head, self._fused_head()
        parts, kept, V = [], 0, head.weight.shape[0] if fused else 0
        compute = self._compute_copy(head.weight) if grad and fused and self.autocast is not None else None
        accumulate = self._accumulates_head_grad()
        for i in range(0, hv.shape[0], chunk):
            h_c, t_c = hv[i : i + chunk], targets[i : i + chunk]
            if grad and fused:
                keep = kept + 4 * h_c.shape[0] * V <= self.head_keep_bytes  # fp32 [n, V] held until backward
                kept += 4 * h_c.shape[0] * V if keep else 0
                parts.append(
                    _HeadLogProb.apply(h_c, head.weight, head.bias, t_c, self.softcap, temperature, keep, compute, accumulate)
                )
            elif grad:
                parts.append(checkpoint(self._gather_logp, h_c, t_c, temperature, use_reentrant=False))
            else:
                parts.append(self._gather_logp(h_c, t_c, temperature))
        return torch.cat(parts)

    def _fused_head(self) -> bool:
        """The head runs as :class:`_HeadLogProb`: a plain ``nn.Linear``, not LoRA-wrapped, not a DTensor."""
        head = self._head
        return self.fused_head and type(head) is torch.nn.Linear and type(head.weight) in (Tensor, torch.nn.Parameter)

    def _accumulates_head_grad(self) -> bool:
        """Backward adds the head's weight gradient straight into ``weight.grad`` (``_HeadLogProb``'s
        ``accumulate``): gradients on, the fused head on its fp32 leaf weight, ``self.accumulate_head_grad``."""
        w = self._head.weight
        return (
            torch.is_grad_enabled()
            and self.accumulate_head_grad
            and self.autocast is None
            and self._fused_head()
            and w.is_leaf
            and w.requires_grad
        )

    def _tied_embedding(self) -> torch.nn.Embedding | None:
        """The input embedding when it shares its weight with the head (tied), else None."""
        emb = _unwrap(self.model).get_input_embeddings()
        tied = isinstance(emb, torch.nn.Embedding) and emb.max_norm is None and emb.weight is self._head.weight
        return emb if tied else None

    def _compute_copy(self, weight: Tensor) -> Tensor:
        """``weight`` in ``self.autocast``'s dtype, cast again only after the weight changed in place (an optimiser
        step or a loaded checkpoint bumps its version counter), so the micro-batches of one minibatch share a copy."""
        key = (weight.data_ptr(), weight.shape, weight._version)
        if self._compute is None or self._compute[0] != key:
            self._compute = None  # the old copy is freed before the new one is made
            self._compute = (key, weight.detach().to(self.autocast))
        return self._compute[1]

    def _checkpointing(self) -> bool:
        """Gradient checkpointing is active now: it drops the KV cache the shared-prefix pass needs."""
        return self.cfg.gradient_checkpointing and torch.is_grad_enabled() and self.model.training

    @staticmethod
    def _left_pad(seqs: list[list[int]], pad: int) -> tuple[Tensor, Tensor]:
        """``(ids [n, L], attention [n, L])`` of ``seqs`` left-padded to the longest."""
        L = max(len(x) for x in seqs)
        ids = torch.full((len(seqs), L), pad, dtype=torch.long)
        attn = torch.zeros((len(seqs), L), dtype=torch.long)
        for b, x in enumerate(seqs):
            ids[b, L - len(x) :] = torch.tensor(x, dtype=torch.long)
            attn[b, L - len(x) :] = 1
        return ids, attn

    def _hidden_joint(self, prompt_ids: list[list[int]], resp: Tensor, mask: Tensor) -> Tensor:
        """Decoder states [B, T, H] predicting the response tokens: one pass over prompt + response
        (prompts left-padded so all responses start in the same column)."""
        dev = resp.device
        ids, attn = self._left_pad(prompt_ids, self.pad_token_id)
        ids, attn = ids.to(dev), attn.to(dev)
        Lp = ids.shape[1]
        ids = torch.cat([ids, resp[:, :-1]], dim=1)  # the last response token is only ever a target
        attn = torch.cat([attn, mask[:, :-1].long()], dim=1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        hidden = self._decoder(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).last_hidden_state
        return hidden[:, Lp - 1 :]

    def _hidden_shared(self, prompts: list[list[int]], inv: list[int], resp: Tensor, mask: Tensor) -> Tensor:
        """Decoder states [B, T, H] predicting the response tokens, each distinct prompt forwarded once.

        The U distinct prompts run through the decoder into a KV cache (:meth:`_forward_prompts`: left-padded, or the
        prefix they all begin with once and then their suffixes, where :meth:`_common_length` allows, but never on an
        FSDP-sharded model with gradients on, whose ranks must make the same passes whatever their rows); the cache is
        expanded to the B rows (``inv[b]`` = row b's prompt); the responses then run against it with position ids
        continuing each prompt. The gradient reaches the prompt's states through the cache, so it equals the joint
        forward's.
        """
        dev, T = resp.device, resp.shape[1]
        cache = DynamicCache(config=_unwrap(self.model).config)
        uniform = is_sharded(self.model) and torch.is_grad_enabled()
        c = 0 if uniform else self._common_length(prompts, T, cache)
        h_prompt, attn, next_pos = self._forward_prompts(self._decoder, prompts, cache, c)  # [U, H] predicts token 0
        rows = torch.tensor(inv, dtype=torch.long, device=dev)
        first = h_prompt[rows][:, None]  # [B, 1, H]
        cache.batch_select_indices(rows)
        n_in = max(T - 1, 1)  # all responses of one token: one position anyway, so the pass count is the same
        full_attn = torch.cat([attn[rows], mask[:, :n_in].long() if T > 1 else torch.zeros_like(mask[:, :1]).long()], dim=1)
        resp_pos = next_pos[rows, None] + torch.arange(n_in, device=dev)[None]
        h_resp = self._decoder(
            input_ids=resp[:, :n_in], attention_mask=full_attn, position_ids=resp_pos, use_cache=True, **{self._cache_kw: cache}
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
            bar = tqdm(total=N, desc=f"{self.name} logprobs", unit="seq", leave=False)
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

    # ------------------------------------------------------------------ training helpers
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def make_optimizer(self) -> torch.optim.Optimizer:
        """AdamW over the trainable parameters (all weights, or only the LoRA adapter), without parameter-sized
        temporaries (:func:`graft.policy.optim.make_adamw`)."""
        params = self.trainable_parameters()
        if not params:
            raise ValueError(f"model {self.name} has no trainable parameters")
        beta1, beta2 = self.cfg.betas
        return make_adamw(params, lr=self.cfg.lr, betas=(beta1, beta2), weight_decay=self.cfg.weight_decay)

    def save(self, path: str | Path) -> None:
        """Write the model (or only its LoRA adapter) as safetensors, plus the tokenizer, to ``path``.

        The folder loads with ``AutoModelForCausalLM.from_pretrained`` (full model) or
        ``PeftModel.from_pretrained(base, path)`` (adapter), and with ``Policy.load(cfg, weights_from=path)``.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        with writing(path / self.weights_file):
            self.model.save_pretrained(str(path))
        with writing(path / "tokenizer.json"):
            self.tokenizer.save_pretrained(str(path))

    @property
    def weights_file(self) -> str:
        """The safetensors file :meth:`save` writes (a full disk there is named after it)."""
        return "adapter_model.safetensors" if self.cfg.lora.enabled else "model.safetensors"

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in (self.trainable_parameters() if trainable_only else self.model.parameters()))

    def __repr__(self) -> str:
        return (
            f"Policy({self.name!r}, {type(_unwrap(self.model)).__name__}, "
            f"{self.num_parameters() / 1e6:.1f}M params, vocab {len(self.tokenizer)}, {self.device})"
        )


def reference_policy(cfg: ModelConfig, device: str | torch.device = "cpu") -> Policy:
    """A frozen copy of ``cfg``'s starting weights (``cfg.path``; with LoRA, the base model without an adapter),
    in eval mode: the reference of the KL penalty (``models.I.kl_coef``)."""
    ref = Policy.load(dataclasses.replace(cfg, lora=LoraConfig(), gradient_checkpointing=False), device=device)
    ref.model.requires_grad_(False)
    return ref
