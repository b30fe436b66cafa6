"""The policy split by job: its sampler and scorer read the policy they belong to, and hold it weakly, so dropping
a policy frees its model at once (no reference cycle left for the garbage collector)."""
from __future__ import annotations

import gc
import weakref

from graft.config import ModelConfig
from graft.policy.decoding import DecodeLoop
from graft.policy.policy import Policy
from graft.policy.scoring import Scorer


def test_the_jobs_belong_to_their_policy(tiny_llama_dir):
    pol = Policy.load(ModelConfig(name="A", path=tiny_llama_dir, template="plain"))
    assert isinstance(pol.sampler, DecodeLoop) and isinstance(pol.scorer, Scorer)
    pol.stop_ids = {1, 2}   # what the policy holds, the jobs read (the same object, not a copy made at load)
    assert pol.sampler.lm.stop_ids is pol.stop_ids and pol.scorer.lm.model is pol.model


def test_dropping_a_policy_frees_its_model_without_the_garbage_collector(tiny_llama_dir):
    pol = Policy.load(ModelConfig(name="A", path=tiny_llama_dir, template="plain"))
    model = weakref.ref(pol.model)
    gc.disable()
    try:
        del pol
        assert model() is None
    finally:
        gc.enable()
