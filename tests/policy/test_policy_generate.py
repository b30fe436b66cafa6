"""Own sampling loop: shapes, determinism, stopping, top-p, and agreement with forward_logprobs."""
from __future__ import annotations

import math

import pytest
import torch

from graft.policy.sampling import SamplingParams

PROBLEMS = ["What is 2 + 3?", "A much longer problem statement with many more words in it: what is 17 * 3?"]


@pytest.fixture(params=["llama", "gemma"])
def pol(request, tiny_llama_policy, tiny_gemma_policy):
    return tiny_llama_policy if request.param == "llama" else tiny_gemma_policy


def _prompts(pol):
    return [pol.codec.encode_prompt(p) for p in PROBLEMS]


def _ids(out):
    return [[s.token_ids for s in g] for g in out]


def test_shapes_and_determinism(pol):
    prompts = _prompts(pol)
    out = pol.generate(prompts, SamplingParams(n=3, max_new_tokens=6, seed=7, batch_size=4))
    assert len(out) == 2 and all(len(g) == 3 for g in out)
    for g in out:
        for s in g:
            assert len(s.token_ids) == len(s.logprobs) <= 6
            assert all(lp <= 0 and math.isfinite(lp) for lp in s.logprobs)
            assert s.text == pol.decode(s.token_ids)
            assert s.finished == (len(s.token_ids) > 0 and s.token_ids[-1] in pol.stop_ids)
    again = pol.generate(prompts, SamplingParams(n=3, max_new_tokens=6, seed=7, batch_size=4), progress=True, desc="x")
    assert _ids(again) == _ids(out)  # same seed -> same samples, progress bar or not
    assert [[s.logprobs for s in g] for g in again] == [[s.logprobs for s in g] for g in out]
    other = pol.generate(prompts, SamplingParams(n=3, max_new_tokens=6, seed=8, batch_size=4))
    assert _ids(other) != _ids(out)


def test_samples_in_group_differ(pol):
    out = pol.generate(_prompts(pol)[:1], SamplingParams(n=4, max_new_tokens=5, seed=0))
    assert len({tuple(s.token_ids) for s in out[0]}) > 1


def test_finished_at_stop_token(tiny_llama_dir):
    from graft.config import ModelConfig
    from graft.policy.policy import Policy
    pol = Policy.load(ModelConfig(path=tiny_llama_dir, template="plain"))
    V = len(pol.tokenizer)
    pol.stop_ids = set(range(V // 8))  # an eighth of the vocabulary stops: many sequences end early
    out = pol.generate(_prompts(pol), SamplingParams(n=8, max_new_tokens=10, seed=3, batch_size=5))
    samples = [s for g in out for s in g]
    fin = [s for s in samples if s.finished]
    unfin = [s for s in samples if not s.finished]
    assert fin and unfin
    for s in fin:
        assert s.token_ids[-1] in pol.stop_ids and all(t not in pol.stop_ids for t in s.token_ids[:-1])
        assert len(s.logprobs) == len(s.token_ids) and len(s.token_ids) <= 10
    for s in unfin:
        assert len(s.token_ids) == 10 and all(t not in pol.stop_ids for t in s.token_ids)
    # the stop token's log-prob is recorded and agrees with a forward pass
    P = [pol.codec.encode_prompt(PROBLEMS[i]) for i, g in enumerate(out) for _ in g]
    logp, mask = pol.forward_logprobs(P, [s.token_ids for s in samples])
    for b, s in enumerate(samples):
        assert torch.allclose(logp[b, :len(s.token_ids)], torch.tensor(s.logprobs), atol=1e-4)


def test_zero_new_tokens(pol):
    out = pol.generate(_prompts(pol), SamplingParams(n=2, max_new_tokens=0))
    assert all(s.token_ids == [] and not s.finished for g in out for s in g)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.9)])
