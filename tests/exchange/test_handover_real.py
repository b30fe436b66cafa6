"""hand_over with real (tiny) policies: a receiver identical to the source scores s = 1.

Both sides load the same weights and tokenizer, so the receiver's behaviour policy *is* the
source's sampler: the mean per-token log-likelihoods agree and s = exp(0) = 1, and the peer
group's old log-probs equal the source's generation log-probs — at any rollout temperature,
provided the receiver scores at that temperature (at T = 1 against a T = 0.7 sampler they
would not).

A random model often samples token sequences that are not the tokenizer's canonical encoding
of their own text (re-encoding gives other ids, hence another likelihood), so the check is
made on the responses that round-trip, and the test requires there to be some.
"""
from __future__ import annotations

import pytest
import torch

from graft.config import ModelConfig, RolloutConfig
from graft.config import ExchangeConfig
from graft.exchange.handover import Scoring, hand_over
from graft.trainer.learner import Learner
from graft.types import Prompt

PROMPTS = [Prompt("p0", "What is 3 + 4?", "7"), Prompt("p1", "What is 9 - 2?", "7")]


@pytest.fixture(scope="module")
def twins(tiny_llama_dir):
    return (Learner.local(ModelConfig(name="A", path=tiny_llama_dir, template="plain")),
            Learner.local(ModelConfig(name="B", path=tiny_llama_dir, template="plain")))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_identical_receiver_gives_unit_compatibility(twins, temperature):
    src, recv = twins
    rc = RolloutConfig(n=3, max_new_tokens=8, temperature=temperature, batch_size=8)
    groups, _ = src.rollout(PROMPTS, rc, step=1, seed=5)
    for g in groups:
        g.rewards, g.advantages = [1.0, 0.0, 0.0], [1.1547, -0.5774, -0.5774]
    ho = hand_over(groups, recv, ExchangeConfig(delta=0.0), Scoring(temperature=temperature, chunk=4, micro_batch=2), threshold=0.5)
    peer, audit = ho.groups, ho.rows

    assert len(audit) == 6 and len(peer) == 2
    assert all(a["weight"] == pytest.approx(min(a["s"], 1.0)) for a in audit)
    checked = 0
    for g, p in zip(groups, peer):
        assert p.holder == "B" and p.source == "A" and p.advantages == g.advantages   # frozen source advantages
        for i in range(g.size):
            if p.token_ids[i] != g.gen_token_ids[i]:
                continue   # non-canonical sample: a different token sequence for the same text
            checked += 1
            assert audit[3 * int(g.prompt_id[1]) + i]["s"] == pytest.approx(1.0, abs=1e-4)
            assert torch.allclose(torch.tensor(p.old_logprobs[i]), torch.tensor(g.gen_logprobs[i]), atol=1e-4)
    assert checked >= 2


def test_scoring_at_another_temperature_breaks_unit_compatibility(twins):
    """The check above can fail: a receiver scoring at T = 1 a T = 0.5 sample disagrees."""
    src, recv = twins
    groups, _ = src.rollout(PROMPTS, RolloutConfig(n=3, max_new_tokens=8, temperature=0.5, batch_size=8), step=1, seed=5)
    for g in groups:
        g.rewards, g.advantages = [1.0, 0.0, 0.0], [1.1547, -0.5774, -0.5774]
    ho = hand_over(groups, recv, ExchangeConfig(delta=0.0), Scoring(temperature=1.0), threshold=0.5)
    peer, audit = ho.groups, ho.rows
    same = [a["s"] for g, p in zip(groups, peer) for i, a in zip(range(g.size), audit[3 * int(g.prompt_id[1]):])
            if p.token_ids[i] == g.gen_token_ids[i]]
    assert same and max(abs(v - 1) for v in same) > 1e-2
