"""The real embedded GGUF pair (slow: the first run converts and caches both models)."""
from __future__ import annotations

import pytest
import torch

from graft.config import ModelConfig
from graft.policy.loading import ModelLoadError
from graft.policy.policy import Policy
from graft.policy.sampling import SamplingParams


@pytest.mark.slow
@pytest.mark.parametrize("path,template", [("embedded:smollm2-135m-instruct", "chat"), ("embedded:gemma3-270m", "fewshot")])
def test_embedded_model_samples(path, template):
    try:
        pol = Policy.load(ModelConfig(name="M", path=path, template=template))
    except ModelLoadError as e:
        if "wheel" in str(e):
            pytest.skip(str(e))
        raise
    prompt = pol.codec.encode_prompt("What is 3 + 4?")
    out = pol.generate([prompt], SamplingParams(n=2, max_new_tokens=12, seed=0))
    assert len(out[0]) == 2
    for s in out[0]:
        assert 0 < len(s.token_ids) <= 12 and len(s.logprobs) == len(s.token_ids)
    with torch.no_grad():
        logp, _ = pol.forward_logprobs([prompt] * 2, [s.token_ids for s in out[0]])
    for b, s in enumerate(out[0]):
        assert torch.allclose(logp[b, :len(s.token_ids)], torch.tensor(s.logprobs), atol=1e-3)
    # a real model is far from uniform on its own samples
    assert sum(sum(s.logprobs) for s in out[0]) / sum(len(s.token_ids) for s in out[0]) > -6.0
