"""Shared builders for the storage tests: hand-made RolloutGroups and a tiny HF model."""
from __future__ import annotations

import random

import pytest

from graft.types import RolloutGroup


def make_group(source: str, prompt_id: str, rewards: list[float], step: int = 0, holder: str | None = None,
               seed: int = 0) -> RolloutGroup:
    """A scored group of G=len(rewards) responses with varied token lengths."""
    rng = random.Random(f"{source}-{prompt_id}-{step}-{seed}")
    G = len(rewards)
    toks = [[rng.randrange(1, 60) for _ in range(rng.randrange(1, 6))] for _ in range(G)]
    lps = [[-rng.random() * 3 for _ in t] for t in toks]
    mean = sum(rewards) / G
    return RolloutGroup(
        prompt_id=prompt_id, problem=f"What is {prompt_id}?", answer="42", source=source, holder=holder or source,
        prompt_text=f"<{source}> Problem: What is {prompt_id}?\nSolution:", prompt_token_ids=[1, 2, 3],
        responses=[f"resp {source} {prompt_id} {g} \\boxed{{{g}}}" for g in range(G)],
        token_ids=toks, old_logprobs=lps, gen_token_ids=toks, gen_logprobs=lps, finished=[g % 2 == 0 for g in range(G)],
        rewards=list(rewards), status=["ok" if g else "no_answer" for g in range(G)],
        advantages=[r - mean for r in rewards], weights=[1.0] * G, compat=[1.0] * G, step=step,
    )


@pytest.fixture
def group_factory():
    return make_group


@pytest.fixture(scope="session")
def tiny_model():
    """A 1-layer Llama with a 64-token vocabulary (random weights, seeded)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=32, max_position_embeddings=64)
    return LlamaForCausalLM(cfg)
