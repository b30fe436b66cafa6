"""``rollout.*``: sampling of the training rollouts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from graft.config.checks import check, check_choices
from graft.registry import ENGINES


@dataclass
class RolloutConfig:
    n: int = 8
    """Samples per prompt per model (the group size G)."""
    max_new_tokens: int = 2048
    """Response length limit in tokens; longer responses are truncated and marked so."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling threshold of training rollouts."""
    batch_size: int = 64
    """Sequences per generation call (memory knob; results do not depend on it except through RNG order)."""
    engine: Annotated[str, ENGINES] = "hf"
    """Generation backend: graft's own sampler over transformers models (``hf``, CPU/GPU), the same over a
    bfloat16 copy of the weights (``hf-bf16``: faster on CPU; needs ``update.recompute_old_logprobs=true``),
    transformers' continuous batching (``hf-cb``) or vLLM (GPU, when installed); see ``graft/policy/engines.py``."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (verl's ``algorithm.filter_groups``): a group that carries no gradient for a model
    (every advantage 0 after the exchange: its rewards all equal, and no peer group replaced it) is dropped for that
    model, and further rounds sample the data's next batches of prompts (rollout, scoring and exchange, with seeds of
    their own) until every model keeps ``batch_prompts`` prompts or ``max_rounds`` rounds ran. Each model keeps its
    own prompts, in the order drawn; a prompt the step already drew is not sampled again. The reward metrics stay
    the first round's; ``M/dynamic/...`` say what the rounds did (docs/concepts.md, Dynamic sampling)."""
    max_rounds: int = 3
    """With ``dynamic_sampling``: at most this many sampling rounds per step, the first included (verl's
    ``max_num_gen_batches``); a step whose rounds run out trains on the groups it kept, a model that kept none takes
    no update that step (``M/update/skipped_empty``)."""

    def __post_init__(self) -> None:
        check_choices(self)
        check(self.n >= 2, "n", f"must be >= 2: GRPO normalises inside a group, got {self.n}")
        check(
            self.max_new_tokens > 0,
            "max_new_tokens",
            f"must be > 0, got {self.max_new_tokens} (an empty response cannot be trained on)",
        )
        check(self.temperature > 0, "temperature", "must be > 0 (log-probs of greedy decoding are not a sampling distribution)")
        check(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        check(self.batch_size >= 1, "batch_size", f"must be >= 1 (sequences per generation call), got {self.batch_size}")
        check(self.max_rounds >= 1, "max_rounds", f"must be >= 1, got {self.max_rounds}")
