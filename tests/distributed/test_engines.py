"""Rollout engines: per-prompt seeds make sampling independent of sharding; hf-cb on CPU; vLLM gating."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from graft.config import ModelConfig
from graft.policy.engines import (EngineUnavailable, HFEngine, hf_weights, make_engine, prompt_seeds, sample_seed,
                                  vllm_unavailable_reason)
from graft.policy.sampling import SamplingParams


def test_prompt_seeds_depend_only_on_seed_and_global_index():
    full = prompt_seeds(7, 0, 6)
    assert prompt_seeds(7, 2, 3) == full[2:5]
    assert len(set(full)) == 6 and prompt_seeds(8, 0, 6) != full
    assert sample_seed(full[0], 0) != sample_seed(full[0], 1)
    assert all(0 <= s < 2**63 for s in full)


def _ids(policy, k):
    return [policy.codec.encode_prompt(f"What is {i} + {3 * i}?") for i in range(k)]


def test_sharded_generation_with_prompt_seeds_equals_one_call(tiny_llama_policy):
    pol = tiny_llama_policy
    ids = _ids(pol, 4)
    seeds = prompt_seeds(11, 0, 4)
    kw = dict(n=2, max_new_tokens=6, batch_size=4)          # 2 prompts x 2 samples per generation batch
    whole = pol.generate(ids, SamplingParams(seeds=seeds, **kw))
    # the way the Ray backend splits it: whole generation batches, each worker with its global offset
    halves = (pol.generate(ids[:2], SamplingParams(seeds=prompt_seeds(11, 0, 2), **kw))
              + pol.generate(ids[2:], SamplingParams(seeds=prompt_seeds(11, 2, 2), **kw)))
    assert [[s.token_ids for s in g] for g in whole] == [[s.token_ids for s in g] for g in halves]
    assert [[s.logprobs for s in g] for g in whole] == [[s.logprobs for s in g] for g in halves]
    # a sample depends on its own seed only: prompt 3 alone draws the same tokens
    alone = pol.generate(ids[3:], SamplingParams(seeds=seeds[3:], **kw))
    assert [s.token_ids for s in alone[0]] == [s.token_ids for s in whole[3]]
    # the hf engine is Policy.generate
    eng = HFEngine(pol)
    assert [[s.token_ids for s in g] for g in eng.generate(ids, SamplingParams(seeds=seeds, **kw))] == [[s.token_ids for s in g] for g in whole]


def test_vllm_engine_refuses_clearly_without_vllm_or_cuda(tiny_llama_policy):
    reason = vllm_unavailable_reason()
    if reason is None:
        pytest.skip("vLLM and CUDA are available here")
    with pytest.raises(EngineUnavailable, match="rollout.engine=vllm: .*use rollout.engine=hf"):
        make_engine("vllm", tiny_llama_policy)
    with pytest.raises(ValueError, match="unknown rollout engine"):
        make_engine("tgi", tiny_llama_policy)


def test_hf_weights_names_for_vllm():
    named = [("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight", 1),
             ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", 2),
             ("base_model.model.lm_head.weight", 3), ("model.norm.weight", 4)]
    assert list(hf_weights(None, named)) == [("model.layers.0.self_attn.q_proj.weight", 1), ("lm_head.weight", 3),
                                             ("model.norm.weight", 4)]


@pytest.mark.skipif(importlib.util.find_spec("transformers.generation.continuous_batching") is None,
                    reason="no continuous batching in this transformers")
def test_continuous_batching_engine_on_cpu(tiny_llama_dir):
    from graft.policy.policy import Policy

    pol = Policy.load(ModelConfig(name="A", path=tiny_llama_dir, template="plain"))   # CB may switch attention
    eng = make_engine("hf-cb", pol)
    ids = _ids(pol, 3)
    out = eng.generate(ids, SamplingParams(n=2, max_new_tokens=5, seed=3))
    assert len(out) == 3 and all(len(g) == 2 for g in out)
    flat = [s for g in out for s in g]
    for s in flat:
        assert 1 <= len(s.token_ids) <= 5 and len(s.logprobs) == len(s.token_ids)
        assert s.finished == (s.token_ids[-1] in pol.stop_ids)
        assert s.text == pol.decode(s.token_ids)
    # the recorded log-probs are the model's (temperature 1, top-p 1): equal to a forward pass
    lps = pol.token_logprobs([ids[i] for i in range(3) for _ in range(2)], [s.token_ids for s in flat])
    for s, lp in zip(flat, lps):
        torch.testing.assert_close(torch.tensor(s.logprobs), lp, atol=1e-4, rtol=0)


def test_old_vllm_raw_logit_logprobs_are_recomputed_at_the_rollout_temperature(tiny_llama_policy, monkeypatch):
    """issue 10 item 9: a vLLM that can only return raw-logit log-probs (< 0.10.2) would record T = 1
    values for a T = 0.7 rollout; the engine replaces them by the policy's tempered log-probs."""
    import sys
    import types

    from graft.policy.engines import RolloutEngine, VllmEngine

    pol = tiny_llama_policy
    ids = _ids(pol, 2)
    ref = pol.generate(ids, SamplingParams(n=2, max_new_tokens=5, temperature=0.7, seeds=prompt_seeds(3, 0, 2)))
    flat = [(i, s) for i, g in enumerate(ref) for s in g]
    raw = pol.token_logprobs([ids[i] for i, _ in flat], [s.token_ids for _, s in flat], temperature=1.0)

    class Out:
        def __init__(self, s, lp):
            self.outputs = [types.SimpleNamespace(token_ids=s.token_ids, finish_reason="stop" if s.finished else "length",
                                                  logprobs=[{t: float(v)} for t, v in zip(s.token_ids, lp)])]

    class FakeLLM:
        def generate(self, requests, params, use_tqdm=False):
            return [Out(s, lp) for (_, s), lp in zip(flat, raw)]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=lambda **kw: kw))
    eng = VllmEngine.__new__(VllmEngine)
    RolloutEngine.__init__(eng, pol)
    eng.llm, eng.raw_logprobs = FakeLLM(), True
    got = eng.generate(ids, SamplingParams(n=2, max_new_tokens=5, temperature=0.7))
    for g_ref, g_got in zip(ref, got):
        for a, b in zip(g_ref, g_got):
            assert b.token_ids == a.token_ids
            assert torch.allclose(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4)   # tempered, as sampled
    assert max(abs(x - y) for (_, s), r in zip(flat, raw) for x, y in zip(s.logprobs, r.tolist())) > 1e-2   # raw differ
