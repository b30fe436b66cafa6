"""One trainable causal LM and its three jobs: sampling, scoring, optimisation and saving (:class:`Policy`).

:class:`~graft.policy.lm.CausalLM` holds the weights, tokenizer and codec and what the jobs share (log-prob
semantics, prompt passes); the jobs live beside it: :class:`~graft.policy.decoding.DecodeLoop` samples
(``policy.sampler``), :class:`~graft.policy.scoring.Scorer` scores given text (``policy.scorer``), and the
optimiser and saving are here. :meth:`Policy.generate`, :meth:`Policy.forward_logprobs` and
:meth:`Policy.token_logprobs` are the jobs' entry points, as the engines, workers and losses call them.

The model stays in eval mode (dropout off) unless the caller changes it; graft's rollout
and update both run it that way so that the first minibatch has ratio exactly 1.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from graft.config import LoraConfig, ModelConfig
from graft.files import writing
from graft.policy.decoding import DecodeLoop
from graft.policy.lm import CausalLM
from graft.policy.loading import load_model, load_tokenizer, unwrap as _unwrap
from graft.policy.optim import make_adamw
from graft.policy.sampling import SamplingParams
from graft.policy.scoring import Scorer
from graft.types import Sample


class Policy(CausalLM):
    """A causal LM with its tokenizer and prompt template (``cfg``), on ``device``, and its jobs: ``sampler`` and
    ``scorer``."""

    def __init__(self, cfg: ModelConfig, model: Any, tokenizer: Any, device: str | torch.device = "cpu") -> None:
        super().__init__(cfg, model, tokenizer, device)
        self.sampler = DecodeLoop(self)
        """Sampling with log-probs (the KV-cache decode loop)."""
        self.scorer = Scorer(self)
        """Log-probs of given text, with or without gradients."""

    @classmethod
    def load(cls, cfg: ModelConfig, device: str | torch.device = "cpu", weights_from: str | None = None) -> "Policy":
        """Tokenizer and model of ``cfg`` (see :mod:`graft.policy.loading`); ``weights_from``
        is a folder written by :meth:`save` (full model, or the LoRA adapter when ``cfg.lora.enabled``)."""
        tokenizer = load_tokenizer(cfg, weights_from=weights_from)
        model = load_model(cfg, device=device, weights_from=weights_from)
        return cls(cfg, model, tokenizer, device)

    # ------------------------------------------------------------------ the jobs' entry points
    def generate(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        model: Any = None,
        renormalize_top_p: bool = False,
        progress: bool = False,
        desc: str = "",
    ) -> list[list[Sample]]:
        """``params.n`` samples per prompt, ``[P][G]``, with their log-probs: :meth:`DecodeLoop.generate`."""
        return self.sampler.generate(prompt_ids, params, model, renormalize_top_p, progress, desc)

    def forward_logprobs(
        self,
        prompt_ids: list[list[int]],
        response_ids: list[list[int]],
        chunk: int = 1024,
        temperature: float = 1.0,
        shared_prefix: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """``(logp [B, T], mask [B, T])`` of the responses, differentiable: :meth:`Scorer.forward_logprobs`."""
        return self.scorer.forward_logprobs(prompt_ids, response_ids, chunk, temperature, shared_prefix)

    def token_logprobs(
        self,
        prompt_ids: list[list[int]],
        response_ids: list[list[int]],
        chunk: int = 1024,
        micro_batch: int = 8,
        temperature: float = 1.0,
        progress: bool = False,
    ) -> list[Tensor]:
        """Per-response log-probs ``[N]`` of ``[T_n]``, no gradients: :meth:`Scorer.token_logprobs`."""
        return self.scorer.token_logprobs(prompt_ids, response_ids, chunk, micro_batch, temperature, progress)

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