def test_generate_logprobs_match_forward(pol, temperature, top_p):
    prompts = _prompts(pol)
    out = pol.generate(prompts, SamplingParams(n=3, max_new_tokens=9, temperature=temperature, top_p=top_p, seed=11, batch_size=4))
    P = [prompts[i] for i, g in enumerate(out) for _ in g]
    R = [s.token_ids for g in out for s in g]
    logp, mask = pol.forward_logprobs(P, R, chunk=5, temperature=temperature)
    diff = max((logp[b, :len(r)] - torch.tensor(s.logprobs)).abs().max().item()
               for b, (r, s) in enumerate(zip(R, [s for g in out for s in g])))
    assert diff < 1e-4


def test_top_p_restricts_to_nucleus(tiny_gemma_policy):
    pol = tiny_gemma_policy
    prompts = _prompts(pol)[:1]
    top_p = 0.05
    out = pol.generate(prompts, SamplingParams(n=4, max_new_tokens=4, top_p=top_p, seed=5))
    ren = pol.generate(prompts, SamplingParams(n=4, max_new_tokens=4, top_p=top_p, seed=5), renormalize_top_p=True)
    assert _ids(out) == _ids(ren)  # the option changes only the recorded numbers
    for s, r in zip(out[0], ren[0]):
        # renormalised log-prob = raw log-prob - log(nucleus mass) >= raw
        assert all(b >= a - 1e-6 for a, b in zip(s.logprobs, r.logprobs))
        assert all(b <= 1e-6 for b in r.logprobs)
    # every sampled token lies in the top-p nucleus of its step's distribution
    P = [prompts[0]] * 4
    for s in out[0]:
        for t in range(len(s.token_ids)):
            ids = torch.tensor([P[0] + s.token_ids[:t]])
            h = pol._decoder(input_ids=ids).last_hidden_state[0, -1]
            probs = torch.softmax(pol._logits(h, 1.0), -1)
            sp, si = probs.sort(descending=True)
            nucleus = si[: int(((sp.cumsum(0) - sp) < top_p).sum())].tolist()
            assert s.token_ids[t] in nucleus


def test_batch_size_and_padding(pol):
    """Different batch sizes draw different random numbers, but every sample stays exact."""
    prompts = _prompts(pol)
    for bs in (1, 6):
        out = pol.generate(prompts, SamplingParams(n=3, max_new_tokens=5, seed=2, batch_size=bs))
        P = [prompts[i] for i, g in enumerate(out) for _ in g]
        R = [s.token_ids for g in out for s in g]
        logp, _ = pol.forward_logprobs(P, R)
        for b, s in enumerate(s for g in out for s in g):
            assert torch.allclose(logp[b, :len(s.token_ids)], torch.tensor(s.logprobs), atol=1e-4)
    with pytest.raises(ValueError):
        pol.generate([[]], SamplingParams(n=2, max_new_tokens=3))
    with pytest.raises(ValueError):
        pol.generate(prompts, SamplingParams(n=2, max_new_tokens=3, temperature=0.0))


def test_stop_strings_end_rows_early_with_the_same_cut_samples(pol):
    """Rows leave the batch once their text holds a stop string; after cut_at_stop the samples
    equal those of a run without early stopping (per-sample seeds: other rows do not matter;
    log-probs to float precision, as a smaller batch computes them with other matmul shapes)."""
    from graft.policy.prompts import cut_at_stop

    prompts, stops = _prompts(pol), ["e", "a"]   # letters a random model writes within a few tokens
    kw = dict(n=4, max_new_tokens=16, temperature=1.0, batch_size=8, seeds=[11, 12])
    full = pol.generate(prompts, SamplingParams(stop_strings=(), **kw))
    early = pol.generate(prompts, SamplingParams(stop_strings=stops, **kw))
    shortened = 0
    for g_full, g_early in zip(full, early):
        for a, b in zip(g_full, g_early):
            assert b.token_ids == a.token_ids[:len(b.token_ids)]
            assert b.logprobs == pytest.approx(a.logprobs[:len(b.logprobs)], abs=1e-4)
            ca, cb = cut_at_stop(a, pol.decode, stops), cut_at_stop(b, pol.decode, stops)
            assert (cb.token_ids, cb.text, cb.finished) == (ca.token_ids, ca.text, ca.finished)
            shortened += len(b.token_ids) < len(a.token_ids)
    assert shortened >= 2
