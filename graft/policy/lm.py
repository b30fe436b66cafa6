"""One causal LM and what its sampler and its scorer share: the weights, the tokenizer and codec, the decoder stack and
head, the log-prob semantics and the prompt passes (:class:`CausalLM`).

Log-prob semantics (the same in :meth:`graft.policy.decoding.DecodeLoop.generate`,
:meth:`graft.policy.scoring.Scorer.forward_logprobs` and :meth:`~graft.policy.scoring.Scorer.token_logprobs`)::

    logits = lm_head(h).float()                       # fp32 even for a bf16 model
    logits = cap * tanh(logits / cap)                 # when config.final_logit_softcapping is set
    logp   = log_softmax(logits / temperature)        # the full vocabulary

The prompts of a call are forwarded once per distinct prompt, left-padded (:meth:`CausalLM._forward_prompts`), or
with the tokens they all begin with forwarded once (``common_prefix``): the sampler's prefill and the scorer's
shared-prefix pass both run it.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch
from torch import Tensor

from graft.config import ModelConfig
from graft.policy.codec import TextCodec
from graft.policy.kvcache import attention_span
from graft.policy.loading import unwrap as _unwrap
from graft.registry import AUTOCASTS

AUTOCASTS.register("off", None)
AUTOCASTS.register("bfloat16", torch.bfloat16)


class CausalLM:
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
        self.autocast: torch.dtype | None = AUTOCASTS[cfg.autocast]
        """The log-prob forwards' compute dtype under ``torch.autocast`` (``models.I.autocast``), or None: the weights'."""
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

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (the codec's)."""
        return self.codec.decode(ids)

    def _logits(self, hidden: Tensor, temperature: float) -> Tensor:
        """fp32 logits / temperature for hidden states [..., H] (softcapping applied): the module doc's semantics."""
        logits = self._head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        if temperature != 1.0:
            logits = logits / temperature
        return logits

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
