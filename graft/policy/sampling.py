"""How one generate call samples: :class:`SamplingParams`, passed as a unit to every sampler, and the one place it is
read off the config (:func:`rollout_sampling`, :func:`eval_sampling`).

Every sampler takes one: :meth:`graft.policy.policy.Policy.generate`, the rollout engines
(:class:`graft.policy.engines.Sampler`), a :class:`graft.trainer.learner.Learner` over its ranks and the worker
ranks under it, evaluation (:func:`graft.evaluation.evaluate.evaluate`). A call over P prompts returns ``[P][G]``
samples, G = ``n``. What only shows progress (a bar, its label) is not a sampling setting and travels beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from graft.config import EvalConfig, RolloutConfig


@dataclass(frozen=True)
class SamplingParams:
    """The settings that decide what a generate call samples (and what it records); frozen, so one value can be
    handed to every rank and engine. Sequences given for ``seeds`` / ``stop_strings`` are kept as tuples."""

    n: int
    """Samples per prompt (G): a call over P prompts returns ``[P][G]``."""
    max_new_tokens: int
    """Tokens sampled per response at most; a response that reaches it ends unfinished (``Sample.finished=False``).
    0 samples nothing."""
    temperature: float = 1.0
    """The logits are divided by it before sampling; the recorded log-probs are those of the tempered distribution
    (> 0: greedy decoding has no sampling log-probs)."""
    top_p: float = 1.0
    """Nucleus threshold in (0, 1]: sample from the smallest set of most likely tokens holding this much probability.
    ``hf`` records the log-prob over the full vocabulary, as a forward pass gives it (see :mod:`graft.policy.engines`)."""
    batch_size: int = 64
    """Sequences per generation batch (memory): with per-prompt ``seeds`` the samples do not depend on it."""
    seed: int = 0
    """The call's seed, used when ``seeds`` is None: :meth:`~graft.policy.policy.Policy.generate` then samples every
    row from one generator (samples depend on batching); a Learner and ``vllm`` derive per-prompt seeds from it
    (``seeds.prompt_seeds(seed, 0, P)``)."""
    seeds: tuple[int, ...] | None = None
    """One seed per prompt [P]: sample j of prompt i draws from its own generator (``seeds.sample_seed(seeds[i], j)``),
    so it does not depend on the batch size, the other prompts of the call, or how the call is split over ranks."""
    stop_strings: tuple[str, ...] | None = None
    """A response ends at the first of these (the engines cut it there: :meth:`graft.policy.codec.TextCodec.cut`);
    None: the sampler's configured ones (``TextCodec.stops``). The engines resolve None before they sample, so
    :meth:`~graft.policy.policy.Policy.generate` called directly with None ends rows at stop tokens only."""
    entropy: bool = False
    """Also record each token's entropy (``Sample.entropies``) where the backend can (``hf``, ``hf-bf16``); the
    rollout asks for it (``MODEL/entropy/mean``). Off, the sampler skips computing it; no token or log-prob changes."""

    def __post_init__(self) -> None:
        if self.seeds is not None:
            object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        if self.stop_strings is not None:
            object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        _check(self.n >= 1, "n", f"must be >= 1, got {self.n}")
        _check(self.max_new_tokens >= 0, "max_new_tokens", f"must be >= 0, got {self.max_new_tokens}")
        _check(self.temperature > 0, "temperature", "must be > 0 (greedy decoding has no sampling log-probs)")
        _check(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(self.batch_size >= 1, "batch_size", f"must be >= 1 (sequences per generation batch), got {self.batch_size}")


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ValueError(f"sampling {field}: {message}")


def rollout_sampling(rc: RolloutConfig, seeds: Sequence[int] | None = None, entropy: bool = False) -> SamplingParams:
    """The training rollout's settings (``rollout.*``: n, max_new_tokens, temperature, top_p, batch_size), prompt i
    sampling with ``seeds[i]``."""
    return SamplingParams(
        n=rc.n,
        max_new_tokens=rc.max_new_tokens,
        temperature=rc.temperature,
        top_p=rc.top_p,
        batch_size=rc.batch_size,
        seeds=None if seeds is None else tuple(seeds),
        entropy=entropy,
    )


def eval_sampling(ec: EvalConfig, max_new_tokens: int, seed: int = 0, batch_size: int = 64) -> SamplingParams:
    """Evaluation's settings (``eval.*``: n, temperature, top_p; ``eval.max_new_tokens`` when set, else
    ``max_new_tokens``), the evaluation seed ``seed`` (evaluation derives per-prompt seeds from it) and ``batch_size``
    sequences per generation batch."""
    return SamplingParams(
        n=ec.n,
        max_new_tokens=ec.max_new_tokens or max_new_tokens,
        temperature=ec.temperature,
        top_p=ec.top_p,
        batch_size=batch_size,
        seed=seed,
    )
