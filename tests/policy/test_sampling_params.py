"""SamplingParams: one frozen value that every sampler takes (each registered engine, a Learner over its ranks), and
the one place it is read off the config."""
from __future__ import annotations

import dataclasses
import pickle
import sys
import types

import pytest

from graft.config import EvalConfig, ModelConfig, RolloutConfig
from graft.policy.engines import RolloutEngine, VllmEngine, continuous_batching_unavailable_reason, make_engine
from graft.policy.policy import Policy
from graft.policy.sampling import SamplingParams, eval_sampling, rollout_sampling
from graft.registry import ENGINES
from graft.seeds import sample_seed


def test_sampling_params_are_frozen_and_keep_sequences_as_tuples():
    p = SamplingParams(n=2, max_new_tokens=5, seeds=[3, 4], stop_strings=["\n\n"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.n = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.seeds = (5, 6)  # type: ignore[misc]
    assert p.seeds == (3, 4) and p.stop_strings == ("\n\n",)
    assert hash(p) == hash(SamplingParams(n=2, max_new_tokens=5, seeds=(3, 4), stop_strings=("\n\n",)))
    assert pickle.loads(pickle.dumps(p)) == p   # what a Ray rank receives
    assert dataclasses.replace(p, seeds=range(2)).seeds == (0, 1)


@pytest.mark.parametrize("field,value", [("n", 0), ("max_new_tokens", -1), ("temperature", 0.0), ("top_p", 0.0),
                                         ("top_p", 1.5), ("batch_size", 0)])
def test_a_value_out_of_range_is_refused_naming_its_field(field, value):
    with pytest.raises(ValueError, match=f"sampling {field}: must be"):
        SamplingParams(**{"n": 2, "max_new_tokens": 4, field: value})


def test_the_config_sections_give_the_settings():
    rc = RolloutConfig(n=4, max_new_tokens=7, temperature=0.9, top_p=0.8, batch_size=16)
    assert rollout_sampling(rc, seeds=[1, 2], entropy=True) == SamplingParams(
        n=4, max_new_tokens=7, temperature=0.9, top_p=0.8, batch_size=16, seeds=(1, 2), entropy=True)
    ec = EvalConfig(n=3, temperature=0.6, top_p=0.95)
    assert eval_sampling(ec, 7, seed=5, batch_size=8) == SamplingParams(
        n=3, max_new_tokens=7, temperature=0.6, top_p=0.95, batch_size=8, seed=5)
    # eval.max_new_tokens, when set, wins over the fallback (the rollout's limit)
    assert eval_sampling(dataclasses.replace(ec, max_new_tokens=11), 7).max_new_tokens == 11


class _FakeLLM:
    """vLLM's ``LLM.generate`` for one request per sample: token ids [prompt's first token, sample index]."""

    def __init__(self):
        self.params = []

    def generate(self, requests, params, use_tqdm=False):
        self.params += params
        seen: dict = {}
        outs = []
        for req in requests:
            first = req["prompt_token_ids"][0]
            j = seen[first] = seen.get(first, -1) + 1
            outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(
                token_ids=[first, j], logprobs=[{first: -1.0}, {j: -2.0}], finish_reason="length")]))
        return outs


def _engine(name: str, pol: Policy, monkeypatch) -> RolloutEngine:
    if name == "vllm":   # no GPU here: the engine over a fake vllm module, as its other tests do
        monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=lambda **kw: kw))
        eng = VllmEngine.__new__(VllmEngine)
        RolloutEngine.__init__(eng, pol)
        eng.llm, eng.raw_logprobs = _FakeLLM(), False
        return eng
    if name == "hf-cb" and continuous_batching_unavailable_reason(pol.model):
        pytest.skip(f"hf-cb: {continuous_batching_unavailable_reason(pol.model)}")
    return make_engine(name, pol)


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_engine_samples_with_one_sampling_params(name, tiny_llama_dir, monkeypatch):
    pol = Policy.load(ModelConfig(name="A", path=tiny_llama_dir, template="plain"))   # hf-cb may switch attention
    ids = [pol.codec.encode_prompt("What is 2 + 3?"), pol.codec.encode_prompt("What is 7 * 6?")]
    params = SamplingParams(n=2, max_new_tokens=5, temperature=0.7, top_p=0.9, batch_size=4, seeds=(3, 4))
    out = _engine(name, pol, monkeypatch).generate(ids, params)
    assert len(out) == 2 and all(len(g) == 2 for g in out)                     # [P][G]
    for s in (s for g in out for s in g):
        assert 1 <= len(s.token_ids) <= 5 and len(s.logprobs) == len(s.token_ids)


def test_vllm_receives_every_setting_of_the_sampling_params(tiny_llama_policy, monkeypatch):
    pol = tiny_llama_policy
    eng = _engine("vllm", pol, monkeypatch)
    ids = [pol.codec.encode_prompt("What is 2 + 3?"), pol.codec.encode_prompt("What is 7 * 6?")]
    eng.generate(ids, SamplingParams(n=2, max_new_tokens=5, temperature=0.7, top_p=0.9, seeds=(3, 4)))
    sent = eng.llm.params
    assert [(p["n"], p["temperature"], p["top_p"], p["max_tokens"]) for p in sent] == [(1, 0.7, 0.9, 5)] * 4
    assert [p["seed"] for p in sent] == [sample_seed(s, j) % 2**31 for s in (3, 4) for j in range(2)]


def test_a_learner_samples_what_its_engine_samples_with_the_same_params(tiny_llama_dir):
    from graft.trainer.learner import Learner

    cfg = ModelConfig(name="A", path=tiny_llama_dir, template="plain")
    learner = Learner.local(cfg)
    ids = [learner.codec.encode_prompt(f"What is {i} + 1?") for i in range(3)]
    params = SamplingParams(n=2, max_new_tokens=6, batch_size=4, seeds=(7, 8, 9))
    got = learner.generate(ids, params)
    want = make_engine("hf", Policy.load(cfg)).generate(ids, params)
    assert [[s.token_ids for s in g] for g in got] == [[s.token_ids for s in g] for g in want]
