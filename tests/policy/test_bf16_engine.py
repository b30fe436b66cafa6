"""``rollout.engine=hf-bf16``: graft's sampler over a bfloat16 copy of the weights.

What is pinned: its log-probs stay within a stated distance of the fp32 forward (and are not
simply the fp32 ones, so the copy really is bf16); the copy follows the trainer's weights after
every update; samples depend only on the seeds; with ``update.recompute_old_logprobs`` the
behaviour log-probs are the fp32 forward's, so a receiver identical to its source scores s = 1
exactly as with the fp32 sampler, and without the recompute it would not.
"""
from __future__ import annotations

import pytest
import torch

from graft.config import ExchangeConfig, ModelConfig, RolloutConfig, UpdateConfig
from graft.exchange.handover import Scoring, hand_over
from graft.policy.engines import make_engine
from graft.policy.policy import Policy
from graft.policy.sampling import SamplingParams
from graft.trainer import loop
from graft.trainer.learner import Learner
from graft.types import Prompt
from tests.trainer.helpers import crafted_rewards, tiny_config

PROBLEMS = ["What is 3 + 4?", "Compute 12 * 7."]
PROMPTS = [Prompt("p0", "What is 3 + 4?", "7"), Prompt("p1", "What is 9 - 2?", "7")]

# Stated tolerance of the bf16 sampler's per-token log-probs against the fp32 forward. Measured on
# these tiny models: mean 0.009-0.012, max 0.044-0.065 nats; on SmolLM2-135M / Gemma-3-270M
# (benchmarks/results/vs-references/f56685b-bf16): mean 0.0086 / 0.0099, max 0.43 / 0.23.
MEAN_TOL, MAX_TOL = 0.05, 0.5


def _gaps(policy: Policy, prompts: list[list[int]], samples) -> torch.Tensor:
    flat = [(prompts[i], s) for i, g in enumerate(samples) for s in g]
    fwd = policy.token_logprobs([p for p, _ in flat], [s.token_ids for _, s in flat])
    return torch.cat([(lp.double() - torch.tensor(s.logprobs, dtype=torch.float64)).abs() for lp, (_, s) in zip(fwd, flat)])


@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_bf16_sampler_logprobs_are_within_tolerance_of_the_fp32_forward(which, request):
    policy = request.getfixturevalue(f"tiny_{which}_policy")
    prompts = [policy.codec.encode_prompt(p) for p in PROBLEMS]
    bf16 = make_engine("hf-bf16", policy).generate(prompts, SamplingParams(n=4, max_new_tokens=12, seeds=[1, 2]))
    fp32 = make_engine("hf", policy).generate(prompts, SamplingParams(n=4, max_new_tokens=12, seeds=[1, 2]))
    g16, g32 = _gaps(policy, prompts, bf16), _gaps(policy, prompts, fp32)
    assert g16.numel() > 40
    assert float(g16.mean()) <= MEAN_TOL and float(g16.max()) <= MAX_TOL
    assert float(g16.max()) > 1e-3            # the copy really samples in bf16
    assert float(g32.max()) < 1e-5            # the fp32 sampler equals the forward


def test_same_seeds_give_the_same_bf16_samples(tiny_llama_policy):
    eng = make_engine("hf-bf16", tiny_llama_policy)
    prompts = [tiny_llama_policy.codec.encode_prompt(p) for p in PROBLEMS]
    a = eng.generate(prompts, SamplingParams(n=3, max_new_tokens=10, seeds=[7, 8], batch_size=6))
    b = eng.generate(prompts, SamplingParams(n=3, max_new_tokens=10, seeds=[7, 8], batch_size=2))
    assert [[s.token_ids for s in g] for g in a] == [[s.token_ids for s in g] for g in b]


def test_the_bf16_copy_follows_the_trainer_weights(tiny_llama_dir):
    policy = Policy.load(ModelConfig(name="A", path=tiny_llama_dir, template="plain"))
    eng = make_engine("hf-bf16", policy)
    copy = eng.sampling_model
    assert all(p.dtype == torch.bfloat16 for p in copy.parameters())
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.25)
    assert not all(torch.equal(c, p.to(torch.bfloat16)) for c, p in zip(copy.parameters(), policy.model.parameters()))
    eng.weights_updated()
    pairs = list(zip(copy.parameters(), policy.model.parameters()))
    assert len(pairs) == len(list(policy.model.parameters()))
    assert all(torch.equal(c, p.to(torch.bfloat16)) for c, p in pairs)


@pytest.fixture(scope="module")
def bf16_twins(tiny_llama_dir):
    return (Learner.local(ModelConfig(name="A", path=tiny_llama_dir, template="plain"), engine="hf-bf16"),
            Learner.local(ModelConfig(name="B", path=tiny_llama_dir, template="plain"), engine="hf-bf16"))


@pytest.mark.parametrize("recompute", [True, False])
def test_identical_receiver_scores_unit_compatibility_only_after_the_recompute(bf16_twins, recompute):
    src, recv = bf16_twins
    groups, _ = src.rollout(PROMPTS, RolloutConfig(n=4, max_new_tokens=8, batch_size=8), step=1, seed=5)
    if recompute:
        m = src.recompute_old_logprobs(groups, UpdateConfig(), 1.0)
        assert 0 < m["logprob_gap/mean_abs"] <= MEAN_TOL and m["logprob_gap/max_abs"] <= MAX_TOL
        assert all(g.old_logprobs == g.gen_logprobs for g in groups)
    for g in groups:
        g.rewards, g.advantages = [1.0, 0.0, 0.0, 0.0], [1.5, -0.5, -0.5, -0.5]
    ho = hand_over(groups, recv, ExchangeConfig(delta=0.0), Scoring(temperature=1.0, chunk=4, micro_batch=2), threshold=0.5)
    s = [a["s"] for g, p in zip(groups, ho.groups) for i, a in zip(range(g.size), ho.rows[4 * int(g.prompt_id[1]):])
         if p.token_ids[i] == g.gen_token_ids[i]]          # responses whose text re-encodes to the same ids
    assert len(s) >= 2
    worst = max(abs(v - 1) for v in s)
    if recompute:
        assert worst < 1e-4
    else:
        assert worst > 1e-3


@pytest.mark.parametrize("engine", ["hf", "hf-bf16"])
def test_a_run_with_recomputed_logprobs_reports_the_sampler_gap(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch,
                                                                engine):
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, f"rollout.engine={engine}",
                      "update.recompute_old_logprobs=true", "steps=1")
    run = loop.setup(cfg)
    try:
        row = loop.train_step(run, 1)
    finally:
        run.grader.close()
    assert row["exchange/A->B/transferred"] > 0
    for name in ("A", "B"):
        gap = row[f"{name}/logprob_gap/max_abs"]
        assert (gap < 1e-5) if engine == "hf" else (1e-3 < gap <= MAX_TOL)
